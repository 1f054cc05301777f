"""The README's commands, run the way a user types them: from the
repository root, through bash, after the two set-up commands (`make test` has
run them), with an interpreter first on PATH that is not the project's (a
python3 with no site packages at all) and with none of the suite's own
variables (PYTHONPATH, KVTIER_LIB). Every `build/kvtier ...` and
`.venv/bin/python ...` command the README shows must exit 0."""
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# what those commands leave behind, removed before and after
LEFT = [ROOT / "hit.png", pathlib.Path("/tmp/kvtier-shared")]


def readme_commands():
    text = README.read_text()
    spans = re.findall(r"`([^`\n]+)`", text)
    return [s for s in spans if s.startswith(("build/kvtier ", ".venv/bin/python ", "python3 ", "python "))]


def test_readme_lists_the_commands_this_test_runs():
    cmds = readme_commands()
    assert len(cmds) >= 8, cmds
    assert any("tiny_engine.py" in c for c in cmds) and any("kvtier.trace" in c for c in cmds)


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    if os.environ.get("KVTIER_SANITIZED"):
        pytest.skip("the README's commands run the plain build/; the sanitized suite covers the library")
    if not (ROOT / "build" / "kvtier").exists() or not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("build/ or .venv is missing: `make test` makes both")
    shim = tmp_path_factory.mktemp("path")
    host = shutil.which("python3", path="/usr/bin:/usr/local/bin") or "/usr/bin/python3"
    (shim / "python3").write_text(f"#!/bin/sh\nexec {host} -I -S \"$@\"\n")
    (shim / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVTIER_LIB", "VIRTUAL_ENV")}
    env["PATH"] = f"{shim}:{env.get('PATH', '/usr/bin:/bin')}"
    # the stand-in really is a python3 without the project's packages
    r = subprocess.run(["bash", "-c", "python3 -c 'import numpy'"], env=env, capture_output=True)
    assert r.returncode != 0
    return env


def _clean():
    for p in LEFT:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


@pytest.mark.parametrize("cmd", readme_commands())
def test_readme_command_runs_as_written(cmd, user_env):
    _clean()
    try:
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=user_env, capture_output=True, text=True, timeout=300)
    finally:
        _clean()
    assert r.returncode == 0, f"{cmd}\nexit {r.returncode}\n{r.stderr[-2000:]}"
