"""kvtier's copy faults (the testing library's kvt_xfer_set_faults) from
Python: a Transfer's copies made to fail or wait, for the tests of what a
failed or slow copy does to the engines' workers."""
from __future__ import annotations

import ctypes

import pytest

import kvtier


class Faults(ctypes.Structure):  # kvt_xfer_faults_t (kvtier/testing.h)
    _fields_ = [("size", ctypes.c_uint32), ("fail_nth", ctypes.c_uint64), ("delay_nth", ctypes.c_uint64),
                ("delay_ns", ctypes.c_uint64), ("fail_p", ctypes.c_double), ("delay_p", ctypes.c_double),
                ("delay_max_ns", ctypes.c_uint64), ("seed", ctypes.c_uint64)]

    def __init__(self, **kw):
        super().__init__(size=ctypes.sizeof(Faults), **kw)


def set_faults(xfer, **kw) -> None:
    """Sets the faults of a kvtier.xfer.Transfer (no keywords: none); skips
    the test where the library is not the testing one."""
    lib = ctypes.CDLL(kvtier.LIBRARY)
    if not hasattr(lib, "kvt_xfer_set_faults"):
        pytest.skip("the copy faults are in the testing library (KVTIER_LIB=BUILD/libkvtier-testing.so)")
    lib.kvt_xfer_set_faults.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    assert lib.kvt_xfer_set_faults(xfer._ptr, ctypes.byref(Faults(**kw)) if kw else None) == 0
