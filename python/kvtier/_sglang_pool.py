"""A host pool registered with kvtier's SGLang backend (kvtier.sglang): how
its pages map onto a kvtier engine tier, the lanes (Store handles) that move
them, and the registration that holds both, built whole and retired whole
when the backend registers another pool or closes."""
from __future__ import annotations

import bisect
import logging
import operator
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._core import Error
from ._lib import KVT_TIER_MAX_PLANES
from .store import Store
from .tier import Plane, Tier, _kept_range, _memory_probe

logger = logging.getLogger("kvtier.sglang")

STORAGE_BATCH_SIZE = 128  # SGLang's pages per storage call
_STAGING_BYTES = 64 << 20  # a staging tier holds at most this much (and at most one batch)


def _dtype_name(dtype: Any) -> Tuple[str, int]:
    """(name, bytes per element) of a torch dtype."""
    import torch
    return str(dtype).replace("torch.", ""), torch.empty((), dtype=dtype).element_size()


# ---- the pool's pages -------------------------------------------------------


class _Plan(NamedTuple):
    """How the host pool's pages map onto an engine tier (planes, layers)."""
    pages: int
    planes: int
    layers: int
    bases: Tuple[int, ...]  # page 0's pointer of each slot
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]


def _meta(pool: Any, indices: Any) -> Tuple[List[int], List[int]]:
    """The pool's (pointers, sizes) of a run of token indices, as plain ints."""
    got = pool.get_page_buffer_meta(indices)
    if got is None:
        raise ValueError(f"{type(pool).__name__}.get_page_buffer_meta gave nothing: the pool has no KV buffers")
    ptrs, sizes = got
    ptrs = [int(p) for p in ptrs]
    sizes = [int(sizes)] * len(ptrs) if isinstance(sizes, int) else [int(s) for s in sizes]
    if not ptrs or len(sizes) != len(ptrs) or min(sizes) < 1 or min(ptrs) <= 0:
        raise ValueError(f"{type(pool).__name__}.get_page_buffer_meta: {len(ptrs)} pointers, {len(sizes)} sizes "
                         "(expected as many of each, all positive)")
    return ptrs, sizes


def _page_indices(pool: Any, page: int) -> Any:
    import torch
    ps = pool.page_size
    return torch.arange(page * ps, (page + 1) * ps, dtype=torch.int64)


def _plan(pool: Any, pages: int) -> Tuple[Optional[_Plan], str, List[int]]:
    """The engine-tier description of the pool, or None and why not; and the
    sizes of one page's buffers (what every path's objects hold)."""
    base, sizes = _meta(pool, _page_indices(pool, 0))
    n = len(base)
    if pages == 1:
        strides = list(sizes)
    else:
        nxt, s1 = _meta(pool, _page_indices(pool, 1))
        if len(nxt) != n or s1 != sizes:
            return None, "pages report different buffer lists", sizes
        strides = [b - a for a, b in zip(base, nxt)]
    for probe in sorted({pages // 2, pages - 1} - {0, 1}):
        ptrs, sz = _meta(pool, _page_indices(pool, probe))
        if sz != sizes or ptrs != [b + probe * s for b, s in zip(base, strides)]:
            return None, f"page {probe}'s buffers are not page 0's plus {probe} strides", sizes
    if any(st < sz for st, sz in zip(strides, sizes)):
        return None, "pages overlap or run backwards (a stride below the buffer size)", sizes
    for planes in range(1, KVT_TIER_MAX_PLANES + 1):
        if n % planes:
            continue
        if all(len({sizes[j] for j in range(q, n, planes)}) == 1 and len({strides[j] for j in range(q, n, planes)}) == 1
               for q in range(planes)):
            return _Plan(pages, planes, n // planes, tuple(base), tuple(sizes), tuple(strides)), "", sizes
    return None, f"{n} buffers per page do not group into 1..{KVT_TIER_MAX_PLANES} planes of equal layers", sizes


def _pool_memory(pool: Any) -> Dict[Tuple[int, int], Any]:
    """The host tensors the pool holds (its attributes, and lists or tuples
    of tensors in them: kv_buffer and whatever else a pool keeps), one per
    allocation, by its [start, end). Every address the pool gives must lie
    in one of them; the registration keeps them alive, so a pool that lets
    go of its buffers (HostKVCache.destroy) does not free memory a call is
    copying into."""
    found: Dict[Tuple[int, int], Any] = {}
    for v in list(vars(pool).values()) if hasattr(pool, "__dict__") else []:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            r = _kept_range(t) if type(t).__module__.startswith("torch") else None
            if r is not None and r[1] > r[0]:
                found.setdefault(r, t)
    return found


_U64 = (1 << 64) - 1


class _Memory:
    """Where the pool's pages may be: the ranges of its host tensors, and
    probes that tell when one was resized or freed since registration."""

    def __init__(self, pool: Any) -> None:
        found = _pool_memory(pool)
        self.tensors, self.ranges = list(found.values()), sorted(found)
        if not self.tensors:
            raise ValueError(f"KvtierStorage.register_mem_pool_host: {type(pool).__name__} holds no host tensor "
                             "(expected SGLang's HostKVCache, whose kv_buffer holds its pages)")
        self.probes = [_memory_probe(t, f"the pool's tensor {i}") for i, t in enumerate(self.tensors)]

    def check(self, ptrs: Sequence[int], sizes: Sequence[int], what: str) -> None:
        """ValueError unless every [ptr, ptr + size) lies in the pool's
        memory as registered, and that memory is still there."""
        for where, read, want in self.probes:
            if read() != want:
                raise ValueError(f"{what}: {where} was resized or freed since register_mem_pool_host "
                                 "(register the pool again)")
        for p, n in zip(ptrs, sizes):
            i = bisect.bisect_right(self.ranges, (p, _U64)) - 1
            if i < 0 or p + n > self.ranges[i][1]:
                raise ValueError(f"{what}: bytes [{p:#x}, {p + n:#x}) are not in the pool's host tensors "
                                 "(an index past the pool, or a pool whose buffers changed after "
                                 "register_mem_pool_host)")


def _engine_tier(plan: _Plan, memory: _Memory) -> Tier:
    """An engine tier over the pool's memory (never copied or freed by it):
    every byte its planes address is checked to lie in the pool's tensors,
    which it keeps alive, and a resize of them under it is noticed."""
    planes = [Plane(plan.sizes[q], plan.strides[q], layer_bases=plan.bases[q::plan.planes]) for q in range(plan.planes)]
    # HiCache host pools are host memory
    return Tier.engine(planes, plan.pages, plan.layers, keep=memory.tensors, name="sglang-host-pool")


# ---- lanes: one Store handle, one caller at a time ----------------------------


class _Lane:
    """A Store (and, for staging, the host tier it reads and writes) used by
    one thread at a time: submit, then wait for that batch."""

    def __init__(self, name: str, url: str, tier: Optional[Tier], ident: dict, opts: dict, own_tier: bool) -> None:
        self.name = name
        self.tier = tier
        self.own_tier = own_tier
        self.lock = threading.Lock()
        self.store = Store(url, tier=tier, log=lambda msg: logger.warning("kvtier L3 (%s): %s", name, msg),
                           **ident, **opts)
        # a dir's exists is a stat on this thread (Store.exists_leading): a prefix is checked in
        # growing chunks, so that a miss early spares hashing the keys after it; a server is
        # asked every key at once (one round trip)
        self.local_exists = self.store.backend == "dir"

    def run(self, op: str, items: Sequence[Any]) -> Optional[Tuple[str, ...]]:
        """Per-key results ("ok", "miss", "bad", "failed"), or None when the
        batch could not be run. On this thread (Store.run): the caller waits
        for the answer anyway, and a worker's wake-up and the poll cost as
        much as a batch of a page or two. Call with the lock held."""
        try:
            return self.store.run(op, items)[0]
        except Error as e:
            logger.warning("kvtier L3 (%s): %s: %s", self.name, op, e)
            return None

    def leading(self, hashes: Sequence[Any]) -> int:
        """How many keys, from the first, the store holds, asked on this
        thread (Store.exists_leading); 0 when the store failed. Call with
        the lock held."""
        try:
            return self.store.exists_leading(hashes)
        except Error as e:
            logger.warning("kvtier L3 (%s): exists: %s", self.name, e)
            return 0

    def leading_of(self, keys: Sequence[Any], key_hash: Callable[[Any], Any]) -> int:
        """leading() over keys, each hashed by key_hash: for a local store
        in chunks of 1, 4, 16 ... keys, stopping at the chunk with the first
        miss; else all of them in one batch. Call with the lock held."""
        if not self.local_exists:
            return self.leading([key_hash(k) for k in keys])
        n, step = 0, 1
        while n < len(keys):
            chunk = keys[n:n + step]
            got = self.leading([key_hash(k) for k in chunk])
            n += got
            if got < len(chunk):
                break
            step *= 4
        return n

    def page_addr(self, page: int) -> int:
        return self.tier.plane_addr(0, page, 0)

    def close(self) -> None:
        self.store.close()
        if self.own_tier and self.tier is not None:
            self.tier.close()


# ---- a registered pool -------------------------------------------------------------


class _Registration:
    """One registered host pool: its geometry, the engine tier over its
    memory and the lanes opened for it. Built whole before it is used, so a
    failure leaves nothing behind; replaced whole by the next registration,
    and retired only when the calls that started on it are done:

        register_mem_pool_host(B):  build B  ->  swap A for B  ->  A.retire()
                                                    |               waits for A's calls, closes A
        a call:  enter the current one (A or B), run on it, leave
    """

    def __init__(self, pool: Any, ident: dict, url: str, opts: dict, interface_v1: bool) -> None:
        for attr in ("page_size", "size", "get_page_buffer_meta", "dtype"):
            if not hasattr(pool, attr):
                raise TypeError(f"KvtierStorage.register_mem_pool_host: {type(pool).__name__} has no {attr!r} "
                                "(expected SGLang's HostKVCache)")
        ps, size = _pool_int(pool, "page_size"), _pool_int(pool, "size")
        if ps < 1 or size < ps:
            raise ValueError(f"KvtierStorage.register_mem_pool_host: page_size {ps}, size {size} tokens")
        pages = size // ps
        page_num = getattr(pool, "page_num", None)
        if page_num is not None and _pool_int(pool, "page_num") != pages:
            raise ValueError(f"KvtierStorage.register_mem_pool_host: the pool's page_num {page_num} is not its "
                             f"size {size} // page_size {ps} = {pages} pages (a pool that says two sizes)")
        self.memory = _Memory(pool)
        self.kv_buffer = getattr(pool, "kv_buffer", None)
        plan, why, sizes = _plan(pool, pages)
        dtype, self.dtype_bytes = _dtype_name(pool.dtype)
        self.pool, self.page_size, self.size, self.pages, self.page_bytes = pool, ps, size, pages, sum(sizes)
        self.layout = str(getattr(pool, "layout", "unknown"))
        self.ns = {fmt: f"{ident['ns']}/sglang-{fmt}/{self.layout}/{dtype}" for fmt in ("v1", "flat")}
        # v1 objects: the pool's buffers in order, as layers of the engine tier when there is one
        self.v1_geom = (plan.layers, self.page_bytes // plan.layers) if plan else (1, self.page_bytes)
        self.plan, self.staging_reason = plan, why
        self.ident, self.url, self.opts = ident, url, opts
        self.engine: Optional[Tier] = None
        self.lanes: Dict[str, _Lane] = {}
        self.lock = threading.Lock()  # opening lanes
        self.cv = threading.Condition(threading.Lock())
        self.active = 0  # calls running on this registration
        self.retired = False
        try:
            if plan is not None:
                try:
                    self.engine = _engine_tier(plan, self.memory)
                except ValueError as e:
                    raise ValueError(f"KvtierStorage.register_mem_pool_host: the pool's {pages} pages of "
                                     f"{self.page_bytes} bytes are not all in its host tensors ({e})") from None
                self.lane("zc-read")
                self.lane("zc-write")
            else:
                logger.info("kvtier.sglang: the %s pool goes through staging: %s", self.layout, why)
            self.exists_lane(interface_v1)  # the store exists calls use: an outage now is an error now
        except BaseException:
            self._close()
            raise

    def enter(self) -> bool:
        """A call starts on this registration (False: it was retired, take the current one)."""
        with self.cv:
            if self.retired:
                return False
            if getattr(self.pool, "kv_buffer", None) is not self.kv_buffer:
                raise RuntimeError("KvtierStorage: the registered pool's kv_buffer was replaced or destroyed "
                                   "after register_mem_pool_host (register the pool again)")
            self.active += 1
            return True

    def leave(self) -> None:
        with self.cv:
            self.active -= 1
            if not self.active:
                self.cv.notify_all()

    def retire(self) -> None:
        """No call starts here any more; once the running ones end, the lanes and the engine tier close."""
        with self.cv:
            self.retired = True
            while self.active:
                self.cv.wait()
        self._close()

    def _close(self) -> None:
        with self.lock:
            lanes, self.lanes = self.lanes, {}
            for lane in lanes.values():
                with lane.lock:
                    lane.close()
            if self.engine is not None:
                self.engine.close()
                self.engine = None

    def lane(self, name: str, soft: bool = False) -> Optional[_Lane]:
        """The lane, opened on first use. soft: a store that cannot be reached
        now gives None (the caller's keys are misses) and is tried again on
        the next call."""
        lane = self.lanes.get(name)
        if lane is not None:
            return lane
        with self.lock:
            lane = self.lanes.get(name)
            if lane is None:
                try:
                    lane = self.lanes[name] = self._open_lane(name)
                except Error as e:
                    if not soft or e.name != "KVT_EIO":
                        raise
                    logger.warning("kvtier L3 (%s): %s", name, e)
                    return None
        return lane

    def _open_lane(self, name: str) -> _Lane:
        fmt = "flat" if name.startswith("flat") else "v1"
        layers, layer_bytes = self.v1_geom if fmt == "v1" else (1, self.page_bytes)
        ident = dict(model=self.ident["model"], page_tokens=self.page_size, layers=layers, layer_bytes=layer_bytes,
                     dtype_bytes=self.dtype_bytes, tp=self.ident["tp"], cp=self.ident["cp"], ns=self.ns[fmt])
        if name.startswith("zc"):
            return _Lane(name, self.url, self.engine, ident, self.opts, own_tier=False)
        pages = max(1, min(STORAGE_BATCH_SIZE, _STAGING_BYTES // self.page_bytes))
        tier = Tier.host(pages, layers, layer_bytes, name=f"kvtier-sglang-{name}")
        try:
            return _Lane(name, self.url, tier, ident, self.opts, own_tier=True)
        except BaseException:
            tier.close()
            raise

    def exists_lane(self, interface_v1: bool, soft: bool = False) -> Optional[_Lane]:
        if not interface_v1:
            return self.lane("flat-stage-read", soft)
        return self.lane("zc-read" if self.plan is not None else "v1-stage-read", soft)


def _pool_int(pool: Any, name: str) -> int:
    v = getattr(pool, name)
    try:
        return operator.index(v)
    except TypeError:
        try:
            return int(v)  # a 0-d tensor
        except (TypeError, ValueError):
            raise TypeError(f"KvtierStorage.register_mem_pool_host: the pool's {name} is {v!r}, not an integer") \
                from None
