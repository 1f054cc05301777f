"""The binding's structures against the C compiler's: every size and every
field offset (the library accepts smaller, older structures by their size
field, so a drift would not fail loudly anywhere else)."""
import ctypes
import pathlib
import shutil
import subprocess
import sys

import pytest

from kvtier import _lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <signal.h>", '#include "kvtier/kvtier.h"',
             "int main(void) {"]
    for cls, ctype in _lib.STRUCTS.items():
        lines.append(f'    printf("{cls.__name__} size %zu\\n", sizeof({ctype}));')
        for name, _t in cls._fields_:
            lines.append(f'    printf("{cls.__name__} {name} %zu\\n", offsetof({ctype}, {name}));')
    lines.append("    return 0;\n}")
    return "\n".join(lines)


def python_layout():
    out = []
    for cls in _lib.STRUCTS:
        out.append(f"{cls.__name__} size {ctypes.sizeof(cls)}")
        for name, _t in cls._fields_:
            out.append(f"{cls.__name__} {name} {getattr(cls, name).offset}")
    return out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_structures_match_the_headers(tmp_path):
    src = tmp_path / "layout.c"
    src.write_text(c_program())
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-I", str(ROOT / "include"), str(src), "-o", str(exe)], check=True)
    c_side = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")[:-1]
    py_side = python_layout()
    assert len(c_side) == len(py_side)
    diff = [f"C: {c} / Python: {p}" for c, p in zip(c_side, py_side) if c != p]
    assert diff == []


def test_fields_generated_from_the_headers():
    rc = subprocess.run([sys.executable, str(ROOT / "python" / "gen_fields.py"), "--check"]).returncode
    assert rc == 0
