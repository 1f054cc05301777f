"""The keyed page cache (keyed.h): host pages found by a 128-bit key, for
engines that name their KV blocks themselves (vLLM's offloading manager,
SGLang's storage keys). A key is a pair of ints ``(hi, lo)``, each below
2**64; a score is an int below 2**64 (smaller goes first when evicting).

Every call hands its keys to C packed, as kvt_key128_t lies in memory (16
bytes a key, ``pack_keys``); the ``*_packed`` methods take them so, for a
caller that keeps its keys packed (kvtier.vllm) and so converts nothing per
call."""
from __future__ import annotations

import array
import ctypes
import hashlib
import math
import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _args as _a
from . import _fields
from ._core import Handle, check, error
from ._lib import Key128, KeyedConfig, KeyedEvent, KeyedStats, lib

__all__ = ["KeyedCache", "KeyedEvent", "LOOKUP", "key_of_bytes", "pack_keys", "unpack_keys"]

LOOKUP = ("miss", "hit", "pending")
_WHY = ("evicted", "failed store", "reset", "removed")
_NO_PAGE = (1 << 64) - 1
_ENOSPC = dict(_fields.ERRORS)["ENOSPC"]
_ERANGE = dict(_fields.ERRORS)["ERANGE"]
# Room for this many evicted keys beyond a store's own first: most stores
# evict a few, and the room for the whole free-room target (16 bytes a key
# of it, zeroed) is made only when a call needs it (KVT_ERANGE: nothing
# changed, called again).
_EVICTED_FIRST = 256
KEY_BYTES = 16  # sizeof(kvt_key128_t): hi, then lo, native uint64s

Key = Tuple[int, int]


def _raw(name: str, res, args):
    """Another entry point to a C function, taking packed bytes: bytes pass
    as const pointers, where _lib's prototypes want ctypes structures."""
    f = lib[name]  # a fresh function object: _lib's prototype stays as it is
    f.restype, f.argtypes = res, args
    return f


_vp, _sz, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_remove = _raw("kvt_keyed_remove", _int, [_vp, _vp, _sz, _vp])


class _Ctypes:
    """The cache's hot calls through ctypes: what the extension module
    kvtier._keyed_calls does (python/src/keyed_calls.c), the same arguments,
    checks and results, where that module is not built. Each takes the
    handle and packed bytes, checks them (TypeError, ValueError) and returns
    the C call's status with its results."""

    FUNCTIONS = ("kvt_keyed_prepare_store", "kvt_keyed_complete_store", "kvt_keyed_pin", "kvt_keyed_unpin",
                 "kvt_keyed_touch", "kvt_keyed_arc_touch", "kvt_keyed_arc_missed", "kvt_keyed_arc_finish")
    _prepare = _raw("kvt_keyed_prepare_store", _int, [_vp, _vp, _vp, _sz, _vp, _sz, _vp, _vp, _sz, _vp])
    _complete = _raw("kvt_keyed_complete_store", None, [_vp, _vp, _sz, _int])
    _pin = _raw("kvt_keyed_pin", _int, [_vp, _vp, _sz, _vp])
    _unpin = _raw("kvt_keyed_unpin", _int, [_vp, _vp, _sz])
    _touch = _raw("kvt_keyed_touch", None, [_vp, _vp, _vp, _sz])
    _arc_touch = _raw("kvt_keyed_arc_touch", _int, [_vp, _vp, _sz])
    _arc_missed = _raw("kvt_keyed_arc_missed", _int, [_vp, _vp, _sz])
    _arc_finish = _raw("kvt_keyed_arc_finish", _int, [_vp, _vp, _vp, _sz])

    @classmethod
    def prepare(cls, h: int, keys: bytes, scores: Optional[bytes], protect: bytes, room: int):
        """(status, pages, evicted keys packed); the results None unless the
        status is KVT_OK. room: the most keys it may evict beyond its own."""
        n = _count(keys, "keys")
        np_ = _count(protect, "protect")
        if scores is not None:
            _check_scores(scores, n)
        pages = (ctypes.c_uint64 * max(n, 1))()
        nev = ctypes.c_size_t()
        cap = min(n + room, n + _EVICTED_FIRST)
        while True:
            evicted = ctypes.create_string_buffer(KEY_BYTES * max(cap, 1))
            rc = cls._prepare(h, keys, scores, n, protect, np_, pages, evicted, cap, ctypes.byref(nev))
            if rc != _ERANGE or cap == n + room:
                break
            cap = n + room  # nothing changed: again, with room for every key it may evict
        if rc:
            return rc, None, None
        return rc, pages[:n], ctypes.string_at(evicted, KEY_BYTES * nev.value)

    @classmethod
    def complete(cls, h: int, keys: bytes, ok: bool) -> None:
        cls._complete(h, keys, _count(keys, "keys"), 1 if ok else 0)

    @classmethod
    def pin(cls, h: int, keys: bytes):
        """(status, pages or None)"""
        n = _count(keys, "keys")
        pages = (ctypes.c_uint64 * max(n, 1))()
        rc = cls._pin(h, keys, n, pages)
        return rc, (pages[:n] if rc == 0 else None)

    @staticmethod
    def _keys_call(f, h: int, keys: bytes) -> int:
        """A call of (handle, keys, n) -> status: unpin and ARC's touch and miss."""
        return f(h, keys, _count(keys, "keys"))

    @classmethod
    def unpin(cls, h: int, keys: bytes) -> int:
        return cls._keys_call(cls._unpin, h, keys)

    @classmethod
    def touch(cls, h: int, keys: bytes, scores: bytes) -> None:
        n = _count(keys, "keys")
        _check_scores(scores, n)
        cls._touch(h, keys, scores, n)

    @classmethod
    def arc_touch(cls, h: int, keys: bytes) -> int:
        return cls._keys_call(cls._arc_touch, h, keys)

    @classmethod
    def arc_missed(cls, h: int, keys: bytes) -> int:
        return cls._keys_call(cls._arc_missed, h, keys)

    @classmethod
    def arc_finish(cls, h: int, keys: bytes, flags: bytes) -> int:
        n = _count(keys, "keys")
        if not isinstance(flags, bytes) or memoryview(flags).nbytes != n:  # (the bytes: a subclass's __len__ may lie)
            raise ValueError(f"flags: expected {n} bytes, one a key")
        return cls._arc_finish(h, keys, flags, n)


def _load_calls():
    """The extension module bound to the library loaded (its calls skip
    ctypes), or _Ctypes where it is not built (a Python without its
    headers, another interpreter than the one it was built for) or
    KVTIER_KEYED_CALLS=ctypes asks for it. A wheel carries the module in
    the package; a checkout's build folder holds its own (_build.py)."""
    how = os.environ.get("KVTIER_KEYED_CALLS", "")
    if how not in ("", "ctypes"):
        raise ImportError(f"kvtier: KVTIER_KEYED_CALLS={how!r} (expected ctypes, or unset)")
    if how == "ctypes":
        return _Ctypes
    try:
        from . import _keyed_calls as m  # type: ignore[attr-defined]
    except ImportError:
        m = _checkout_calls()
    if m is None or tuple(m.FUNCTIONS) != _Ctypes.FUNCTIONS:  # (a module built from other sources)
        return _Ctypes
    m.bind(tuple(ctypes.cast(lib[name], ctypes.c_void_p).value for name in m.FUNCTIONS))
    return m


def _checkout_calls():
    """The module scripts/install-python built beside a checkout's library,
    or None."""
    import importlib.machinery
    import importlib.util
    try:
        from . import _build  # type: ignore[attr-defined]
        path = _build.KEYED_CALLS
    except (ImportError, AttributeError):
        return None
    if not path or not path.endswith(importlib.machinery.EXTENSION_SUFFIXES[0]) or not os.path.exists(path):
        return None
    name = __name__.rpartition(".")[0] + "._keyed_calls"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    try:
        m = importlib.util.module_from_spec(spec)
        loader.exec_module(m)
    except ImportError:
        return None
    return m


_calls = _load_calls()
CALLS = "ctypes" if _calls is _Ctypes else "extension"  # which makes the hot calls

POLICIES = ("scores", "arc")  # keyed.h's KVT_KEYED_SCORES, KVT_KEYED_ARC
ARC_STORED, ARC_REUSED = 1, 2  # kvt_keyed_arc_finish's flags


class Event(NamedTuple):
    """A key stored (``removed`` False) or removed, and why ("evicted",
    "failed store", "reset")."""
    key: Key
    removed: bool
    why: str


def key_of_bytes(b: bytes) -> Key:
    """A 128-bit key for vLLM's OffloadKey (a block hash, then its group
    index in 4 big-endian bytes) from its bytes alone, the same in every
    process (kvtier.vllm's manager gives its keys C keys of its own): 96
    bits of BLAKE2b over the block hash, then the group. Distinct keys
    collide only as the hash does (2**-96 for a pair), whatever the block
    hashes look like, and the keys of one block hash order by group, as
    their bytes do."""
    if len(b) < 4:
        raise ValueError(f"key: {len(b)} bytes; expected a block hash and a 4-byte group index")
    h = hashlib.blake2b(b[:-4], digest_size=12).digest()
    return int.from_bytes(h[:8], "big"), int.from_bytes(h[8:] + b[-4:], "big")


def pack_keys(keys: Sequence[Key], what: str = "keys") -> bytes:
    """keys as C lays out an array of kvt_key128_t; checked in bulk (the
    manager passes thousands a call)."""
    try:
        flat = array.array("Q", [x for hi, lo in keys for x in (hi, lo)])
    except (TypeError, ValueError, OverflowError):
        for i, k in enumerate(keys):  # name the culprit
            if not (isinstance(k, (tuple, list)) and len(k) == 2):
                raise TypeError(f"{what}[{i}]: expected a key (hi, lo), not {type(k).__name__}") from None
            try:
                _a.u64(k[0], f"{what}[{i}] hi"), _a.u64(k[1], f"{what}[{i}] lo")
            except ValueError:
                raise ValueError(f"{what}[{i}]: {tuple(k)} is out of range (each half 0..2**64-1)") from None
        raise TypeError(f"{what}: expected a list of keys (hi, lo)") from None
    return flat.tobytes()


def unpack_keys(b: bytes) -> List[Key]:
    """The keys of a packed array (pack_keys' inverse)."""
    flat = array.array("Q", b).tolist()
    return list(zip(flat[::2], flat[1::2]))


def pack_scores(scores: Sequence[int], n: int) -> bytes:
    try:
        m = len(scores)
    except TypeError:
        raise TypeError(f"scores: expected a list of integers, not {type(scores).__name__}") from None
    if m != n:
        raise ValueError(f"scores: {m} scores for {n} keys")
    try:
        return array.array("Q", scores).tobytes()
    except (TypeError, OverflowError):
        for i, s in enumerate(scores):  # name the culprit
            _a.u64(s, f"scores[{i}]")
        raise TypeError("scores: expected a list of integers 0..2**64-1") from None


def _one(key: Key, what: str = "key") -> Key128:
    return Key128(*array.array("Q", pack_keys([key], what)))


class KeyedCache(Handle):
    """``KeyedCache(pages, free_room=0.0, events=False, policy="scores")``: a
    cache handing out host pages [0, pages). ``policy="arc"``: vLLM's ARC
    order (keyed.h; no scores, no free room, pages below 2**32 - 1, and the
    ``arc_*`` hooks). Its calls run one at a time (the C object belongs to
    one thread; calls from several threads take turns)."""

    _SERIAL = True

    def __init__(self, pages: int, *, free_room: float = 0.0, events: bool = False, policy: str = "scores") -> None:
        super().__init__()
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(f"policy: {policy!r} (expected one of {', '.join(POLICIES)})")
        arc = policy == "arc"
        cfg = KeyedConfig(size=ctypes.sizeof(KeyedConfig), events=1 if _a.flag(events, "events") else 0,
                          pages=_a.integer(pages, "pages", 1, (1 << 32) - (2 if arc else 1)),
                          free_room=_a.number(free_room, "free_room", 0.0, 1.0), policy=POLICIES.index(policy))
        if cfg.free_room == 1.0:
            raise ValueError(f"free_room: {free_room!r} is out of range (expected 0 <= free_room < 1)")
        if arc and cfg.free_room != 0.0:
            raise ValueError(f"free_room: {free_room!r} (ARC evicts on demand only: expected 0)")
        self.policy = policy
        h = ctypes.c_void_p()
        check(lib.kvt_keyed_create(ctypes.byref(h), ctypes.byref(cfg)), "KeyedCache")
        self._own(h.value)
        self.pages = cfg.pages
        # the most keys a prepare_store evicts beyond its new keys (keyed.h: capacity n + T)
        self._room = math.ceil(cfg.free_room * cfg.pages)

    def _destroy(self, h: int) -> None:
        lib.kvt_keyed_destroy(h)

    def __enter__(self) -> "KeyedCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def lookup(self, key: Key) -> str:
        """"miss", "hit" (ready) or "pending" (its store is in flight)."""
        k = _one(key)
        with self._use as h:
            return LOOKUP[lib.kvt_keyed_lookup(h, k)]

    def page(self, key: Key) -> Optional[int]:
        """The page of a present key, or None."""
        k = _one(key)
        out = ctypes.c_uint64()
        with self._use as h:
            rc = lib.kvt_keyed_page(h, k, ctypes.byref(out))
        return out.value if rc == 0 else None

    def prepare_store(self, keys: Sequence[Key], scores: Optional[Sequence[int]], protect: Sequence[Key] = ()
                      ) -> Optional[Tuple[List[Optional[int]], List[Key]]]:
        """Pages for the absent keys (None for keys already present), and the
        keys evicted to make room; None, with nothing changed, when they do
        not fit. Under ARC scores is None or empty."""
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)  # counted after packing
        kb, pb = pack_keys(keys), pack_keys(protect, "protect")
        arc = self.policy == "arc" and (scores is None or (isinstance(scores, (list, tuple)) and not scores))
        out = self.prepare_store_packed(kb, b"" if arc else pack_scores(scores, len(keys)), pb)
        if out is None:
            return None
        pages, evicted = out
        return [None if p == _NO_PAGE else p for p in pages], unpack_keys(b"".join(evicted))

    def prepare_store_packed(self, keys: bytes, scores: bytes, protect: bytes = b""
                             ) -> Optional[Tuple[List[int], List[bytes]]]:
        """prepare_store on packed keys and scores (uint64s, native order; ARC:
        none, b""): the pages (2**64-1 for a key already present) and the
        evicted keys, 16 bytes each; None, with nothing changed, when they do
        not fit."""
        if self.policy == "arc" and isinstance(scores, bytes) and not scores:
            scores = None
        elif not isinstance(scores, bytes):  # (None is for ARC alone)
            raise TypeError(f"scores: expected packed scores (bytes), not {type(scores).__name__}")
        with self._use as h:
            rc, pages, raw = _calls.prepare(h, keys, scores, protect, self._room)
        if rc == _ENOSPC:
            return None
        check(rc, "KeyedCache.prepare_store")
        return pages, [raw[i:i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]

    def complete_store(self, keys: Sequence[Key], ok: bool = True) -> None:
        """The pending keys become ready (ok) or are dropped, their pages freed."""
        self.complete_store_packed(pack_keys(keys), ok)

    def complete_store_packed(self, keys: bytes, ok: bool = True) -> None:
        ok = _a.flag(ok, "KeyedCache.complete_store ok")  # by its truth, "no" or None would decide
        with self._use as h:
            _calls.complete(h, keys, ok)

    def pin(self, keys: Sequence[Key]) -> List[int]:
        """Pins ready keys for a load and returns their pages (NotFound: one is
        absent; Busy: one is pending; nothing pinned then)."""
        return self.pin_packed(pack_keys(keys))

    def pin_packed(self, keys: bytes) -> List[int]:
        with self._use as h:
            rc, pages = _calls.pin(h, keys)
        check(rc, "KeyedCache.pin")
        return pages

    def unpin(self, keys: Sequence[Key]) -> None:
        self.unpin_packed(pack_keys(keys))

    def unpin_packed(self, keys: bytes) -> None:
        with self._use as h:
            check(_calls.unpin(h, keys), "KeyedCache.unpin")

    def touch(self, keys: Sequence[Key], scores: Sequence[int]) -> None:
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        self.touch_packed(pack_keys(keys), pack_scores(scores, len(keys)))

    def touch_packed(self, keys: bytes, scores: bytes) -> None:
        with self._use as h:
            _calls.touch(h, keys, scores)

    # ---- ARC's hooks (policy "arc"; keyed.h): each walks its keys last first ----

    def arc_touch(self, keys: Sequence[Key]) -> None:
        """vLLM's ARC touch: T1 -> T2 (ready keys), T2's most recent; an absent
        key a ghost remembers moves the target."""
        self.arc_touch_packed(pack_keys(keys))

    def arc_touch_packed(self, keys: bytes) -> None:
        with self._use as h:
            check(_calls.arc_touch(h, keys), "KeyedCache.arc_touch", "a cache of policy 'arc' only")

    def arc_missed(self, keys: Sequence[Key]) -> None:
        """vLLM's ARC on_store_miss: keys a ghost remembers move the target."""
        self.arc_missed_packed(pack_keys(keys))

    def arc_missed_packed(self, keys: bytes) -> None:
        with self._use as h:
            check(_calls.arc_missed(h, keys), "KeyedCache.arc_missed", "a cache of policy 'arc' only")

    def arc_finish(self, keys: Sequence[Key], flags: Sequence[int]) -> None:
        """vLLM's ARC on_request_finished: flags[i] ARC_STORED (most recent in
        its list), ARC_REUSED (to T2's most recent) or 0 (nothing)."""
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        if len(flags) != len(keys) or any(f not in (0, ARC_STORED, ARC_REUSED) for f in flags):
            raise ValueError(f"flags: expected one of 0, {ARC_STORED}, {ARC_REUSED} for each of {len(keys)} keys")
        self.arc_finish_packed(pack_keys(keys), bytes(flags))

    def arc_finish_packed(self, keys: bytes, flags: bytes) -> None:
        with self._use as h:
            check(_calls.arc_finish(h, keys, flags), "KeyedCache.arc_finish",
                  "a cache of policy 'arc' only; flags 0, 1 or 2")

    def remove(self, keys: Sequence[Key]) -> int:
        """Removes the ready, unpinned keys among keys and frees their pages
        (absent, pending and pinned keys are skipped); returns how many went.
        For a key whose page was found bad."""
        return self.remove_packed(pack_keys(keys))

    def remove_packed(self, keys: bytes) -> int:
        n = _count(keys, "keys")
        gone = ctypes.c_size_t()
        with self._use as h:
            check(_remove(h, keys, n, ctypes.byref(gone)), "KeyedCache.remove")
        return gone.value

    def reset(self) -> None:
        """Removes every ready, unpinned key (Busy while any is pending or pinned)."""
        with self._use as h:
            check(lib.kvt_keyed_reset(h), "KeyedCache.reset")

    def take_events(self) -> List[Event]:
        out: List[Event] = []
        buf = (KeyedEvent * 256)()
        with self._use as h:
            while True:
                got = lib.kvt_keyed_take_events(h, buf, 256)
                out.extend(Event((e.key.hi, e.key.lo), bool(e.kind), _WHY[e.why] if e.kind else "")
                           for e in buf[:got])
                if got < 256:
                    return out

    def stats(self) -> Dict[str, int]:
        st = KeyedStats(size=ctypes.sizeof(KeyedStats))
        with self._use as h:
            check(lib.kvt_keyed_stats(h, ctypes.byref(st)), "KeyedCache.stats")
        return {name: getattr(st, name) for name, _, _ in _fields.KEYED_STATS}

    def check(self) -> None:
        """Recomputes every invariant; Corrupt (naming the first broken one) if one fails."""
        why = ctypes.c_char_p()
        with self._use as h:
            rc = lib.kvt_keyed_check(h, ctypes.byref(why))
        if rc:
            raise error(rc, "KeyedCache.check", (why.value or b"").decode())


def _count(b: bytes, what: str) -> int:
    """How many keys a packed array holds (the C side reads exactly that many)."""
    if not isinstance(b, bytes):
        raise TypeError(f"{what}: expected packed keys (bytes), not {type(b).__name__}")
    nbytes = memoryview(b).nbytes  # the bytes themselves: a subclass's __len__ may say anything
    if nbytes % KEY_BYTES:
        raise ValueError(f"{what}: {nbytes} bytes is not a whole number of {KEY_BYTES}-byte keys")
    return nbytes // KEY_BYTES


def _check_scores(b: bytes, n: int) -> None:
    """Packed scores: exactly a uint64 per key (the C side reads n of them)."""
    if not isinstance(b, bytes):
        raise TypeError(f"scores: expected packed scores (bytes), not {type(b).__name__}")
    nbytes = memoryview(b).nbytes
    if nbytes != 8 * n:
        raise ValueError(f"scores: {nbytes} bytes for {n} keys (a uint64 per key)")
