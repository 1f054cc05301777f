"""The package as a user installs it: `pip install ./python` builds libkvtier
with CMake through scikit-build-core and ships it in the wheel, so that
`import kvtier, kvtier.sglang` works in a fresh virtual environment with no
other step.

The wheel is built once (pip's own isolated build: scikit-build-core, ninja
and their requirements come from the package index at the versions
python/pyproject.toml pins), installed with --no-deps into a venv made by
`python -m venv`, and imported from a folder outside the checkout with no
KVTIER_LIB and no PYTHONPATH. What must hold: the version is the C header's
(parsed here, not asked of the package), the library the process mapped is
the wheel's copy inside the venv, and nothing points back at the checkout."""
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib.metadata, json, os, sys
import kvtier, kvtier.sglang, kvtier.keyed
print(kvtier.__version__)
maps = [l.split(None, 5)[5] for l in open("/proc/self/maps") if l.count(" ") >= 5 and "libkvtier" in l]
import ctypes
hooks = [n for n in ("kvt_xfer_set_faults", "kvt_store_set_delay", "kvt_pd_receiver_test_peers", "kvt_pattern_fill")
         if hasattr(ctypes.CDLL(kvtier.LIBRARY), n)]
print(json.dumps({"version": kvtier.__version__, "dist": importlib.metadata.version("kvtier"), "hooks": hooks,
                  "library": kvtier.LIBRARY, "file": kvtier.__file__, "maps": sorted(set(m.strip() for m in maps)),
                  "sys_path": sys.path, "build_info": kvtier.build_info(), "calls": kvtier.keyed.CALLS,
                  "calls_file": getattr(kvtier.keyed._calls, "__file__", None)}))
"""


def header_version() -> str:
    text = (ROOT / "include" / "kvtier" / "version.h").read_text()
    parts = [re.search(rf"^#define KVT_VERSION_{p} (\d+)$", text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
    assert all(parts), "include/kvtier/version.h: no KVT_VERSION_MAJOR/MINOR/PATCH"
    return ".".join(m.group(1) for m in parts)


def user_env(**extra: str) -> dict:
    """The environment of a user's shell: none of the suite's variables."""
    drop = ("PYTHONPATH", "PYTHONHOME", "KVTIER_LIB", "VIRTUAL_ENV", "LD_PRELOAD", "LD_LIBRARY_PATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\nexit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv, seconds to build the wheel): built, installed, not yet imported."""
    if os.environ.get("KVTIER_SANITIZED"):
        pytest.skip("the wheel builds its own plain library; the plain suite builds and checks it")
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    start = time.monotonic()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", dist,
         ROOT / "python"], cwd=tmp, env=user_env(), timeout=600)
    built = time.monotonic() - start
    wheels = list(dist.glob("kvtier-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp, env=user_env(), timeout=300)
    run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", wheels[0]],
        cwd=tmp, env=user_env(), timeout=300)
    print(f"wheel {wheels[0].name} built in {built:.1f} s")
    return wheels[0], venv, built


def probe(venv: pathlib.Path, cwd: pathlib.Path, **extra: str) -> dict:
    r = run([venv / "bin" / "python", "-c", PROBE], cwd=cwd, env=user_env(**extra), timeout=120)
    first, rest = r.stdout.split("\n", 1)
    got = json.loads(rest)
    assert first == got["version"]
    return got


def test_the_wheel_holds_the_library_and_no_build_path(installed):
    wheel, _venv, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvtier/lib/libkvtier.so" in names and "kvtier/py.typed" in names
    assert not [n for n in names if "testing" in n], names  # the testing library stays in the checkout
    assert "kvtier/__init__.py" in names and "kvtier/sglang.py" in names
    assert not [n for n in names if n.endswith("_build.py") or n.endswith(".pth") or "__pycache__" in n], names
    # the extension the wheel's CMake built for this Python, and no other (a checkout's own stays out)
    assert [n for n in names if "_keyed_calls" in n] == [f"kvtier/_keyed_calls{sysconfig.get_config_var('EXT_SUFFIX')}"]
    assert wheel.name.startswith(f"kvtier-{header_version()}-")


def test_import_in_a_fresh_venv_uses_the_bundled_library(installed, tmp_path):
    _wheel, venv, _ = installed
    got = probe(venv, tmp_path)
    want = header_version()
    assert got["version"] == want and got["dist"] == want and got["build_info"].startswith(want)
    assert got["hooks"] == [], "the wheel's library carries no test hooks"
    venv_real = venv.resolve()
    lib = pathlib.Path(got["library"]).resolve()
    assert venv_real in lib.parents and lib.name == "libkvtier.so", got["library"]
    assert venv_real in pathlib.Path(got["file"]).resolve().parents, got["file"]
    assert got["calls"] == "extension" and venv_real in pathlib.Path(got["calls_file"]).resolve().parents, got
    # what the process really mapped: one libkvtier, the venv's
    assert [str(pathlib.Path(m).resolve()) for m in got["maps"]] == [str(lib)], got["maps"]
    assert not [p for p in got["sys_path"] if p and str(ROOT) in str(pathlib.Path(p).resolve())], got["sys_path"]
    site = [p for p in got["sys_path"] if p.endswith("site-packages")]
    assert site and (pathlib.Path(site[0]) / "kvtier" / "py.typed").is_file()
    for pth in pathlib.Path(site[0]).glob("*.pth"):
        assert str(ROOT) not in pth.read_text(), pth


def test_a_wheel_ignores_kvtier_lib(installed, tmp_path):
    """A wheel's Python mirrors the structures of the library built with it:
    KVTIER_LIB (the checkout's way to pick a build) does not replace it."""
    _wheel, venv, _ = installed
    other = tmp_path / "libkvtier.so"
    other.write_bytes(b"not a library")
    got = probe(venv, tmp_path, KVTIER_LIB=str(other))
    assert venv.resolve() in pathlib.Path(got["library"]).resolve().parents


def test_exceptions_and_exports_are_static():
    """What a type checker sees: every name kvtier exports is bound by a
    statement of kvtier/__init__.py, and every exception class is a class
    statement (none made by type() or written into globals())."""
    pkg = ROOT / "python" / "kvtier"
    init = ast.parse((pkg / "__init__.py").read_text())
    bound = set()
    for node in init.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    exported = ast.literal_eval(next(n.value for n in init.body if isinstance(n, ast.Assign)
                                     and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)))
    assert sorted(set(exported) - bound) == []
    core = ast.parse((pkg / "_core.py").read_text())
    classes = {n.name for n in core.body if isinstance(n, ast.ClassDef)}
    src = (pkg / "_core.py").read_text() + (pkg / "__init__.py").read_text()
    assert "globals()[" not in src and not re.search(r"\btype\(\s*[^)]*,", src)
    import kvtier
    from kvtier import _core
    for cls in _core.ERROR_TYPES + (kvtier.Error, kvtier.ClosedError):
        assert cls.__name__ in classes and cls.__name__ in exported and getattr(kvtier, cls.__name__) is cls
