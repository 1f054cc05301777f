"""What every wrapper shares: errors, handles that close deterministically,
and the conversions from Python values to C arguments."""
from __future__ import annotations

import array
import ctypes
import operator
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Set
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from . import _args as _a
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


# One subclass per C error (include/kvtier/error.h), written out so that a type
# checker sees each one; also a subclass of the matching builtin where there is
# one, so `except ValueError` works for KVT_EINVAL. test_binding holds them to
# the header's list (_fields.ERRORS) and its messages.


class InvalidArgument(Error, ValueError):
    """KVT_EINVAL: invalid argument"""
    code = -1
    name = "KVT_EINVAL"


class OutOfMemory(Error, MemoryError):
    """KVT_ENOMEM: out of memory"""
    code = -2
    name = "KVT_ENOMEM"


class NoSpace(Error):
    """KVT_ENOSPC: not enough free pages"""
    code = -3
    name = "KVT_ENOSPC"


class Fragmented(Error):
    """KVT_EFRAG: free pages too fragmented for the allowed number of runs"""
    code = -4
    name = "KVT_EFRAG"


class OutOfRange(Error, IndexError):
    """KVT_ERANGE: page or size out of range"""
    code = -5
    name = "KVT_ERANGE"


class NotReserved(Error):
    """KVT_ENOTRESV: page is not reserved"""
    code = -6
    name = "KVT_ENOTRESV"


class Busy(Error):
    """KVT_EBUSY: locked, pinned or in flight"""
    code = -7
    name = "KVT_EBUSY"


class NotFound(Error, LookupError):
    """KVT_ENOENT: not found"""
    code = -8
    name = "KVT_ENOENT"


class AlreadyExists(Error):
    """KVT_EEXIST: already exists"""
    code = -9
    name = "KVT_EEXIST"


class IOFailure(Error, OSError):
    """KVT_EIO: input/output error"""
    code = -10
    name = "KVT_EIO"


class Corrupt(Error):
    """KVT_ECORRUPT: corrupt: a checksum or an invariant failed"""
    code = -11
    name = "KVT_ECORRUPT"


class ParseError(Error, ValueError):
    """KVT_EPARSE: malformed input"""
    code = -12
    name = "KVT_EPARSE"


class NotSupported(Error, NotImplementedError):
    """KVT_ENOTSUP: not supported"""
    code = -13
    name = "KVT_ENOTSUP"


class TimedOut(Error, TimeoutError):
    """KVT_ETIMEDOUT: timed out"""
    code = -14
    name = "KVT_ETIMEDOUT"


class TryAgain(Error):
    """KVT_EAGAIN: resource temporarily unavailable"""
    code = -15
    name = "KVT_EAGAIN"


class AlreadyReserved(Error):
    """KVT_ERESERVED: page is already reserved"""
    code = -16
    name = "KVT_ERESERVED"


ERROR_TYPES: Tuple[type, ...] = (InvalidArgument, OutOfMemory, NoSpace, Fragmented, OutOfRange, NotReserved, Busy,
                                 NotFound, AlreadyExists, IOFailure, Corrupt, ParseError, NotSupported, TimedOut,
                                 TryAgain, AlreadyReserved)
_BY_CODE = {}
for _cls in ERROR_TYPES:
    _cls.__module__ = "kvtier"
    _BY_CODE[_cls.code] = _cls
del _cls


def error(code: int, what: str, detail: str = "") -> Error:
    cls = _BY_CODE.get(code, Error)
    return cls(what, code, detail)


def check(rc: int, what: str, detail: str = "") -> int:
    """rc if >= 0; else raises the Error for it."""
    if rc < 0:
        raise error(rc, what, detail)
    return rc


def error_class(name: str) -> type:
    """The exception class of a C error name ("KVT_EINVAL" or "EINVAL");
    KeyError for a name that is none, TypeError for what is not a name."""
    if not isinstance(name, str):
        raise TypeError(f"error_class: a name such as 'KVT_EINVAL', not {type(name).__name__}")
    name = name[4:] if name.startswith("KVT_") else name
    for code, cls in _BY_CODE.items():
        if cls.name == f"KVT_{name}":
            return cls
    raise KeyError(name)


# ---- handles -----------------------------------------------------------------

# Forks this process has been made by (0 in the first). A C object made before
# a fork is the parent's: its threads stayed there and its locks may be held
# by them, so a child that called or freed it would hang or crash (its
# interpreter's exit too, finalizing it). In the child it refuses every call
# and is forgotten, never freed.
_forks = 0


def _forked_child() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


class _Shared:
    """A call that may run on several threads at once: ``with h._use as ptr``
    gives the C pointer and counts the call in flight until the block ends
    (close waits for the count to drop to zero). With a lock, the block
    also holds it (polls, one at a time). Built once per handle; it refers
    to the handle weakly, so a dropped handle is still freed at once."""

    __slots__ = ("_ref", "_lock")

    def __init__(self, o: "Handle", lock: Any = None) -> None:
        self._ref, self._lock = weakref.ref(o), lock

    def __enter__(self) -> int:
        o, lock = self._ref(), self._lock
        if o._forks != _forks:
            raise o._forked()
        if o._in_callback and threading.get_ident() in o._in_callback:
            raise o._reentered()
        if lock is not None:
            lock.acquire()
        with o._mu:
            h = o._h
            if h is not None and not o._closing:
                o._busy += 1
                return h
        if lock is not None:
            lock.release()
        raise ClosedError(type(o).__name__)

    def __exit__(self, *exc: Any) -> None:
        o = self._ref()
        with o._mu:
            o._busy -= 1
            if o._closing and not o._busy:
                o._cv.notify_all()
        if self._lock is not None:
            self._lock.release()


class _Serial:
    """A call on a C object that belongs to one thread: the block holds the
    handle's lock, so calls from several threads take turns (and close,
    which takes the same lock, waits for the one in flight)."""

    __slots__ = ("_ref",)

    def __init__(self, o: "Handle") -> None:
        self._ref = weakref.ref(o)

    def __enter__(self) -> int:
        o = self._ref()
        if o._forks != _forks:
            raise o._forked()
        if o._in_callback and threading.get_ident() in o._in_callback:  # (before the lock: its holder may wait on us)
            raise o._reentered()
        o._serial.acquire()
        h = o._h
        if h is None or o._closing:
            o._serial.release()
            raise ClosedError(type(o).__name__)
        return h

    def __exit__(self, *exc: Any) -> None:
        self._ref()._serial.release()


class _UseAll:
    """Several handles' calls at once (an object built over others): their
    pointers, each kept open until the block ends."""

    __slots__ = ("_uses", "_in")

    def __init__(self, handles: Iterable["Handle"]) -> None:
        self._uses = [h._use for h in handles]
        self._in: list = []

    def __enter__(self) -> list:
        ptrs = []
        try:
            for u in self._uses:
                ptrs.append(u.__enter__())
                self._in.append(u)
        except BaseException:
            self.__exit__()
            raise
        return ptrs

    def __exit__(self, *exc: Any) -> None:
        while self._in:
            self._in.pop().__exit__()


def using(*handles: "Handle") -> _UseAll:
    return _UseAll(handles)


POLL_SLICE_NS = 100_000_000


def poll_sliced(use: Any, once: Any, timeout_s: float) -> list:
    """once(ptr, wait_ns) -> a list, inside ``with use as ptr``, until it
    returns something or timeout_s has passed: in slices of at most 100 ms,
    each its own call, so that a close waits for a slice, not the whole
    timeout (a poll running then raises ClosedError at its next slice)."""
    deadline = time.monotonic_ns() + int(timeout_s * 1e9)
    while True:
        left = max(0, deadline - time.monotonic_ns())
        with use as h:
            got = once(h, min(left, POLL_SLICE_NS))
        if got or left <= POLL_SLICE_NS:
            return got


class in_callback:
    """``with in_callback(o):`` around a Python callback that a C call of
    handle ``o`` (None: gone) runs: calls into ``o`` from it, on its thread,
    are refused meanwhile (Handle). Callbacks may run on several threads at
    once (a store's workers log), and nest: each thread counts its own."""

    __slots__ = ("_o", "_tid")

    def __init__(self, o: Optional["Handle"]) -> None:
        self._o = o

    def __enter__(self) -> None:
        o = self._o
        if o is not None:
            self._tid = threading.get_ident()
            with o._mu:
                o._in_callback[self._tid] = o._in_callback.get(self._tid, 0) + 1

    def __exit__(self, *exc: Any) -> None:
        o = self._o
        if o is not None:
            with o._mu:
                if o._in_callback[self._tid] == 1:
                    del o._in_callback[self._tid]
                else:
                    o._in_callback[self._tid] -= 1


class Handle:
    """A Python object owning one C object. ``close()`` frees it (also on
    leaving a ``with`` block, and as a last resort when collected); every
    call after that raises ClosedError. Objects that others use (a tier
    under a transfer engine, a store under a cache) refuse to close while a
    user is open: close the users first (nested ``with`` blocks do).

    A Transfer or Store a cache or data plane polls is that driver's alone
    (:meth:`_drive`): a completion taken by anyone else would never reach
    it, and a batch submitted by anyone else would be taken for one of its
    own. While the driver is open, the calls that submit or poll refuse.

    A C call that runs a Python callback (a write, a probe) is not done
    while the callback runs: a call into the same object from inside it
    (``_in_callback``, the callback's thread) is refused.

    Threads: every call is made inside ``with self._use as ptr``. A class
    whose C object belongs to one thread (``_SERIAL``) serialises its calls
    with a lock of its own; the others let calls run at once, as their C
    side allows, and count them. ``_use_any`` is a call the C side allows
    from any thread even on a serial object; ``_use_poll`` one that runs on
    one thread at a time. Close waits for the calls in flight, and calls
    after it raise ClosedError."""

    _h: Optional[int] = None
    _SERIAL = False

    def __init__(self) -> None:
        self._h = None
        self._deps: list = []  # objects this one uses: kept alive while it is open
        self._users: "weakref.WeakSet[Handle]" = weakref.WeakSet()  # (for messages)
        # Open users, counted: the collector clears weak references before it runs the finalizers of a
        # cycle, so the WeakSet may read empty while a user's C object still runs on this one's.
        self._nusers = 0
        self._orphan = False  # collected while used: the last user to close closes it
        self._mu = threading.Lock()  # guards _h, _busy, _closing, _users
        self._cv = threading.Condition(self._mu)
        self._busy = 0  # shared calls in flight
        self._closing = False
        self._serial = threading.RLock() if self._SERIAL else None
        self._use_any = _Shared(self)
        self._use = _Serial(self) if self._SERIAL else self._use_any
        self._use_poll = self._use if self._SERIAL else _Shared(self, threading.Lock())
        self._driver: Optional[weakref.ref] = None  # the cache or plane that submits and polls alone
        self._driver_role = ""  # which of its parts does (an object may hold a cache and a plane)
        self._in_callback: Dict[int, int] = {}  # threads running this object's callbacks: how deep
        self._forks, self._pid = _forks, os.getpid()  # the process it belongs to

    def _forked(self) -> Error:
        return error(-1, type(self).__name__, f"made in process {self._pid} before a fork: a child process "
                                              "cannot use it (its threads stayed in the parent); make one in the child")

    def _reentered(self) -> Error:
        return error(-1, type(self).__name__, "called from inside its own callback (a write, probe or log it runs, "
                                              "or one of an object it drives, which it may be waiting on): "
                                              "return from the callback first")

    def _driven_by(self) -> Optional["Handle"]:
        d = self._driver() if self._driver is not None else None
        return d if d is not None and not d.closed else None

    def _may_drive(self, by: "Handle", role: str, what: str) -> None:
        """Raises unless ``by``'s part ``role`` may become this object's driver (no other is)."""
        d = self._driven_by()
        if d is not None and (d is not by or self._driver_role != role):
            raise error(-1, what, f"this {type(self).__name__} is driven already (by {type(d).__name__}'s "
                                  f"{self._driver_role}): the one that submits to it polls it, and a completion "
                                  "another took would never reach it")

    def _drive(self, by: "Handle", role: str) -> None:
        """From now on ``by``'s part ``role`` alone submits to and polls this object (while ``by`` is open)."""
        self._driver, self._driver_role = weakref.ref(by), role

    def _undriven(self, what: str) -> None:
        """Raises while a driver is open: this call would take its completions or mix in batches."""
        d = self._driven_by()
        if d is not None:
            raise error(-1, what, f"{type(d).__name__} submits to and polls this {type(self).__name__} alone "
                                  f"while it is open: close it first")

    def _own(self, h: int, deps: Iterable["Handle"] = ()) -> None:
        """Takes ownership of h; deps become this object's (hold their _use while calling this)."""
        with self._mu:
            self._h = h
        for d in deps:
            with d._mu:
                d._users.add(self)
                d._nusers += 1
            self._deps.append(d)

    def _add_user(self, u: "Handle") -> None:
        """u (open) uses this object: this one closes after it."""
        with self._mu:
            self._users.add(u)
            self._nusers += 1
        u._deps.append(self)

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

    def _close_refused(self) -> str:
        """Why close must refuse now ("" when it may go ahead); called with _mu held."""
        if self._nusers:
            users = [type(u).__name__ for u in self._users if not u.closed]
            return "still used by " + (", ".join(users) or f"{self._nusers} object(s)") + ": close it first"
        return ""

    def close(self) -> None:
        """Frees the C object (idempotent). Waits for calls in flight on other
        threads; Busy while another object still uses this one. (A Cache or
        Hybrid closed with requests live over engine memory that was freed
        is left unfreed, with a RuntimeWarning: releasing them would copy
        out of that memory.)"""
        self._close(True)

    def _close(self, wait: bool) -> None:
        if self._forks != _forks:  # the parent's: forgotten here, never freed
            self._h, self._deps = None, []
            return
        if threading.get_ident() in self._in_callback:
            raise self._reentered()
        serial = self._serial
        if serial is not None and not serial.acquire(wait):  # the serial call in flight ends first
            return
        try:
            h = self._close_begin(wait)
            if h is None:
                return
            done = False
            try:
                self._destroy(h)
                done = True
            finally:
                with self._mu:
                    if done:
                        self._h = None
                    self._closing = False
                    self._cv.notify_all()
        finally:
            if serial is not None:
                serial.release()
        deps, self._deps = self._deps, []
        for d in deps:
            with d._mu:
                d._users.discard(self)
                d._nusers -= 1
                last = d._orphan and d._nusers == 0
            if last:  # collected while this one used it: its finalizer left it to this close
                try:
                    d._close(False)
                except Exception:
                    pass  # (as its finalizer would have: a C object that cannot go now stays)

    def _close_begin(self, wait: bool) -> Optional[int]:
        """Marks the object closing once no shared call is in flight: its
        handle, or None when there is nothing to do (closed; or busy and not
        waiting). Busy while a user is open."""
        with self._mu:
            while self._closing:  # another thread is closing it
                if not wait:
                    return None
                self._cv.wait()
            if self._h is None:
                return None
            why = self._close_refused()
            if why:
                raise error(-7, f"{type(self).__name__}.close", why)
            self._closing = True
            while self._busy:
                if not wait:
                    self._closing = False
                    self._cv.notify_all()
                    return None
                self._cv.wait()
            why = self._close_refused()  # a call that just ended may have made a user
            if why:
                self._closing = False
                self._cv.notify_all()
                raise error(-7, f"{type(self).__name__}.close", why)
            return self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __copy__(self) -> Any:
        raise TypeError(f"{type(self).__name__} owns a C object: it cannot be copied (two copies would free it twice)")

    def __deepcopy__(self, memo: Any) -> Any:
        return self.__copy__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"{type(self).__name__} owns a C object: it cannot be pickled")

    def __del__(self) -> None:
        if self._h is not None:
            try:  # never blocks: a collected object has no call in flight, a user may (then it stays open)
                for u in list(self._users):  # collected together: users go first
                    u._close(False)
                if self._nusers:  # a user the collector has not finalized yet: it closes this one
                    self._orphan = True
                    return
                self._close(False)
            except Exception:
                pass


# ---- conversions -------------------------------------------------------------


def tokens_arg(tokens: Any) -> Tuple[int, int, Any]:
    """(address, count, keepalive) of int32 token ids: a numpy or torch int32
    array (contiguous, on the CPU; not copied), an array('i'), or any sequence
    of ints (copied once). The address and count come from the object's
    memory as its own type describes it (numpy's descriptor, array's
    buffer), never from what a subclass's methods say: C reads that many."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(tokens, np.ndarray):
        ai = np.ndarray.__array_interface__.__get__(tokens)  # (a subclass may override the attribute)
        if ai["typestr"] not in ("<i4", "=i4", "|i4"):
            raise TypeError(f"tokens: dtype {ai['typestr']}, expected int32")
        if len(ai["shape"]) != 1:
            raise ValueError(f"tokens: shape {ai['shape']}, expected one dimension")
        if ai.get("strides") not in (None, (4,)):
            raise ValueError("tokens: not contiguous")
        return ai["data"][0], ai["shape"][0], tokens
    torch = sys.modules.get("torch")
    if torch is not None and type(tokens) is torch.Tensor:  # (a subclass's data_ptr may be anything: copied below)
        if tokens.dtype != torch.int32:
            raise TypeError(f"tokens: dtype {tokens.dtype}, expected torch.int32")
        if tokens.dim() != 1 or not tokens.is_contiguous() or tokens.device.type != "cpu":
            raise ValueError("tokens: expected a contiguous one-dimensional CPU tensor")
        return tokens.data_ptr(), tokens.numel(), tokens
    if isinstance(tokens, array.array) and tokens.typecode == "i" and tokens.itemsize == 4:
        view = memoryview(tokens)  # exported while the C call reads it: another thread cannot resize it meanwhile
        n = view.nbytes // 4  # (the buffer's own size: a subclass's __len__ may say anything)
        if n == 0:
            return 0, 0, tokens
        return array.array.buffer_info(tokens)[0], n, view
    elif isinstance(tokens, (bytes, bytearray, memoryview, str, Set, Mapping)):
        # array("i", b) would read raw bytes as int32s; a set or a dict has no order to be a prefix in
        raise TypeError(f"tokens: expected int32 token ids (a sequence of ints or an int32 array), "
                        f"not {type(tokens).__name__}")
    else:
        try:
            a = array.array("i", tokens)
        except (TypeError, OverflowError) as e:
            raise TypeError(f"tokens: expected int32 token ids ({e})") from None
    if len(a) == 0:
        return 0, 0, a
    addr, n = a.buffer_info()
    return addr, n, a


def hash_arg(h: Any, what: str = "page hash") -> Hash128:
    """A page hash: a Hash128, a (lo, hi) pair of uint64 or 16 bytes (lo then hi, little-endian)."""
    if isinstance(h, Hash128):
        return h
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if len(b) != 16:
            raise ValueError(f"{what}: {len(b)} bytes, expected 16")
        return Hash128(int.from_bytes(b[:8], "little"), int.from_bytes(b[8:], "little"))
    if isinstance(h, (str, dict)) or not hasattr(h, "__len__") or len(h) != 2:
        raise TypeError(f"{what}: expected (lo, hi), 16 bytes or Hash128, not {type(h).__name__}")
    lo, hi = h
    return Hash128(_a.u64(lo, f"{what} lo"), _a.u64(hi, f"{what} hi"))


class Tickets:
    """The batches of an asynchronous engine (store, transfer engine) in
    flight: issued by a submit, not yet taken by a poll. A wait on another
    ticket (never issued, or its result taken already) says so at once
    instead of waiting out its timeout. Another thread's poll may take a
    completion before its submit has recorded the ticket: it is kept as
    early, and the submit's record then matches it."""

    __slots__ = ("_mu", "_out", "_early")

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._out: set = set()
        self._early: set = set()

    def issued(self, t: int) -> int:
        with self._mu:
            if t in self._early:
                self._early.discard(t)
            else:
                self._out.add(t)
        return t

    def taken(self, results: Iterable[Any], into: Optional[dict] = None) -> None:
        """The results' batches are no longer in flight; with `into`, each
        result goes there (by ticket) in the same step, so that a wait on
        another thread finds its batch either in flight or there."""
        with self._mu:
            for r in results:
                if r.ticket in self._out:
                    self._out.discard(r.ticket)
                else:
                    self._early.add(r.ticket)
                if into is not None:
                    into[r.ticket] = r

    def pending(self, t: int, done: dict) -> bool:
        """Batch t in flight, or its result waiting in done."""
        with self._mu:
            return t in self._out or t in done


def wait_ticket(done: dict, ticket: int, poll, timeout: float, what: str, tickets: Tickets):
    """The result of batch `ticket` of an asynchronous engine (store, transfer
    engine): results polled meanwhile for other tickets are kept in `done`
    for their own wait. `poll(timeout)` gives completions without marking
    them taken: they are marked and kept in one step (Tickets.taken), so a
    wait on another thread never sees its batch neither in flight nor done.
    TimedOut after `timeout` seconds; InvalidArgument at once for a ticket
    not in flight."""
    timeout = _a.number(timeout, f"{what} timeout")
    end = time.monotonic() + timeout
    while ticket not in done:
        if not tickets.pending(ticket, done):
            raise error(-1, what, f"ticket {ticket} is not a batch in flight: never issued, or its result taken "
                                  "already (by a poll or another wait)")
        left = end - time.monotonic()
        if left <= 0:
            raise error(-14, what, f"ticket {ticket}")
        tickets.taken(poll(min(left, 0.1)), into=done)
    return done.pop(ticket)


def page_hashes(tokens: Any, page_tokens: int, ns: int = 0) -> list:
    """The chained hashes (lo, hi) of the whole pages of a token sequence, as
    the cache and the store key them (radix.h: kvt_page_hash_chain)."""
    page_tokens = _a.u32(page_tokens, "page_hashes page_tokens", 1)
    ns = _a.u32(ns, "page_hashes ns")
    addr, n, keep = tokens_arg(tokens)
    npages = n // page_tokens
    out = (Hash128 * max(npages, 1))()
    if npages:
        lib.kvt_page_hash_chain(ns, ctypes.cast(addr, ctypes.POINTER(ctypes.c_int32)), npages, page_tokens, out)
    del keep
    return [(h.lo, h.hi) for h in out[:npages]]


def enum_arg(value: Any, parse, what: str, names: Sequence[str]) -> int:
    """An enum given by name (or by its number: anything with __index__, a numpy integer too; not a bool)."""
    if _a.is_bool(value):
        raise TypeError(f"{what}: expected a name ({', '.join(names)}), not {type(value).__name__} {value!r}")
    if not isinstance(value, str) and hasattr(value, "__index__"):
        value = operator.index(value)
        if not 0 <= value < len(names):
            raise ValueError(f"{what}: {value} is out of range (choose from {', '.join(names)})")
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected a name ({', '.join(names)}), not {type(value).__name__}")
    v = ctypes.c_int()
    if "\0" in value or parse(value.encode(), ctypes.byref(v)) != 0:
        raise ValueError(f"{what}: unknown {value!r} (choose from {', '.join(names)})")
    return v.value


def enum_names(name_fn, count: int) -> Tuple[str, ...]:
    return tuple(name_fn(i).decode() for i in range(count))
