"""Argument checks every wrapper shares.

ctypes converts silently: a Python int becomes a C integer by truncation
(-1 is 4294967295 in a uint32_t field, 2**70 is 0), a str becomes a C string
up to its first NUL ("dir:/x\\0/etc" is "dir:/x"), and a float or None in an
integer slot fails deep inside with a message about ctypes. So every value
bound for C goes through one of these first: a wrong type raises TypeError,
a value out of range or a NUL raises ValueError, an index out of range
IndexError; each message names the argument and what it allows. A bool is
accepted where an integer is (it is one)."""
from __future__ import annotations

import math
import operator
from typing import Any, Optional, Sequence, Tuple

U16_MAX, U32_MAX, U64_MAX = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
_NAMED = {U16_MAX: "2**16-1", U32_MAX: "2**32-1", U64_MAX: "2**64-1", I32_MAX: "2**31-1", I32_MIN: "-2**31"}


def _bound(v: int) -> str:
    return _NAMED.get(v, str(v))


def integer(v: Any, what: str, lo: int, hi: int) -> int:
    """v as an int in lo..hi (a bool, a numpy integer and anything with
    __index__ are integers; a float is not)."""
    if type(v) is int and lo <= v <= hi:  # the common case, without a call
        return v
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{what}: expected an integer, not {type(v).__name__} {v!r}") from None
    if not lo <= i <= hi:
        raise ValueError(f"{what}: {i} is out of range (expected {_bound(lo)}..{_bound(hi)})")
    return i


def u16(v: Any, what: str, lo: int = 0) -> int:
    return integer(v, what, lo, U16_MAX)


def u32(v: Any, what: str, lo: int = 0) -> int:
    return integer(v, what, lo, U32_MAX)


def u64(v: Any, what: str, lo: int = 0) -> int:
    return integer(v, what, lo, U64_MAX)


def i32(v: Any, what: str) -> int:
    return integer(v, what, I32_MIN, I32_MAX)


def index(v: Any, what: str, n: int, of: str = "") -> int:
    """v as an index into n things: IndexError when it is not below n."""
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{what}: expected an integer, not {type(v).__name__} {v!r}") from None
    if not 0 <= i < n:
        raise IndexError(f"{what} {i} is out of range ({of or 'there are'} {n})")
    return i


def number(v: Any, what: str, lo: float = 0.0, hi: float = math.inf) -> float:
    """v as a finite float in lo..hi (an int is a number)."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
        raise TypeError(f"{what}: expected a number, not {type(v).__name__} {v!r}")
    try:
        f = float(v)
    except OverflowError:  # an int beyond any float: out of every range here
        raise ValueError(f"{what}: {v!r} is out of range (expected {lo:g}..{hi:g})") from None
    if math.isnan(f) or not lo <= f <= hi:
        raise ValueError(f"{what}: {v!r} is out of range (expected {lo:g}..{hi:g})")
    return f


def is_bool(v: Any) -> bool:
    """True or False, Python's or numpy's (numpy.bool_, named numpy.bool from numpy 2)."""
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool"))


def flag(v: Any, what: str) -> bool:
    """A bool (True, False, 1 or 0; numpy's bool too)."""
    if is_bool(v):
        return bool(v)
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise TypeError(f"{what}: expected True or False, not {type(v).__name__} {v!r}")


def text(v: Any, what: str, optional: bool = False, max_bytes: Optional[int] = None) -> Optional[bytes]:
    """A str for a C string, UTF-8 encoded: None only when optional; no NUL;
    at most max_bytes encoded."""
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise TypeError(f"{what}: expected a str{' or None' if optional else ''}, not {type(v).__name__} {v!r}")
    if "\0" in v:
        raise ValueError(f"{what}: {v!r} holds a NUL character (C would cut it there)")
    b = v.encode()
    if max_bytes is not None and len(b) > max_bytes:
        raise ValueError(f"{what}: {len(b)} bytes of UTF-8 (at most {max_bytes})")
    return b


def instance(v: Any, cls: type, what: str, optional: bool = False) -> Any:
    """v when it is a cls (or None when optional); TypeError naming what is wanted."""
    if (v is None and optional) or isinstance(v, cls):
        return v
    want = f"a kvtier.{cls.__name__}" + (" or None" if optional else "")
    raise TypeError(f"{what}: expected {want}, not {type(v).__name__}")


def sequence(v: Any, what: str) -> Sequence[Any]:
    """A list or tuple (not a str, bytes or a one-shot iterator)."""
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{what}: expected a list or tuple, not {type(v).__name__}")
    return v


def u32_pair(v: Any, what: str) -> Tuple[int, int]:
    """(rank, size): two uint32, size >= 1."""
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise TypeError(f"{what}: expected (rank, size), not {v!r}")
    return u32(v[0], f"{what} rank"), u32(v[1], f"{what} size", 1)


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def option_flag(v: Any) -> Optional[bool]:
    """An engine's boolean option as JSON configurations and command lines
    write one (a bool, 1 or 0, or true/false, 1/0, yes/no, on/off in any
    case); None for anything else, which the caller refuses in its words."""
    if is_bool(v) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    return None


def option_count(x: dict, name: str, default: int, lo: int, hi: Optional[int], who: str) -> int:
    """An engine's option x[name] (default when absent) as a whole number in
    lo..hi (hi None: no bound), as JSON configurations write one: an int, a
    float with no fraction (6.4e10) or a string of digits; a bool, a
    fraction or another type raises ValueError naming who's option."""
    v = x.get(name, default)
    n = None
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    elif isinstance(v, str) and v.isascii() and v.isdigit():
        n = int(v)
    if n is None:
        raise ValueError(f"{who}: {name}: expected a whole number, not {v!r}")
    if n < lo or (hi is not None and n > hi):
        raise ValueError(f"{who}: {name}: {n} (expected {lo}..{hi})" if hi is not None else
                         f"{who}: {name}: {n} (expected >= {lo})")
    return n
