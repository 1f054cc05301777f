"""kvtier under vLLM's OffloadingConnector: the scheduler-side manager.

vLLM keeps its GPU prefix cache as L1 and asks an OffloadingManager, in the
scheduler process, which blocks the tier below holds, where to store new ones
and what to evict. ``KvtierOffloadingManager`` answers from kvtier's keyed
page cache (``kvtier.keyed``, C): each vLLM block key (its block hash and
group index, vLLM's ``OffloadKey``) owns one page of a host tier, the C side
keeps each key's state (store in flight, ready, pinned by loads), hands out
pages, picks victims and can keep free room ahead of stores.

Eviction order follows vLLM's own LRU (``vllm.v1.kv_offload.cpu.policies.lru``)
exactly, so that with free_room 0 the manager makes the decisions vLLM's
``CPUOffloadingManager(cache_policy="lru")`` makes at the same capacity: a key
is ranked by the request that last used it and its position in that request
(a prefix's tail goes before its head), and a touch outside a request ranks it
newest. The ranks are computed here and handed to the C side as scores (the
request's rank in the high 32 bits, the position below), so eviction, pins and
pages stay in C. ``tests: python/tests/test_vllm.py`` drives both managers with
the same calls and compares every answer.

Cost: the manager must cost the scheduler no more than vLLM's own. A lookup
is one dict probe of a mirror of the C side's key states; the other calls
cross into C once each, with the keys' C keys kept packed (16 bytes each,
joined per call) and scores packed by ``array``, so a call converts nothing
per key (``python -m kvtier.bench_vllm`` measures it beside vLLM's manager;
figures in docs/performance.md).

``KvtierOffloadingSpec`` is what vLLM loads by name
(``"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm"``):
this manager in the scheduler, ``kvtier.vllm_worker.KvtierOffloadingWorker``
in each worker process, and with ``l3`` an L3 store below the host tier (the
manager asks it without blocking; hits are fetched by the load that needs
them; stores are written through). ``KvtierOffloadingConnector`` (from
``kvtier.vllm_connector``, also reachable here) is vLLM's connector with a
path for a load kvtier refuses.

Supported: vLLM 0.33.0 (pinned in python/requirements-dev.txt); the import
fails loudly, naming what changed, when vLLM's base class differs.
``KvtierArcOffloadingManager`` makes the decisions of vLLM's ARC policy instead
(the spec's ``"policy": "arc"``); both take vLLM's store_threshold (a block
stored only once offered that many times) and report vLLM's CPU offloading
metrics (get_stats)."""
from __future__ import annotations

import array
import inspect
import struct
import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

from . import _args as _a
from . import _fields
from ._core import ClosedError, error
from .keyed import ARC_REUSED, ARC_STORED, KeyedCache, unpack_keys
from .store import Store
from .vllm_l3 import ExistsCache, page_hash

try:
    from vllm.v1.kv_offload import base as _vbase
    from vllm.v1.kv_offload.base import (CanonicalKVCaches, LoadStoreSpec, LookupResult, Medium, OffloadingEvent,
                                         OffloadingManager, OffloadingSpec, OffloadingWorker, OffloadKey,
                                         PrepareStoreOutput, ReqContext, RequestOffloadingContext,
                                         ScheduleEndContext, get_offload_group_idx)
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.policies.base import order_request_keys
except ImportError as e:  # pragma: no cover - the suite runs with vLLM installed
    raise ImportError(f"kvtier.vllm needs vLLM 0.33.0's offloading modules ({e}); "
                      "pip install --no-deps vllm==0.33.0 (see docs/python.md)") from e

__all__ = ["KvtierArcOffloadingManager", "KvtierOffloadingConnector", "KvtierOffloadingManager",
           "KvtierOffloadingSpec", "VLLM_VERSION", "check_vllm_interface"]

VLLM_VERSION = "0.33.0"
_ENOENT, _EINVAL = (dict(_fields.ERRORS)[n] for n in ("ENOENT", "EINVAL"))

# What this module implements of vLLM's OffloadingManager, as vLLM 0.33.0
# declares it: a method whose parameters differ is an interface change.
_MANAGER_SIGNATURES = {
    "lookup": ["self", "key", "req_context"],
    "prepare_load": ["self", "keys", "req_context"],
    "touch": ["self", "keys", "req_context"],
    "complete_load": ["self", "keys", "req_context"],
    "prepare_store": ["self", "keys", "req_context"],
    "complete_store": ["self", "keys", "req_context", "success"],
    "on_new_request": ["self", "req_context"],
    "on_request_finished": ["self", "req_context"],
    "take_events": ["self"],
    "reset_cache": ["self"],
}


def method_diffs(cls: type, wanted: Dict[str, List[str]]) -> List[str]:
    """How cls's methods differ from the parameters kvtier implements them
    with (empty: not at all); an abstract method kvtier lacks is a difference."""
    diffs = [f"{cls.__name__}.{n} is abstract in this vLLM and kvtier does not implement it"
             for n in sorted(set(getattr(cls, "__abstractmethods__", ())) - set(wanted))]
    for n, want in wanted.items():
        fn = getattr(cls, n, None)
        if fn is None:
            diffs.append(f"{cls.__name__}.{n} is gone")
            continue
        got = list(inspect.signature(fn).parameters)
        if got != want:
            diffs.append(f"{cls.__name__}.{n}{tuple(got)}: kvtier implements {tuple(want)}")
    return diffs


def check_vllm_interface() -> List[str]:
    """The differences between vLLM's OffloadingManager and what kvtier
    implements (empty: none). Run at import; a test keeps it empty."""
    diffs = method_diffs(OffloadingManager, _MANAGER_SIGNATURES)
    for name in ("LookupResult", "PrepareStoreOutput", "OffloadingEvent", "ReqContext"):
        if not hasattr(_vbase, name):
            diffs.append(f"vllm.v1.kv_offload.base.{name} is gone")
    return diffs


_DIFFS = check_vllm_interface()
if _DIFFS:
    raise ImportError("kvtier.vllm implements vLLM 0.33.0's offloading interface, and this vLLM's differs: "
                      + "; ".join(_DIFFS))

_POS_BIAS = 1 << 31  # a rank's second part, -position .. 0, as an unsigned score: BIAS - position
_RANKS = 1 << 32  # request ranks below this fit a score's high half
_MISS, _HIT, _PENDING = LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING
# Store sizes kept for get_stats between two calls (vLLM's scheduler calls it every step when it logs
# stats; without a call the samples past this many are dropped rather than kept for ever)
_SAMPLES_MAX = 4096
_pack_id = struct.Struct("=QQ").pack  # kvt_key128_t as it lies in memory (kvtier.keyed.pack_keys)


# The manager's calls, refused once it is shut down.
_CALLS = ("on_new_request", "lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store",
          "on_schedule_end", "has_pending_work", "on_request_finished", "take_events", "reset_cache", "forget",
          "get_stats", "stats", "check")


def _shut(cls: str, name: str):
    def refused(*args, **kwargs):
        raise ClosedError(f"{cls}.{name}: the manager")
    return refused


def _rank_error(what: object) -> OverflowError:
    return OverflowError(f"{what} does not fit a score (request rank below 2**32, position 0 .. 2**31-1)")


class KvtierLoadSpec(CPULoadStoreSpec):
    """A load's host pages (``block_ids``), and the ones the worker first
    fetches from the L3 store: ``fetch``, (index into block_ids, page hash)."""

    def __init__(self, block_ids, fetch=()) -> None:
        super().__init__(block_ids)
        self.fetch = list(fetch)


class KvtierStoreSpec(CPULoadStoreSpec):
    """A store's host pages (``block_ids``) and their page hashes in the L3
    store (``hashes``), which the worker writes them through to."""

    def __init__(self, block_ids, hashes=()) -> None:
        super().__init__(block_ids)
        self.hashes = list(hashes)


@dataclass
class _Access:
    """The keys one request has seen, by group, in the order it saw them
    (vLLM's manager also sorts them into inserted and reused keys, which only
    its ARC policy reads)."""
    owner: object
    generation: int
    key_groups: Dict[int, List[OffloadKey]] = field(default_factory=dict)
    seen: Set[OffloadKey] = field(default_factory=set)
    finished: bool = False


@dataclass(eq=False)  # by identity: the manager keeps the ones it gave out in a WeakSet
class _Rank:
    owner: object
    generation: int
    rank: int


class KvtierOffloadingManager(OffloadingManager):
    """``KvtierOffloadingManager(num_blocks, enable_events=False, free_room=0.0)``:
    a host tier of num_blocks blocks. free_room > 0 evicts ahead, down to
    that fraction free, so that later stores do not wait on an eviction (the
    decisions then differ from vLLM's manager, which evicts only on demand).

    Like vLLM's own manager it is called by one thread, the scheduler's: the
    Python mirrors below are not locked (the C cache under them is)."""

    medium = Medium.CPU

    def __init__(self, num_blocks: int, enable_events: bool = False, free_room: float = 0.0,
                 l3: Optional[Store] = None, store_threshold: int = 1, max_tracker_size: int = 64_000) -> None:
        if not isinstance(store_threshold, int) or store_threshold < 0:
            raise ValueError(f"store_threshold: {store_threshold!r} (expected an integer >= 0; below 2: every block stored)")
        if not isinstance(max_tracker_size, int) or max_tracker_size < 1:
            raise ValueError(f"max_tracker_size: {max_tracker_size!r} (expected an integer >= 1)")
        self._blocks, self._free_room = num_blocks, free_room
        # vLLM's store_threshold: a block is stored only once offered that many times, counted in
        # an LRU table of at most max_tracker_size keys (vLLM's CPUOffloadingManager, the same rules)
        self._threshold, self._tracker_max = store_threshold, max_tracker_size
        self._offers: Optional[OrderedDict] = OrderedDict() if store_threshold >= 2 else None
        self._skipped = 0
        # vLLM's metrics (get_stats): each store's size since the last call, the skips reported
        self._alloc_sizes: List[int] = []
        self._skipped_reported = 0
        self._cache = self._new_cache()
        self.events: Optional[List[OffloadingEvent]] = [] if enable_events else None
        # Mirrors of the C side, so that lookups and rank comparisons cost no call:
        self._look: Dict[OffloadKey, LookupResult] = {}  # the keys present: HIT, or HIT_PENDING (store in flight)
        self._scores: Dict[OffloadKey, int] = {}  # ... their scores (vLLM's LRU rank, packed)
        self._ids: Dict[OffloadKey, bytes] = {}  # ... the C side's key of each, packed (16 bytes)
        self._names: Dict[bytes, OffloadKey] = {}  # ... and back
        self._spill = 0  # the last tag given to a key whose plain C key was taken
        self._next_rank = 0
        self._generation = 0
        self._ranks: "weakref.WeakSet[_Rank]" = weakref.WeakSet()  # the requests' ranks given out (_renumber)
        # Below the host tier, an L3 store (the spec's "l3"): a key the host tier lacks is asked of
        # the store without blocking (RETRY meanwhile); a hit reserves a host page (the key pending
        # in C), which the request's load fills from the store on its way to the GPU.
        self._l3_store = l3
        self._l3: Optional[ExistsCache] = ExistsCache(l3) if l3 is not None else None
        self._promoting: Dict[OffloadKey, str] = {}  # a reserved page, not yet loaded: key -> the request
        self._fetching: Set[OffloadKey] = set()  # ... whose load (store -> host -> GPU) is in flight
        self._host_hits: Dict[str, Set[OffloadKey]] = {}  # request -> host keys it was told HIT (kept)
        if l3 is not None:
            self.lookup = self._lookup_l3  # type: ignore[method-assign]
            self.prepare_load = self._prepare_load_l3  # type: ignore[method-assign]
            self.complete_load = self._complete_load_l3  # type: ignore[method-assign]

    _SCORED = True  # a score mirrored for each key (vLLM's LRU rank); the ARC manager's order has none

    def _new_cache(self) -> KeyedCache:
        return KeyedCache(self._blocks, free_room=self._free_room)

    def _drop(self, keys: Iterable[OffloadKey]) -> None:
        """The mirrors forget keys the C cache no longer holds."""
        look, ids, names = self._look, self._ids, self._names
        scores = self._scores if self._SCORED else None
        for k in keys:
            del look[k], names[ids.pop(k)]
            if scores is not None:
                del scores[k]

    # ---- C keys ----------------------------------------------------------------

    def _new_ids(self, keys: List[OffloadKey]) -> List[bytes]:
        """A C key for each new key, entered in _names: the block hash's first 8
        bytes, then the group index, then a tag, 0 unless that key is taken.
        Distinct by construction; equal scores go to the smaller C key, and this
        one orders as vLLM's key bytes do unless two block hashes share their
        first 8 bytes (the keys of one block hash order by group, as in vLLM)."""
        names, out = self._names, []
        for k in keys:
            hi, lo = int.from_bytes(k[:8], "big"), int.from_bytes(k[-4:], "big") << 32
            kid = _pack_id(hi, lo)
            while kid in names:  # a tag from a counter: taken again only after 2**32 - 1 others
                self._spill = self._spill % 0xFFFFFFFF + 1
                kid = _pack_id(hi, lo | self._spill)
            names[kid] = k
            out.append(kid)
        return out

    def _packed(self, keys: Iterable[OffloadKey], code: int, what: str) -> bytes:
        """The C keys of present keys, packed; the error code when one is absent."""
        try:
            return b"".join(map(self._ids.__getitem__, keys))
        except KeyError as e:
            raise error(code, f"KvtierOffloadingManager.{what}", f"{e.args[0]!r} is not offloaded") from None

    # ---- ranks (vLLM's LRU order) ----------------------------------------------

    def _request_rank(self, ctx: ReqContext):
        """The request's rank, and its new rank state to commit (None: it has
        one); nothing changed yet."""
        st = ctx.get_state(_Rank)
        if st is None or st.owner is not self or st.generation != self._generation:
            self._room_for_ranks(1)
            st = _Rank(self, self._generation, self._next_rank + 1)
            self._ranks.add(st)
            return st.rank, st
        return st.rank, None

    def _room_for_ranks(self, n: int) -> None:
        """Room for n more ranks below 2**32: when the counter would pass it,
        the ranks in use are numbered again from 1, in their order (only the
        order decides), the keys' scores and the requests' ranks with them."""
        if self._next_rank + n < _RANKS:
            return
        live = [r for r in self._ranks if r.owner is self and r.generation == self._generation]
        used = sorted({s >> 32 for s in self._scores.values()} - {0} | {r.rank for r in live})
        new = dict(zip(used, range(1, len(used) + 1)))
        new[0] = 0  # ARC's scores, and none
        if self._scores:
            keys = list(self._scores)
            self._rescore(keys, [(new[s >> 32] << 32) | (s & 0xFFFFFFFF) for s in self._scores.values()])
        for r in live:
            r.rank = new[r.rank]
        self._next_rank = len(used)
        if self._next_rank + n >= _RANKS:
            raise _rank_error(f"rank {self._next_rank + n}")

    def _store_scores(self, keys: List[OffloadKey], ctx: ReqContext):
        """The scores new keys get, in vLLM's order: a key with a position takes
        the request's rank (given to the request on first need), one without
        the next rank. Returns them with the rank counter after them and the
        request's new rank state (None: it had one), committed only when the
        store goes ahead."""
        self._room_for_ranks(len(keys) + 1)
        nxt = self._next_rank
        st = ctx.get_state(_Rank)
        new_rank = None
        if st is None or st.owner is not self or st.generation != self._generation:
            st = None
        getpos = ctx.get_offload_key_position
        scores = []
        for k in keys:
            pos = getpos(k)
            if pos is None:
                nxt += 1
                scores.append((nxt << 32) | _POS_BIAS)
                continue
            if st is None:
                nxt += 1
                st = new_rank = _Rank(self, self._generation, nxt)
                self._ranks.add(st)
            if not 0 <= pos < _POS_BIAS:
                raise _rank_error(f"position {pos}")
            scores.append((st.rank << 32) | (_POS_BIAS - pos))
        if nxt >= _RANKS:
            raise _rank_error(f"rank {nxt}")
        return scores, nxt, new_rank

    def _rescore(self, keys: List[OffloadKey], scores) -> None:
        self._scores.update(zip(keys, scores))
        self._cache.touch_packed(b"".join(map(self._ids.__getitem__, keys)), array.array("Q", scores).tobytes())

    def _touch_newest(self, keys: Iterable[OffloadKey]) -> None:
        """Each present key ranked newest, in the given order."""
        ids = self._ids
        moved = [k for k in keys if k in ids]
        if not moved:
            return
        self._room_for_ranks(len(moved))
        first, end = self._next_rank + 1, self._next_rank + 1 + len(moved)
        if end > _RANKS:
            raise _rank_error(f"rank {end - 1}")
        self._next_rank = end - 1
        self._rescore(moved, range((first << 32) | _POS_BIAS, (end << 32) | _POS_BIAS, 1 << 32))

    def _on_request_access(self, keys: List[OffloadKey], ctx: ReqContext) -> None:
        """The request gets its rank (on first need) and moves up each present
        key it has a position for; raises before it changes anything."""
        rank, fresh = self._request_rank(ctx)
        rank <<= 32
        scores, getpos = self._scores, ctx.get_offload_key_position
        moved, new = [], []
        for k in keys:
            pos = getpos(k)
            if pos is None:
                continue
            s = scores.get(k)
            if s is None:
                continue
            if not 0 <= pos < _POS_BIAS:
                raise _rank_error(f"position {pos}")
            ns = rank | (_POS_BIAS - pos)
            if s < ns:  # a request's use only moves a key up (vLLM's rank comparison)
                moved.append(k)
                new.append(ns)
        if fresh is not None:
            self._next_rank = fresh.rank
            ctx.set_state(fresh)
        if moved:
            self._rescore(moved, new)

    # ---- what each request saw --------------------------------------------------

    def _state(self, ctx: ReqContext, cls):
        """The request's state of class cls kept by this manager since its
        last reset: a fresh one when it has none, or an older one."""
        st = ctx.get_state(cls)
        if st is None or st.owner is not self or st.generation != self._generation:
            st = cls(self, self._generation)
            ctx.set_state(st)
        return st

    def _access(self, ctx: ReqContext) -> _Access:
        return self._state(ctx, _Access)

    def _check_positions(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        """Raises before a call changes anything when a key's position in the
        request does not fit a score (the later steps would raise half-way)."""
        for pos in map(ctx.get_offload_key_position, keys):
            if pos is not None and not (0 <= pos < _POS_BIAS and type(pos) is int):
                raise _rank_error(f"position {pos!r}")

    def _may_record(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        """Raises, before a call pins or stores anything, what _record would
        raise after: a finished request seeing new keys (a context that is no
        ReqContext raises here too)."""
        st = self._access(ctx)
        if st.finished and any(k not in st.seen for k in keys):
            raise RuntimeError(f"request {ctx.req_id!r} has finished: it sees no new keys (a load or store after "
                               "on_request_finished)")

    def _record(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        st = self._access(ctx)
        seen = st.seen
        new = list(dict.fromkeys(k for k in keys if k not in seen))
        if not new:
            return
        assert not st.finished, "new keys seen after the request finished"
        self._on_request_access(new, ctx)  # raises (ranks used up) before it changes anything
        groups = st.key_groups
        for k in new:
            groups.setdefault(get_offload_group_idx(k), []).append(k)
        seen.update(new)

    # ---- vLLM's store threshold ---------------------------------------------------

    def _count_offers(self, keys: List[OffloadKey]) -> None:
        """One more offer of each key: a counted key moves to the table's
        recent end; a new one enters with 1, making room by dropping the
        least recent key not offered in this call (none: it is not counted)."""
        offers = self._offers
        again = set()
        for k in keys:
            if k in offers:
                offers.move_to_end(k)
                offers[k] += 1
                again.add(k)
        droppable = len(offers) - len(again)
        for k in keys:
            if k in offers:
                continue
            if len(offers) >= self._tracker_max:
                if droppable == 0:
                    continue
                offers.popitem(last=False)
                droppable -= 1
            offers[k] = 1

    def _offered_enough(self, to_store: List[OffloadKey]) -> List[OffloadKey]:
        """The new keys offered at least store_threshold times; the others skipped."""
        kept = [k for k in to_store if self._offers.get(k, 0) >= self._threshold]
        self._skipped += len(to_store) - len(kept)
        return kept

    # ---- events ---------------------------------------------------------------

    def _emit(self, keys: List[OffloadKey], removed: bool, metadata_only: bool = False) -> None:
        if keys and self.events is not None:
            self.events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=removed,
                                               metadata_only=metadata_only))

    # ---- OffloadingManager -----------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._access(req_context)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return self._look.get(key, _MISS)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        self._check_positions(keys, req_context)  # (a pin undone would still count a load)
        self._may_record(keys, req_context)
        pages = self._cache.pin_packed(self._packed(keys, _ENOENT, "prepare_load"))
        self._record(keys, req_context)
        return CPULoadStoreSpec(pages)

    _prepare_load_host = prepare_load

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._touch_newest(reversed(list(keys)))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._cache.unpin_packed(self._packed(keys, _EINVAL, "complete_load"))

    _complete_load_host = complete_load

    def _take_pages(self, keys: List[OffloadKey], req_context: ReqContext, protect: bytes):
        """Pages for new keys (pending in C), evicting as vLLM's LRU would and
        never a key of protect (packed C keys): (pages, evicted keys), or None
        with nothing changed when they do not fit."""
        look, ids, names = self._look, self._ids, self._names
        scores, next_rank, new_rank = self._store_scores(keys, req_context)
        new_ids = self._new_ids(keys)
        out = None
        try:
            out = self._cache.prepare_store_packed(b"".join(new_ids), array.array("Q", scores).tobytes(), protect)
        finally:
            if out is None:
                for kid in new_ids:
                    del names[kid]
        if out is None:
            return None
        self._next_rank = next_rank
        if new_rank is not None:
            req_context.set_state(new_rank)
        pages, evicted_ids = out
        evicted = [names.pop(i) for i in evicted_ids]
        scores_of = self._scores
        for k in evicted:
            del look[k], scores_of[k], ids[k]
        self._emit(evicted, removed=True)
        look.update(dict.fromkeys(keys, _PENDING))
        scores_of.update(zip(keys, scores))
        ids.update(zip(keys, new_ids))
        return pages, evicted

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        look, ids = self._look, self._ids
        if self._offers is not None:
            keys = list(keys)
            self._check_positions(keys, req_context)  # before the offers are counted
            self._count_offers(keys)
        to_store, recorded, protect = [], [], []
        for k in keys:
            state = look.get(k)
            if state is None:
                to_store.append(k)
                recorded.append(k)
            elif state is _HIT:
                recorded.append(k)
                protect.append(ids[k])  # only ready keys can be evicted: they are the ones to protect
        if self._offers is not None and to_store:
            kept = self._offered_enough(to_store)
            if len(kept) < len(to_store):  # a skipped key is not recorded as the request's
                skipped = set(to_store) - set(kept)
                recorded = [k for k in recorded if k not in skipped]
                to_store = kept
        # (vLLM's LRU takes a store miss as a touch of keys that are absent: it changes nothing)
        if self._offers is None:
            self._check_positions(to_store, req_context)  # the new keys' (_record checks the present ones')
        self._record(recorded, req_context)
        if to_store and len(self._alloc_sizes) < _SAMPLES_MAX:
            self._alloc_sizes.append(len(to_store))
        if not to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=CPULoadStoreSpec([]), evicted_keys=[])
        if len(to_store) > 1:  # a key twice in one call is stored once
            to_store = list(dict.fromkeys(to_store))
        got = self._take_pages(to_store, req_context, b"".join(protect))
        if got is None:  # refused or failed: nothing changed, as in vLLM's manager (no rank was spent)
            return None
        pages, evicted = got
        if self._l3 is not None:  # written through to the L3 store by the worker
            return PrepareStoreOutput(keys_to_store=to_store, store_spec=KvtierStoreSpec(
                pages, [page_hash(k) for k in to_store]), evicted_keys=evicted)
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=CPULoadStoreSpec(pages), evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        look, ids = self._look, self._ids
        done = [k for k in dict.fromkeys(keys) if look.get(k) is _PENDING]
        if self._l3 is not None:  # a page reserved for an L3 hit, or being fetched, is no store's to complete
            done = [k for k in done if k not in self._promoting and k not in self._fetching]
        self._cache.complete_store_packed(b"".join(map(ids.__getitem__, done)), ok=success)
        if success:
            look.update(dict.fromkeys(done, _HIT))
            self._emit(done, removed=False)
            return
        self._drop(done)
        self._emit(done, removed=True, metadata_only=True)

    # ---- the L3 store below (the spec's "l3") ----------------------------------------

    def _lookup_l3(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        state = self._look.get(key)
        rid = req_context.req_id
        if state is _HIT:
            self._host_hits.setdefault(rid, set()).add(key)  # not evicted for this request's own L3 hits
            return _HIT
        if state is not None:  # pending: a store in flight, or a page reserved for an L3 hit
            return _HIT if self._promoting.get(key) == rid else _PENDING
        for r in self._l3_store.poll(0.0):
            self._l3.take(r)
        known = self._l3.lookup(key, rid)
        if known is None:
            return LookupResult.RETRY
        if not known or not self._reserve(key, req_context):
            return _MISS
        return _HIT

    def _reserve(self, key: OffloadKey, req_context: ReqContext) -> bool:
        """A host page for an L3 hit, pending until the request's load fills it
        (as vLLM's tiering takes a primary page for a promotion); False when
        none is free without evicting what the request was told it holds."""
        rid = req_context.req_id
        held = [k for k in self._host_hits.get(rid, ()) if self._look.get(k) is _HIT]
        if self._take_pages([key], req_context, b"".join(map(self._ids.__getitem__, held))) is None:
            return False
        self._promoting[key] = rid
        return True

    def _prepare_load_l3(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """The request's load, its reserved pages fetched on the way; the pages
        it reserved and does not load go back at once (vLLM looks up more than
        it loads: another request asking for such a key would wait on
        HIT_PENDING until this one finished)."""
        keys = list(keys)
        rid = req_context.req_id
        fetch = [i for i, k in enumerate(keys) if self._promoting.get(k) == rid]
        if not fetch:
            spec = self._prepare_load_host(keys, req_context)
            self._unreserve(rid)
            return spec
        fetched = {keys[i] for i in fetch}
        host = [k for k in keys if k not in fetched]
        self._check_positions(keys, req_context)
        self._may_record(keys, req_context)
        host_pages = iter(self._cache.pin_packed(self._packed(host, _ENOENT, "prepare_load")))
        pages = [self._cache.page(unpack_keys(self._ids[k])[0]) if k in fetched else next(host_pages) for k in keys]
        for k in fetched:
            del self._promoting[k]
        self._fetching |= fetched
        self._record(keys, req_context)
        self._unreserve(rid)
        return KvtierLoadSpec(pages, [(i, page_hash(keys[i])) for i in fetch])

    def _complete_load_l3(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        keys = list(keys)
        fetched = [k for k in keys if k in self._fetching]
        if not fetched:
            return self._complete_load_host(keys, req_context)
        self._complete_load_host([k for k in keys if k not in self._fetching], req_context)
        self._fetching.difference_update(fetched)
        self._cache.complete_store_packed(b"".join(map(self._ids.__getitem__, fetched)), ok=True)
        self._look.update(dict.fromkeys(fetched, _HIT))
        self._emit(fetched, removed=False)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._l3 is not None:
            self._l3.flush()
            for r in self._l3_store.poll(0.0):
                self._l3.take(r)

    def has_pending_work(self) -> bool:
        return self._l3 is not None and self._l3.pending()

    def _unreserve(self, rid: str) -> None:
        """The pages reserved for request rid and not loaded go back."""
        mine = [k for k, r in self._promoting.items() if r == rid]
        if mine:
            self._cache.complete_store_packed(b"".join(map(self._ids.__getitem__, mine)), ok=False)
            for k in mine:
                del self._promoting[k], self._look[k], self._scores[k]
                del self._names[self._ids.pop(k)]

    def _release(self, rid: str) -> None:
        """A finished request's reserved pages it never loaded go back."""
        self._unreserve(rid)
        self._host_hits.pop(rid, None)
        self._l3.finish(rid)

    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._l3 is not None:
            self._release(req_context.req_id)
        st = req_context.get_state(_Access)
        if st is None or st.owner is not self or st.generation != self._generation or st.finished:
            return
        st.finished = True
        groups = []
        for g in sorted(st.key_groups):
            ks = st.key_groups[g]
            pos = {k: p for k in ks if (p := req_context.get_offload_key_position(k)) is not None}
            if len(pos) == len(ks):
                ks = sorted(ks, key=pos.__getitem__)
            groups.append(tuple(ks))
        self._request_done(tuple(groups), req_context)

    def _request_done(self, groups, req_context: ReqContext) -> None:
        """A finished request's keys, by group in prefix order: each ranked
        newest, head last (vLLM's LRU)."""
        self._touch_newest(reversed(order_request_keys(groups, req_context)))

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return
        events, self.events = self.events, []
        for ev in events:
            if ev.metadata_only:  # a key a later store brought back is not removed
                keys = [k for k in ev.keys if k not in self._look]
                if not keys:
                    continue
                ev = OffloadingEvent(keys=keys, medium=ev.medium, removed=ev.removed, metadata_only=True)
            yield ev

    def reset_cache(self) -> None:
        """Forgets every block, in flight or pinned included (vLLM's scheduler
        completes no job from before a reset)."""
        fresh = self._new_cache()  # first: a failure leaves the old one whole
        self._cache.close()
        self._cache = fresh
        for d in (self._look, self._scores, self._ids, self._names):
            d.clear()
        self._spill = 0
        self._next_rank = 0
        self._generation += 1
        if self._l3 is not None:
            self._promoting.clear()
            self._fetching.clear()
            self._host_hits.clear()
            self._l3.clear()

    def shutdown(self) -> None:
        """Frees the host tier's cache (and closes the L3 store); every call
        after it but shutdown raises ClosedError."""
        self._cache.close()
        if self._l3_store is not None:
            self._l3_store.close()
        for name in _CALLS:  # on the instance: the calls themselves check nothing, at no cost
            setattr(self, name, _shut(type(self).__name__, name))

    # ---- kvtier's own -------------------------------------------------------------

    def forget(self, keys: Iterable[OffloadKey]) -> List[OffloadKey]:
        """Drops the ready, unpinned keys among keys (a worker found their pages
        bad); absent, pending and pinned ones stay as they are. Returns the keys
        dropped, announced as removed events. With an L3 store, the keys are
        also missing there for the requests that asked (a bad page may have
        come from it): they are not fetched again for them."""
        look = self._look
        keys = list(dict.fromkeys(keys))
        if self._l3 is not None:
            for k in keys:
                self._l3.set(k, False)
        gone = [k for k in keys if look.get(k) is _HIT]
        if not gone:
            return []
        if self._cache.remove_packed(b"".join(map(self._ids.__getitem__, gone))) != len(gone):
            gone = [k for k in gone if self._cache.page(unpack_keys(self._ids[k])[0]) is None]  # pinned ones stay
        self._drop(gone)
        self._emit(gone, removed=True)
        return gone

    def get_stats(self):
        """vLLM's CPU offloading metrics since the last call, computed as
        vLLM's CPUOffloadingManager computes them: the share of blocks held by
        transfers (stores in flight, loads), each store's size, and with a
        store threshold the stores skipped."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
        from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics as M
        st = self._cache.stats()
        out = OffloadingConnectorStats()
        usage = (st["pending"] + st["pinned"]) / self._blocks
        out.set_gauge(M.CPU_CACHE_USAGE_PERC, usage)
        for n in self._alloc_sizes:
            out.observe_histogram(M.CPU_ALLOCATION_SIZE, n)
        self._alloc_sizes.clear()
        write = st["pending"] / self._blocks
        out.set_gauge(M.CPU_CACHE_WRITE_USAGE_PERC, write)
        out.set_gauge(M.CPU_CACHE_READ_USAGE_PERC, max(usage - write, 0.0))
        if self._threshold >= 2:
            out.increase_counter(M.STORES_SKIPPED, self._skipped - self._skipped_reported)
            self._skipped_reported = self._skipped
        return out

    def stats(self) -> Dict[str, int]:
        """The keyed cache's counters and gauges (kvtier.keyed), and
        stores_skipped: new keys not stored for the store threshold."""
        st = self._cache.stats()
        st["stores_skipped"] = self._skipped
        return st

    def check(self) -> None:
        """Every invariant of the C side, and the keys this side knows against it."""
        self._cache.check()
        st = self._cache.stats()
        pending = [k for k, v in self._look.items() if v is _PENDING]
        scored = len(self._scores) if self._SCORED else len(self._look)
        mine = (len(self._look), scored, len(self._ids), len(self._names), len(pending))
        if mine != (st["keys"],) * 4 + (st["pending"],):
            raise AssertionError(f"keys present, scored, ids, names, pending here {mine}; in the cache "
                                 f"{st['keys']} keys, {st['pending']} pending")
        for k in (*self._promoting, *self._fetching):
            if self._look.get(k) is not _PENDING:
                raise AssertionError(f"{k!r} is reserved for an L3 load and not pending")
        for k, kid in self._ids.items():
            if self._names.get(kid) is not k or (self._SCORED and k not in self._scores):
                raise AssertionError(f"{k!r}: its C key does not name it back, or it has no score")
            want = "pending" if self._look.get(k) is _PENDING else "hit"
            if self._cache.lookup(unpack_keys(kid)[0]) != want:
                raise AssertionError(f"{k!r} is {want} here, not in the cache")


@dataclass
class _ArcSeen:
    """What vLLM's manager sorts one request's keys into for its ARC policy:
    the keys it inserted, the ready keys it reused, its store misses."""
    owner: object
    generation: int
    inserted: Set[OffloadKey] = field(default_factory=set)
    reused: Set[OffloadKey] = field(default_factory=set)
    store_miss: Set[OffloadKey] = field(default_factory=set)


_U64 = (1 << 64) - 1


class KvtierArcOffloadingManager(KvtierOffloadingManager):
    """``KvtierArcOffloadingManager(num_blocks, enable_events=False)``: the
    decisions of vLLM's ``CPUOffloadingManager(cache_policy="arc")``
    (``vllm.v1.kv_offload.cpu.policies.arc``) over kvtier's keyed cache.

    The order is the keyed cache's ARC (keyed.h, policy "arc"): T1, T2,
    their ghosts and the target live in C, which picks the victims, as
    vLLM's policy does, inside prepare_store. This side sorts a request's
    keys into what vLLM's manager tells its policy (the keys it inserted,
    the ready keys it reused, its store misses), as the hooks' flags. No
    free room (an eviction ahead of demand would not be ARC's), and no L3
    store below (its reservations are ranked by the LRU order).

    C keys: a key's Python hash (64 bits; a tag in the low word when that
    one is taken), not its bytes as the LRU manager's: the ghosts remember
    an evicted key by its C key, which must come out the same when the key
    returns, and two block hashes may share their first bytes. (vLLM's key
    order breaks no tie here: the C side's places are all distinct.)"""

    _SCORED = False

    def __init__(self, num_blocks: int, enable_events: bool = False, store_threshold: int = 1,
                 max_tracker_size: int = 64_000) -> None:
        super().__init__(num_blocks, enable_events=enable_events, store_threshold=store_threshold,
                         max_tracker_size=max_tracker_size)

    def _new_cache(self) -> KeyedCache:
        return KeyedCache(self._blocks, policy="arc")

    def _new_ids(self, keys: List[OffloadKey]) -> List[bytes]:
        names, out = self._names, []
        for k in keys:
            h = hash(k) & _U64
            kid = _pack_id(h, 0)
            while kid in names:  # a tag from a counter, as the LRU manager's
                self._spill = self._spill % 0xFFFFFFFF + 1
                kid = _pack_id(h, self._spill)
            names[kid] = k
            out.append(kid)
        return out

    def _cids(self, keys: Iterable[OffloadKey]) -> bytes:
        """Packed C keys: a present key's own, an absent one's untagged (what a
        ghost remembers it by)."""
        get = self._ids.get
        return b"".join([get(k) or _pack_id(hash(k) & _U64, 0) for k in keys])

    def _seen(self, ctx: ReqContext) -> _ArcSeen:
        return self._state(ctx, _ArcSeen)

    def _on_request_access(self, keys: List[OffloadKey], ctx: ReqContext) -> None:
        pass  # (ARC learns at a request's end, not at first sight)

    def _check_positions(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        pass  # (ARC orders by its lists: a position is never part of a score)

    # ---- OffloadingManager -------------------------------------------------------------

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        seen = self._seen(req_context)  # first: a context that is none raises before anything is pinned
        spec = super().prepare_load(keys, req_context)
        seen.reused.update(k for k in keys if k not in seen.inserted)
        return spec

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._cache.arc_touch_packed(self._cids(keys))

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        look, ids, names = self._look, self._ids, self._names
        if self._offers is not None:
            self._count_offers(keys)
        to_store, ready, recorded = [], [], []
        for k in keys:
            state = look.get(k)
            if state is None:
                to_store.append(k)
                recorded.append(k)
            elif state is _HIT:
                ready.append(k)
                recorded.append(k)
        if self._offers is not None and to_store:
            kept = self._offered_enough(to_store)
            if len(kept) < len(to_store):  # a skipped key is not recorded as the request's
                skipped = set(to_store) - set(kept)
                recorded = [k for k in recorded if k not in skipped]
                to_store = kept
        seen = self._seen(req_context)
        missed = seen.store_miss
        misses = [k for k in to_store if k not in missed]
        if misses:  # ARC learns from a ghost before the store takes the key out of it
            self._cache.arc_missed_packed(self._cids(misses))
            missed.update(misses)
        self._record(recorded, req_context)  # (raises for a finished request, before a sample is kept: vLLM's order)
        if to_store and len(self._alloc_sizes) < _SAMPLES_MAX:
            self._alloc_sizes.append(len(to_store))
        if ready:
            seen.reused.update(k for k in ready if k not in seen.inserted)
        if not to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=CPULoadStoreSpec([]), evicted_keys=[])
        if len(to_store) > 1:
            to_store = list(dict.fromkeys(to_store))
        new_ids = self._new_ids(to_store)
        out = None
        try:  # the call's ready keys protected: only ready keys can be evicted
            out = self._cache.prepare_store_packed(b"".join(new_ids), b"", b"".join(map(ids.__getitem__, ready)))
        finally:
            if out is None:
                for kid in new_ids:
                    del names[kid]
        if out is None:  # refused: nothing changed, as in vLLM's manager
            return None
        pages, evicted_ids = out
        evicted = [names.pop(i) for i in evicted_ids]
        for k in evicted:
            del look[k], ids[k]
        self._emit(evicted, removed=True)
        look.update(dict.fromkeys(to_store, _PENDING))
        ids.update(zip(to_store, new_ids))
        seen.inserted.update(to_store)
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=CPULoadStoreSpec(pages), evicted_keys=evicted)

    def _request_done(self, groups, req_context: ReqContext) -> None:
        seen = self._seen(req_context)
        reused, inserted, ids = seen.reused, seen.inserted, self._ids
        kids, flags = [], bytearray()
        for k in order_request_keys(groups, req_context):
            kid = ids.get(k)
            if kid is not None and (k in reused or k in inserted):
                kids.append(kid)
                flags.append(ARC_REUSED if k in reused else ARC_STORED)  # a store alone is not a use
        if kids:
            self._cache.arc_finish_packed(b"".join(kids), bytes(flags))


# The options come from JSON (--kv-transfer-config) or from Python: a whole number may be written
# 64 or 6.4e10 or "64"; a fraction, a bool, null or anything else is refused, naming the option.
def _count_option(x: dict, name: str, default: int, lo: int, hi: Optional[int] = None) -> int:
    return _a.option_count(x, name, default, lo, hi, "kvtier")


def _fraction_option(x: dict, name: str) -> float:
    v = x.get(name, 0.0)
    try:
        f = float(v) if not isinstance(v, bool) and isinstance(v, (int, float, str)) else None
    except ValueError:
        f = None
    if f is None or not 0.0 <= f < 1.0:
        raise ValueError(f"kvtier: {name}: {v!r} (expected a number, 0 <= {name} < 1)")
    return f


def _flag_option(x: dict, name: str, default: bool) -> bool:
    v = x.get(name, default)
    on = _a.option_flag(v)
    if on is None:
        raise ValueError(f"kvtier: {name}: {v!r} (expected true/false, 1/0, yes/no or on/off)")
    return on


# kv_connector_extra_config keys the spec reads, and vLLM's own ones it passes over; another key
# close to one of kvtier's is taken for a misspelling of it and refused.
_OPTIONS = ("host_bytes", "cpu_bytes_to_use", "num_chunks", "policy", "eviction_policy", "l2_free_room", "l3",
            "l3_write_policy", "l3_threads", "l3_ns", "threads", "checksum", "store_threshold", "max_tracker_size")
_VLLM_OPTIONS = ("spec_name", "spec_module_path", "block_size", "blocks_per_chunk", "canonical_layout",
                 "sync_load_budget_bytes", "self_describing_kv_events", "offload_prompt_only")


def _check_option_names(x: dict) -> None:
    import difflib
    for k in x:
        if k in _OPTIONS or k in _VLLM_OPTIONS:
            continue
        near = difflib.get_close_matches(str(k), _OPTIONS, n=1, cutoff=0.8)
        if near:
            raise ValueError(f"kvtier: unknown option {k!r}: did you mean {near[0]!r}? (kvtier's: {', '.join(_OPTIONS)})")


class KvtierOffloadingSpec(OffloadingSpec):
    """vLLM's OffloadingSpec over kvtier. Options (``kv_connector_extra_config``):

    ``host_bytes``     host memory for offloaded blocks, all workers together
                       (vLLM's ``cpu_bytes_to_use`` is read when it is absent);
    ``num_chunks``     instead of host_bytes, the host tier's chunks, the same
                       in every process (pipeline stages that hold different
                       KV per block: host_bytes gives each its own count, and
                       the scheduler hands out stage 0's);
    ``policy``         eviction order: ``lru`` (vLLM's LRU, the default) or
                       ``arc`` (vLLM's ARC; no free room, no L3); vLLM's name
                       for it, ``eviction_policy``, is read too;
    ``l2_free_room``   fraction of the host tier kept free ahead of stores (0);
    ``threads``        copy threads per worker (1);
    ``checksum``       per-page checksums, a corrupt page never loaded (true);
    ``l3``             an L3 store below the host tier, by URL as ``kvtier replay
                       --l3`` takes it (dir:PATH, redis://H:P, redis-cluster://...);
                       every instance pointed at it reuses every other's blocks;
    ``l3_write_policy`` ``write_through`` (the only one: a block goes to the
                       store when its host store completes);
    ``l3_threads``     store threads per process (2); ``l3_ns`` a namespace in
                       the store ("default");
    ``store_threshold`` vLLM's: a block is stored only once offered this many
                       times (0 or 1: every block), counted in a table of
                       ``max_tracker_size`` keys (64000), as vLLM's CPU spec does."""

    @classmethod
    def build_metric_definitions(cls, extra_config):
        """vLLM's CPU offloading metrics: the managers report the same ones (get_stats)."""
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
        return CPUOffloadingSpec.build_metric_definitions(extra_config)

    def __init__(self, config) -> None:
        super().__init__(config)
        x = self.extra_config
        _check_option_names(x)
        sized = [k for k in ("host_bytes", "cpu_bytes_to_use", "num_chunks") if k in x]
        if not sized:
            raise ValueError("kvtier: host_bytes: required (the host memory for offloaded blocks, in bytes; "
                             "vLLM's cpu_bytes_to_use is read when it is absent), or num_chunks")
        if "num_chunks" in x and len(sized) > 1:
            raise ValueError(f"kvtier: num_chunks and {sized[0]}: give one (num_chunks fixes the host tier's size "
                             "in chunks, host_bytes in bytes)")
        host = _count_option(x, sized[0], 0, 1)
        self.policy = x.get("policy", x.get("eviction_policy", "lru"))  # (vLLM's CPU spec calls it eviction_policy)
        if "policy" in x and "eviction_policy" in x and x["policy"] != x["eviction_policy"]:
            raise ValueError(f"kvtier: policy {x['policy']!r} and eviction_policy {x['eviction_policy']!r} differ")
        if self.policy not in ("lru", "arc"):
            raise ValueError(f"kvtier: {'policy' if 'policy' in x else 'eviction_policy'}: {self.policy!r} "
                             "(supported: 'lru' and 'arc', vLLM's own orders)")
        self.l3 = x.get("l3") or None
        if self.l3 is not None and not isinstance(self.l3, str):
            raise ValueError(f"kvtier: l3: expected a store URL, not {self.l3!r}")
        wp = x.get("l3_write_policy", "write_through")
        if wp != "write_through":
            raise ValueError(f"kvtier: l3_write_policy: {wp!r} (supported: 'write_through'; the host tier's "
                             "evictions are decided in the scheduler, away from the bytes, so write_back cannot be)")
        self.l3_threads = _count_option(x, "l3_threads", 2, 1, 64)
        self.l3_ns = x.get("l3_ns", "default")
        if not isinstance(self.l3_ns, str) or not self.l3_ns:
            raise ValueError(f"kvtier: l3_ns: expected a namespace (a non-empty string), not {self.l3_ns!r}")
        if self.config.canonical_layout:
            raise ValueError("kvtier: vLLM's canonical_layout is not supported: host pages keep the direct layout")
        self.free_room = _fraction_option(x, "l2_free_room")
        if self.policy == "arc" and self.free_room > 0:
            raise ValueError("kvtier: policy 'arc' evicts on demand only: l2_free_room must be 0")
        if self.policy == "arc" and self.l3 is not None:
            raise ValueError("kvtier: policy 'arc' is for the host tier alone: an l3 store needs policy 'lru'")
        self.store_threshold = _count_option(x, "store_threshold", 0, 0)
        self.max_tracker_size = _count_option(x, "max_tracker_size", 64_000, 1)
        self.threads = _count_option(x, "threads", 1, 1, 64)
        self.checksum = _flag_option(x, "checksum", True)
        # every worker keeps its own copy of a block's bytes, as vLLM's CPU spec counts them
        per_chunk = config.worker_kv_bytes_per_block * config.parallel.world_size * self.blocks_per_chunk
        self.num_chunks = host if sized[0] == "num_chunks" else host // per_chunk if per_chunk > 0 else 0
        most = _a.U32_MAX - (self.policy == "arc")  # a host tier's pages (KVT_ALLOC_MAX_PAGES; ARC's ghosts one fewer)
        if self.num_chunks > most:
            raise ValueError(f"kvtier: {sized[0]}: {self.num_chunks} chunks of {per_chunk} bytes: at most {most}"
                             + (" under policy 'arc'" if self.policy == "arc" else ""))
        self._manager: Optional[KvtierOffloadingManager] = None
        self._worker = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            if self.num_chunks < 1:
                raise ValueError(f"kvtier: host_bytes holds no chunk of {self.blocks_per_chunk} blocks")
            store = self._l3_store(rank=0) if self.l3 else None  # exists only: rank 0's objects stand for all
            events = self.kv_events_config.enable_kv_cache_events
            try:
                threshold = dict(store_threshold=self.store_threshold, max_tracker_size=self.max_tracker_size)
                if self.policy == "arc":
                    self._manager = KvtierArcOffloadingManager(self.num_chunks, enable_events=events, **threshold)
                else:
                    self._manager = KvtierOffloadingManager(self.num_chunks, enable_events=events,
                                                            free_room=self.free_room, l3=store, **threshold)
            except BaseException:
                if store is not None:
                    store.close()
                raise
        return self._manager

    def l3_identity(self) -> dict:
        """What names a chunk's object in the L3 store besides its page hash:
        the model, its KV layout and one worker's chunk geometry, the same in
        the scheduler (exists) and in every worker (get, put)."""
        c = self.config
        return dict(model=f"vllm:{c.model.name}:{c.model.dtype}:{c.kv_cache_layout}",
                    page_tokens=c.groups[0].tokens_per_block * self.blocks_per_chunk if c.groups else 0,
                    layers=1, layer_bytes=c.worker_kv_bytes_per_block * self.blocks_per_chunk, dtype_bytes=1,
                    ns=self.l3_ns, threads=self.l3_threads)

    def _l3_store(self, rank: int, tier=None) -> Store:
        ident = self.l3_identity()
        return Store(self.l3, tier=tier, tp=(rank, self.config.parallel.world_size), **ident)

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            from .vllm_worker import KvtierOffloadingWorker
            l3 = None
            if self.l3:  # the worker opens it over its host tier: a function of that tier
                l3 = lambda tier: self._l3_store(self.config.parallel.rank, tier)  # noqa: E731
            self._worker = KvtierOffloadingWorker(kv_caches, self.num_chunks, self.blocks_per_chunk,
                                                  threads=self.threads, checksum=self.checksum, l3=l3)
        return self._worker


def __getattr__(name: str):
    # The connector imports vLLM's connector modules (seconds): only when asked for,
    # as vLLM asks for it by "kv_connector_module_path": "kvtier.vllm".
    if name == "KvtierOffloadingConnector":
        from .vllm_connector import KvtierOffloadingConnector
        return KvtierOffloadingConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
