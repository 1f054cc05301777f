"""The keyed page cache (keyed.h): host pages found by a 128-bit key, for
engines that name their KV blocks themselves (vLLM's offloading manager,
SGLang's storage keys). A key is a pair of ints ``(hi, lo)``, each below
2**64; a score is an int below 2**64 (smaller goes first when evicting)."""
from __future__ import annotations

import ctypes
import hashlib
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _args as _a
from . import _fields
from ._core import Handle, check, error
from ._lib import Key128, KeyedConfig, KeyedEvent, KeyedStats, lib

__all__ = ["KeyedCache", "KeyedEvent", "LOOKUP", "key_of_bytes"]

LOOKUP = ("miss", "hit", "pending")
_WHY = ("evicted", "failed store", "reset")
_NO_PAGE = (1 << 64) - 1
_ENOSPC = dict(_fields.ERRORS)["ENOSPC"]

Key = Tuple[int, int]


class Event(NamedTuple):
    """A key stored (``removed`` False) or removed, and why ("evicted",
    "failed store", "reset")."""
    key: Key
    removed: bool
    why: str


def key_of_bytes(b: bytes) -> Key:
    """The 128-bit key of vLLM's OffloadKey (a block hash, then its group
    index in 4 big-endian bytes): 96 bits of BLAKE2b over the block hash,
    then the group. Distinct keys collide only as the hash does (2**-96 for
    a pair), whatever the block hashes look like, and the keys of one block
    hash order by group, as their bytes do."""
    if len(b) < 4:
        raise ValueError(f"key: {len(b)} bytes; expected a block hash and a 4-byte group index")
    h = hashlib.blake2b(b[:-4], digest_size=12).digest()
    return int.from_bytes(h[:8], "big"), int.from_bytes(h[8:] + b[-4:], "big")


def _keys(keys: Sequence[Key], what: str = "keys") -> Tuple[ctypes.Array, int]:
    """keys as a C array; checked in bulk (the manager passes thousands a call)."""
    n = len(keys)
    try:
        arr = (Key128 * max(n, 1))(*keys)
        flat = [x for k in keys for x in k]
    except (TypeError, ValueError, RuntimeError):  # ctypes wraps a bad initializer in RuntimeError
        for i, k in enumerate(keys):  # name the culprit
            if not (isinstance(k, tuple) and len(k) == 2):
                raise TypeError(f"{what}[{i}]: expected a key (hi, lo), not {type(k).__name__}") from None
            _a.u64(k[0], f"{what}[{i}] hi"), _a.u64(k[1], f"{what}[{i}] lo")
        raise TypeError(f"{what}: expected a list of keys (hi, lo)") from None
    if len(flat) != 2 * n:
        raise TypeError(f"{what}: every key is a pair (hi, lo)")
    if flat and (min(flat) < 0 or max(flat) > _a.U64_MAX):
        i = next(i for i, (hi, lo) in enumerate(keys) if not (0 <= hi <= _a.U64_MAX and 0 <= lo <= _a.U64_MAX))
        raise ValueError(f"{what}[{i}]: {keys[i]} is out of range (each half 0..2**64-1)")
    return arr, n


def _scores(scores: Sequence[int], n: int) -> ctypes.Array:
    if len(scores) != n:
        raise ValueError(f"scores: {len(scores)} scores for {n} keys")
    if scores and (min(scores) < 0 or max(scores) > _a.U64_MAX):
        raise ValueError(f"scores: out of range (0..2**64-1)")
    return (ctypes.c_uint64 * max(n, 1))(*scores)


class KeyedCache(Handle):
    """``KeyedCache(pages, free_room=0.0, events=False)``: a cache handing out
    host pages [0, pages). Its calls run one at a time (the C object belongs to
    one thread; calls from several threads take turns)."""

    _SERIAL = True

    def __init__(self, pages: int, *, free_room: float = 0.0, events: bool = False) -> None:
        super().__init__()
        cfg = KeyedConfig(size=ctypes.sizeof(KeyedConfig), events=1 if events else 0,
                          pages=_a.integer(pages, "pages", 1, (1 << 32) - 1),
                          free_room=_a.number(free_room, "free_room", 0.0, 1.0))
        if cfg.free_room == 1.0:
            raise ValueError(f"free_room: {free_room!r} is out of range (expected 0 <= free_room < 1)")
        h = ctypes.c_void_p()
        check(lib.kvt_keyed_create(ctypes.byref(h), ctypes.byref(cfg)), "KeyedCache")
        self._own(h.value)
        self.pages = cfg.pages

    def _destroy(self, h: int) -> None:
        lib.kvt_keyed_destroy(h)

    def __enter__(self) -> "KeyedCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def lookup(self, key: Key) -> str:
        """"miss", "hit" (ready) or "pending" (its store is in flight)."""
        (k,), _ = _keys([key], "key")
        with self._use as h:
            return LOOKUP[lib.kvt_keyed_lookup(h, k)]

    def page(self, key: Key) -> Optional[int]:
        """The page of a present key, or None."""
        (k,), _ = _keys([key], "key")
        out = ctypes.c_uint64()
        with self._use as h:
            rc = lib.kvt_keyed_page(h, k, ctypes.byref(out))
        return out.value if rc == 0 else None

    def prepare_store(self, keys: Sequence[Key], scores: Sequence[int], protect: Sequence[Key] = ()
                      ) -> Optional[Tuple[List[Optional[int]], List[Key]]]:
        """Pages for the absent keys (None for keys already present), and the
        keys evicted to make room; None, with nothing changed, when they do
        not fit."""
        karr, n = _keys(keys)
        sarr = _scores(scores, n)
        parr, np_ = _keys(protect, "protect")
        pages = (ctypes.c_uint64 * max(n, 1))()
        cap = n + self.pages
        evicted = (Key128 * max(cap, 1))()
        nev = ctypes.c_size_t()
        with self._use as h:
            rc = lib.kvt_keyed_prepare_store(h, karr, sarr, n, parr, np_, pages, evicted, cap, ctypes.byref(nev))
        if rc == _ENOSPC:
            return None
        check(rc, "KeyedCache.prepare_store")
        return ([None if pages[i] == _NO_PAGE else pages[i] for i in range(n)],
                [(evicted[i].hi, evicted[i].lo) for i in range(nev.value)])

    def complete_store(self, keys: Sequence[Key], ok: bool = True) -> None:
        """The pending keys become ready (ok) or are dropped, their pages freed."""
        karr, n = _keys(keys)
        with self._use as h:
            lib.kvt_keyed_complete_store(h, karr, n, 1 if ok else 0)

    def pin(self, keys: Sequence[Key]) -> List[int]:
        """Pins ready keys for a load and returns their pages (NotFound: one is
        absent; Busy: one is pending; nothing pinned then)."""
        karr, n = _keys(keys)
        pages = (ctypes.c_uint64 * max(n, 1))()
        with self._use as h:
            check(lib.kvt_keyed_pin(h, karr, n, pages), "KeyedCache.pin")
        return list(pages[:n])

    def unpin(self, keys: Sequence[Key]) -> None:
        karr, n = _keys(keys)
        with self._use as h:
            check(lib.kvt_keyed_unpin(h, karr, n), "KeyedCache.unpin")

    def touch(self, keys: Sequence[Key], scores: Sequence[int]) -> None:
        karr, n = _keys(keys)
        sarr = _scores(scores, n)
        with self._use as h:
            lib.kvt_keyed_touch(h, karr, sarr, n)

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
