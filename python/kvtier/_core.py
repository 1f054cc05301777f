"""What every wrapper shares: errors, handles that close deterministically,
and the conversions from Python values to C arguments."""
from __future__ import annotations

import array
import ctypes
import weakref
from typing import Any, Iterable, Optional, Sequence, Tuple

from . import _fields
from ._lib import Hash128, lib

# ---- errors ------------------------------------------------------------------


class Error(Exception):
    """A kvtier call failed. ``code`` is the C error (negative), ``name`` its
    symbolic name ("KVT_EINVAL") and ``message`` kvtier's text for it."""

    code: int = 0
    name: str = "KVT_UNKNOWN"

    def __init__(self, what: str, code: Optional[int] = None, detail: str = ""):
        if code is not None:
            self.code = code
            self.name = lib.kvt_err_name(code).decode()
        self.message = lib.kvt_strerror(self.code).decode()
        self.what = what
        self.detail = detail
        text = f"{what}: {self.name}: {self.message}"
        super().__init__(text + (f" ({detail})" if detail else ""))


Error.__module__ = "kvtier"


class ClosedError(Error, ValueError):
    """The object was closed (or its owner was): nothing can be done with it."""

    def __init__(self, what: str):
        self.code, self.name, self.message, self.what, self.detail = 0, "closed", "closed", what, ""
        Exception.__init__(self, f"{what} is closed")


ClosedError.__module__ = "kvtier"


# One subclass per C error, also a subclass of the matching builtin where
# there is one, so `except ValueError` works for KVT_EINVAL.
_BUILTIN = {"EINVAL": ValueError, "ENOMEM": MemoryError, "ERANGE": IndexError, "ENOENT": LookupError,
            "EIO": OSError, "ETIMEDOUT": TimeoutError, "ENOTSUP": NotImplementedError, "EPARSE": ValueError}
ERROR_CLASSES = {"EINVAL": "InvalidArgument", "ENOMEM": "OutOfMemory", "ENOSPC": "NoSpace", "EFRAG": "Fragmented",
                 "ERANGE": "OutOfRange", "ENOTRESV": "NotReserved", "EBUSY": "Busy", "ENOENT": "NotFound",
                 "EEXIST": "AlreadyExists", "EIO": "IOFailure", "ECORRUPT": "Corrupt", "EPARSE": "ParseError",
                 "ENOTSUP": "NotSupported", "ETIMEDOUT": "TimedOut", "EAGAIN": "TryAgain",
                 "ERESERVED": "AlreadyReserved"}
_BY_CODE = {}
for _n, _v in _fields.ERRORS:
    if _v == 0:
        continue
    _bases = (Error, _BUILTIN[_n]) if _n in _BUILTIN else (Error,)
    _cls = type(ERROR_CLASSES.get(_n, "Error" + _n), _bases,
                {"code": _v, "name": f"KVT_{_n}", "__doc__": f"KVT_{_n}: {lib.kvt_strerror(_v).decode()}"})
    _cls.__module__ = "kvtier"
    _BY_CODE[_v] = _cls
    globals()[_cls.__name__] = _cls
del _n, _v, _bases, _cls


def error(code: int, what: str, detail: str = "") -> Error:
    cls = _BY_CODE.get(code, Error)
    return cls(what, code, detail)


def check(rc: int, what: str, detail: str = "") -> int:
    """rc if >= 0; else raises the Error for it."""
    if rc < 0:
        raise error(rc, what, detail)
    return rc


def error_class(name: str):
    """The exception class of a C error name ("KVT_EINVAL" or "EINVAL")."""
    name = name[4:] if name.startswith("KVT_") else name
    for code, cls in _BY_CODE.items():
        if cls.name == f"KVT_{name}":
            return cls
    raise KeyError(name)


# ---- handles -----------------------------------------------------------------


class Handle:
    """A Python object owning one C object. ``close()`` frees it (also on
    leaving a ``with`` block, and as a last resort when collected); every
    call after that raises ClosedError. Objects that others use (a tier
    under a transfer engine, a store under a cache) refuse to close while a
    user is open: close the users first (nested ``with`` blocks do)."""

    _h: Optional[int] = None

    def __init__(self) -> None:
        self._h = None
        self._deps: list = []  # objects this one uses: kept alive while it is open
        self._users: "weakref.WeakSet[Handle]" = weakref.WeakSet()

    def _own(self, h: int, deps: Iterable["Handle"] = ()) -> None:
        self._h = h
        for d in deps:
            d._ptr  # raises if closed
            d._users.add(self)
            self._deps.append(d)

    @property
    def _ptr(self) -> int:
        if self._h is None:
            raise ClosedError(type(self).__name__)
        return self._h

    @property
    def closed(self) -> bool:
        return self._h is None

    def _destroy(self, h: int) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def close(self) -> None:
        """Frees the C object (idempotent)."""
        if self._h is None:
            return
        users = [u for u in self._users if not u.closed]
        if users:
            raise error(-7, f"{type(self).__name__}.close",
                        "still used by " + ", ".join(type(u).__name__ for u in users) + ": close it first")
        h, self._h = self._h, None
        self._destroy(h)
        for d in self._deps:
            d._users.discard(self)
        self._deps = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if self._h is not None:
            try:
                for u in list(self._users):  # collected together: users go first
                    u.close()
                self.close()
            except Exception:
                pass


# ---- conversions -------------------------------------------------------------


def c_str(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()


def tokens_arg(tokens: Any) -> Tuple[int, int, Any]:
    """(address, count, keepalive) of int32 token ids: a numpy or torch int32
    array (contiguous, on the CPU; not copied), an array('i'), or any sequence
    of ints (copied once)."""
    if hasattr(tokens, "__array_interface__"):
        ai = tokens.__array_interface__
        if ai["typestr"] not in ("<i4", "=i4", "|i4"):
            raise TypeError(f"tokens: dtype {ai['typestr']}, expected int32")
        if len(ai["shape"]) != 1:
            raise ValueError(f"tokens: shape {ai['shape']}, expected one dimension")
        if ai.get("strides") not in (None, (4,)):
            raise ValueError("tokens: not contiguous")
        return ai["data"][0], ai["shape"][0], tokens
    if type(tokens).__module__.startswith("torch"):
        import torch
        if tokens.dtype != torch.int32:
            raise TypeError(f"tokens: dtype {tokens.dtype}, expected torch.int32")
        if tokens.dim() != 1 or not tokens.is_contiguous() or tokens.device.type != "cpu":
            raise ValueError("tokens: expected a contiguous one-dimensional CPU tensor")
        return tokens.data_ptr(), tokens.numel(), tokens
    if isinstance(tokens, array.array) and tokens.typecode == "i" and tokens.itemsize == 4:
        a = tokens
    else:
        try:
            a = array.array("i", tokens)
        except (TypeError, OverflowError) as e:
            raise TypeError(f"tokens: expected int32 token ids ({e})") from None
    if len(a) == 0:
        return 0, 0, a
    addr, n = a.buffer_info()
    return addr, n, a


def hash_arg(h: Any) -> Hash128:
    """A page hash: a Hash128, a (lo, hi) pair or 16 bytes (lo then hi, little-endian)."""
    if isinstance(h, Hash128):
        return h
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if len(b) != 16:
            raise ValueError(f"page hash: {len(b)} bytes, expected 16")
        return Hash128(int.from_bytes(b[:8], "little"), int.from_bytes(b[8:], "little"))
    try:
        lo, hi = h
        return Hash128(lo, hi)
    except (TypeError, ValueError):
        raise TypeError(f"page hash: expected (lo, hi), 16 bytes or Hash128, not {type(h).__name__}") from None


def wait_ticket(done: dict, ticket: int, poll, timeout: float, what: str):
    """The result of batch `ticket` of an asynchronous engine (store, transfer
    engine): results polled meanwhile for other tickets are kept in `done`
    for their own wait. TimedOut after `timeout` seconds."""
    import time
    end = time.monotonic() + timeout
    while ticket not in done:
        left = end - time.monotonic()
        if left <= 0:
            raise error(-14, what, f"ticket {ticket}")
        for r in poll(min(left, 0.1)):
            done[r.ticket] = r
    return done.pop(ticket)


def page_hashes(tokens: Any, page_tokens: int, ns: int = 0) -> list:
    """The chained hashes (lo, hi) of the whole pages of a token sequence, as
    the cache and the store key them (radix.h: kvt_page_hash_chain)."""
    addr, n, keep = tokens_arg(tokens)
    if page_tokens < 1:
        raise ValueError("page_tokens: must be >= 1")
    npages = n // page_tokens
    out = (Hash128 * max(npages, 1))()
    if npages:
        lib.kvt_page_hash_chain(ns, ctypes.cast(addr, ctypes.POINTER(ctypes.c_int32)), npages, page_tokens, out)
    del keep
    return [(h.lo, h.hi) for h in out[:npages]]


def enum_arg(value: Any, parse, what: str, names: Sequence[str]) -> int:
    """An enum given by name (or by its number)."""
    if isinstance(value, int):
        if not 0 <= value < len(names):
            raise ValueError(f"{what}: {value} is out of range (choose from {', '.join(names)})")
        return value
    v = ctypes.c_int()
    if parse(str(value).encode(), ctypes.byref(v)) != 0:
        raise ValueError(f"{what}: unknown {value!r} (choose from {', '.join(names)})")
    return v.value


def enum_names(name_fn, count: int) -> Tuple[str, ...]:
    return tuple(name_fn(i).decode() for i in range(count))


def struct_dict(st, names) -> dict:
    return {n: getattr(st, n) for n in names}
