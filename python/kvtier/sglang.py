"""An SGLang HiCache storage backend over kvtier's L3 store (store.h).

SGLang's hierarchical cache keeps KV pages in GPU memory (L1) and in a host
pool (L2, ``HostKVCache``), and backs pages up to a storage backend (L3)
under string keys, the chained SHA-256 of each page's tokens. This module is
such a backend, loaded by SGLang's ``dynamic`` backend factory::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name": "kvtier", "module_path": "kvtier.sglang",
        "class_name": "KvtierStorage", "interface_v1": 1,
        "l3": "redis://10.0.0.1:6379"}'

The zero-copy path (``batch_get_v1`` / ``batch_set_v1``; SGLang uses it when
``interface_v1`` is set) moves pages between the store and the host pool's
own memory. At ``register_mem_pool_host`` the backend asks the pool where its
pages are (``get_page_buffer_meta``: per page, a list of pointers and sizes)
and, when every pointer is affine in the page number, describes the pool as
a kvtier engine tier whose page i *is* host page i:

    pool.get_page_buffer_meta(page p) -> [ptr_0, ptr_1, ... ptr_n-1], [size_0 ...]
    ptr_j(p) = ptr_j(0) + p * stride_j                  (checked on 4 pages)
    slots grouped P to a layer (P = 1..4 planes):  slot l*P + q = plane q, layer l

    engine tier page p:  [l0: plane 0 .. plane P-1][l1: ...] ...  = the slots in order

so an L3 object's payload is the concatenation of the page's buffers in the
order the pool lists them, and a get or put is one store batch of
(hash, host page) with no copy in Python. A pool whose pointers are not
affine (or need more than 4 planes), and a batch whose host indices do not
start on a page boundary, go through a small kvtier host tier instead
(staging: ctypes.memmove to and from the pointers the pool gives) with the
same object format, so either path reads what the other wrote.

The tensor calls (get, set, batch_get, batch_set: SGLang's generic path,
without ``interface_v1``) copy flat pages (``get_data_page`` tensors)
through a staging tier. They keep their own object format: a flat page's
byte order differs from the pointer order for layer_first pools.

Keys: an SGLang key (any string) becomes the 16-byte page hash
BLAKE2b-128(key) (lo, hi little-endian). The store's identity digest adds
the model (``model_name``), the TP shard (none for MLA, whose KV every rank
holds alike), the CP shard, the page size, the geometry, the dtype and a
namespace ``<namespace>/sglang-<v1|flat>/<layout>/<dtype>[/pp<r>of<n>]``, so
objects of two models, shards, layouts or formats never meet.

Failures: a bad configuration (no "l3", a malformed URL, an unreachable
store, no model name, a pool without buffers) raises at construction or
registration; bad arguments raise (TypeError, ValueError, IndexError); a
store that goes down later, a missing key and an object that fails kvtier's
checks are misses (False, 0, None), never exceptions. A refused object never
reaches the host page: the page is left as it was, or zeroed by a dir get
that read straight into it.

Threads: SGLang calls from its prefetch, prefetch-IO and backup threads at
once. Each store has a read lane and a write lane (a Store handle and a
lock each), so backups do not queue behind loads; a staging tier belongs to
one lane.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from abc import ABC, abstractmethod
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._core import Error
from ._lib import KVT_TIER_MAX_PLANES
from .store import Store
from .tier import Plane, Tier, TensorInfo

__all__ = ["KvtierStorage", "HiCacheStorage", "key_hash", "STORAGE_BATCH_SIZE"]

logger = logging.getLogger("kvtier.sglang")

STORAGE_BATCH_SIZE = 128  # SGLang's pages per storage call
_STAGING_BYTES = 64 << 20  # a staging tier holds at most this much (and at most one batch)
_WAIT_S = 300.0  # a batch's answer; the store bounds every network call long before this

try:  # SGLang's factory requires a subclass of its abstract class
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # type: ignore
    HAVE_SGLANG = True
except Exception:  # SGLang absent (or broken): the same interface, standalone
    HAVE_SGLANG = False

    class HiCacheStorage(ABC):  # type: ignore[no-redef]
        """The interface of SGLang's HiCache storage backends (a stand-in when
        SGLang is not installed): string keys, whole host pages as values."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        @abstractmethod
        def get(self, key, target_location=None, target_sizes=None): ...

        @abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None): ...

        @abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None): ...

        @abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None): ...

        @abstractmethod
        def exists(self, key): ...

        def batch_exists(self, keys, extra_info=None) -> int:
            for i, k in enumerate(keys):
                if not self.exists(k):
                    return i
            return len(keys)

        def batch_get_v1(self, keys, host_indices, extra_info=None):
            raise NotImplementedError

        def batch_set_v1(self, keys, host_indices, extra_info=None):
            raise NotImplementedError

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None


def key_hash(key: str) -> bytes:
    """The kvtier page hash of an SGLang key: BLAKE2b-128 of its UTF-8 bytes
    (16 bytes: lo then hi, little-endian)."""
    if not isinstance(key, str):
        raise TypeError(f"key: expected a str (SGLang's hex page hash), not {type(key).__name__}")
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def _keys(keys: Any) -> List[str]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"keys: expected a list of str, not {type(keys).__name__}")
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            raise TypeError(f"keys[{i}]: expected a str, not {type(k).__name__}")
    return list(keys)


def _cfg(storage_config: Any, name: str, default: Any = None) -> Any:
    """A field of SGLang's HiCacheStorageConfig (a dataclass), or of a dict."""
    if isinstance(storage_config, dict):
        v = storage_config.get(name, default)
    else:
        v = getattr(storage_config, name, default)
    return default if v is None else v


def _int_option(extra: dict, name: str, default: int, lo: int, hi: int) -> int:
    v = extra.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"KvtierStorage: extra_config {name!r} = {v!r} (expected an integer {lo}..{hi})")
    return v


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


def _engine_tier(plan: _Plan, pool: Any) -> Tier:
    """An engine tier over the pool's memory (never copied or freed by it)."""
    planes = [Plane(plan.sizes[q], plan.strides[q], layer_bases=plan.bases[q::plan.planes]) for q in range(plan.planes)]
    # HiCache host pools are host memory
    return Tier.engine(planes, plan.pages, plan.layers, keep=[pool], name="sglang-host-pool")


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

    def run(self, op: str, items: Sequence[Any]) -> Optional[Tuple[str, ...]]:
        """Per-key results ("ok", "miss", "bad", "failed"), or None when the
        batch got no answer in time. Call with the lock held."""
        ticket = getattr(self.store, op)(items)
        try:
            return self.store.wait(ticket, _WAIT_S).results
        except Error as e:
            logger.warning("kvtier L3 (%s): %s: %s", self.name, op, e)
            return None

    def page_addr(self, page: int) -> int:
        return self.tier.plane_addr(0, page, 0)

    def close(self) -> None:
        self.store.close()
        if self.own_tier and self.tier is not None:
            self.tier.close()


# ---- the backend ----------------------------------------------------------------


class KvtierStorage(HiCacheStorage):
    """SGLang's HiCache storage interface over a kvtier store.

    ``KvtierStorage(storage_config, kwargs)``, as SGLang's dynamic loader
    builds it: ``storage_config`` is SGLang's HiCacheStorageConfig (or a dict
    of the same fields: model_name, tp_rank, tp_size, pp_rank, pp_size,
    attn_cp_rank, attn_cp_size, is_mla_model, extra_config); its
    ``extra_config`` names the store:

    ``l3``            the store URL (required): dir:PATH[,max=SIZE],
                      redis://HOST:PORT, redis-cluster://H:P[,H:P...]
    ``namespace``     a deployment or tenant sharing the store ("sglang")
    ``model``         the model identity, instead of model_name
    ``interface_v1``  SGLang's switch to batch_get_v1/batch_set_v1; also picks
                      which object format exists/batch_exists look for
    ``threads``, ``timeout_ms``, ``retries``: the store's mechanism

    ``kwargs`` (a dict) may hold ``mem_pool_host``; SGLang registers the host
    pool with :meth:`register_mem_pool_host` right after construction, and
    nothing but construction and close works before that."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[dict] = None, *,
                 mem_pool_host: Any = None) -> None:
        extra = _cfg(storage_config, "extra_config", {})
        if not isinstance(extra, dict):
            raise TypeError(f"KvtierStorage: extra_config is a {type(extra).__name__}, expected a dict")
        url = extra.get("l3")
        if not isinstance(url, str) or not url:
            raise ValueError('KvtierStorage: --hicache-storage-backend-extra-config has no "l3" store URL '
                             '(dir:PATH, redis://HOST:PORT or redis-cluster://H:P[,H:P...])')
        model = extra.get("model") or _cfg(storage_config, "model_name", "")
        if not isinstance(model, str) or not model:
            raise ValueError('KvtierStorage: no model identity: SGLang passes none (set --served-model-name) '
                             'and extra_config has no "model"')
        ns = extra.get("namespace", "sglang")
        if not isinstance(ns, str) or not ns:
            raise ValueError(f"KvtierStorage: extra_config 'namespace' = {ns!r} (expected a non-empty string)")
        self._opts = dict(threads=_int_option(extra, "threads", 2, 1, 64),
                          timeout_ms=_int_option(extra, "timeout_ms", 2000, 1, 600000),
                          retries=_int_option(extra, "retries", 8, 0, 1000))
        self.is_mla = bool(_cfg(storage_config, "is_mla_model", False))
        tp = (int(_cfg(storage_config, "tp_rank", 0)), int(_cfg(storage_config, "tp_size", 1)))
        cp = (int(_cfg(storage_config, "attn_cp_rank", 0)), int(_cfg(storage_config, "attn_cp_size", 1)))
        pp = (int(_cfg(storage_config, "pp_rank", 0)), int(_cfg(storage_config, "pp_size", 1)))
        for what, (r, s) in (("tp", tp), ("attn_cp", cp), ("pp", pp)):
            if not 0 <= r < s:
                raise ValueError(f"KvtierStorage: {what} rank {r} of {s}")
        self.model = model
        self.tp = (0, 1) if self.is_mla else tp  # MLA: every rank holds the same latents
        self.cp = cp
        self.namespace = ns + (f"/pp{pp[0]}of{pp[1]}" if pp[1] > 1 else "")
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        try:  # the URL and the store's reachability, checked now rather than at the first page
            with Store(url, model=model, page_tokens=1, layers=1, layer_bytes=1, ns=ns, **self._opts) as probe:
                self.url, self.backend = probe.url, probe.backend
        except Error as e:
            kind = ConnectionError if e.name == "KVT_EIO" else ValueError
            raise kind(f"KvtierStorage: cannot open the L3 store \"l3\": {url!r}: {e}") from e
        self.mem_pool_host = None
        self._lock = threading.Lock()  # opening lanes
        self._lanes: Dict[Any, _Lane] = {}
        self._plan: Optional[_Plan] = None
        self._engine: Optional[Tier] = None
        self.staging_reason = ""
        pool = mem_pool_host if mem_pool_host is not None else (kwargs or {}).get("mem_pool_host")
        if pool is not None:
            self.register_mem_pool_host(pool)

    # -- the host pool ---------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers SGLang's host pool: its geometry fixes the store identity
        and, where the pool's pointers allow, an engine tier over its memory.
        A failure (a pool without buffers, the store down) raises and leaves
        no pool registered."""
        pool = mem_pool_host
        for attr in ("page_size", "size", "get_page_buffer_meta", "dtype"):
            if not hasattr(pool, attr):
                raise TypeError(f"KvtierStorage.register_mem_pool_host: {type(pool).__name__} has no {attr!r} "
                                "(expected SGLang's HostKVCache)")
        ps, size = int(pool.page_size), int(pool.size)
        if ps < 1 or size < ps:
            raise ValueError(f"KvtierStorage.register_mem_pool_host: page_size {ps}, size {size} tokens")
        self._close_lanes()
        pages = int(getattr(pool, "page_num", 0) or size // ps)
        plan, why, sizes = _plan(pool, pages)
        dtype, dtype_bytes = _dtype_name(pool.dtype)
        self.page_size, self.pages, self.page_bytes = ps, pages, sum(sizes)
        self.layout = str(getattr(pool, "layout", "unknown"))
        self._dtype_bytes = dtype_bytes
        self._ns = {fmt: f"{self.namespace}/sglang-{fmt}/{self.layout}/{dtype}" for fmt in ("v1", "flat")}
        # v1 objects: the pool's buffers in order, as layers of the engine tier when there is one
        self._v1_geom = (plan.layers, self.page_bytes // plan.layers) if plan else (1, self.page_bytes)
        self._plan, self.staging_reason = plan, why
        super().register_mem_pool_host(pool)
        self.mem_pool_host = pool
        try:
            if plan is not None:
                self._engine = _engine_tier(plan, pool)
                self._lane("zc-read")
                self._lane("zc-write")
            else:
                logger.info("kvtier.sglang: the %s pool goes through staging: %s", self.layout, why)
            self._exists_lane()  # the store exists calls use: an outage now is an error now
        except BaseException:  # nothing registered, nothing left open
            self._close_lanes()
            self.mem_pool_host = None
            raise

    @property
    def zero_copy(self) -> bool:
        """batch_get_v1/batch_set_v1 move pages straight between the store and the pool."""
        return self._engine is not None

    def page_addresses(self, page: int) -> List[int]:
        """The addresses the engine tier uses for a host page, in the order of
        the pool's get_page_buffer_meta (for checks against it)."""
        if self._plan is None:
            raise ValueError(f"page_addresses: no engine tier ({self.staging_reason or 'no host pool registered'})")
        if not isinstance(page, int) or not 0 <= page < self.pages:
            raise IndexError(f"page {page!r} out of range (the pool has {self.pages} pages)")
        p = self._plan
        return [self._engine.plane_addr(q, page, layer) for layer in range(p.layers) for q in range(p.planes)]

    def store_key(self, key: str, fmt: Optional[str] = None) -> str:
        """The store's 32-hex-digit key of an SGLang key (the Redis key is
        "kvt:<hex>", the dir file PATH/<hex[0:2]>/<hex[2:4]>/<hex>), in the v1
        or the flat format (default: the one exists looks for)."""
        fmt = fmt or ("v1" if self.interface_v1 else "flat")
        if fmt not in ("v1", "flat"):
            raise ValueError(f"store_key: format {fmt!r} (choose v1 or flat)")
        lane = self._lane("flat-stage-read" if fmt == "flat" else "zc-read" if self._plan else "v1-stage-read")
        return lane.store.key(key_hash(key))

    # -- lanes -------------------------------------------------------------------

    def _pool(self) -> Any:
        if self.mem_pool_host is None:
            raise RuntimeError("KvtierStorage: no host pool registered (call register_mem_pool_host first)")
        return self.mem_pool_host

    def _lane(self, name: str, soft: bool = False) -> Optional[_Lane]:
        """The lane, opened on first use. soft: a store that cannot be reached
        now gives None (the caller's keys are misses) and is tried again on
        the next call."""
        lane = self._lanes.get(name)
        if lane is not None:
            return lane
        self._pool()
        with self._lock:
            lane = self._lanes.get(name)
            if lane is None:
                try:
                    lane = self._lanes[name] = self._open_lane(name)
                except Error as e:
                    if not soft or e.name != "KVT_EIO":
                        raise
                    logger.warning("kvtier L3 (%s): %s", name, e)
                    return None
        return lane

    def _open_lane(self, name: str) -> _Lane:
        fmt = "flat" if name.startswith("flat") else "v1"
        layers, layer_bytes = self._v1_geom if fmt == "v1" else (1, self.page_bytes)
        ident = dict(model=self.model, page_tokens=self.page_size, layers=layers, layer_bytes=layer_bytes,
                     dtype_bytes=self._dtype_bytes, tp=self.tp, cp=self.cp, ns=self._ns[fmt])
        if name.startswith("zc"):
            return _Lane(name, self.url, self._engine, ident, self._opts, own_tier=False)
        pages = max(1, min(STORAGE_BATCH_SIZE, _STAGING_BYTES // self.page_bytes))
        tier = Tier.host(pages, layers, layer_bytes, name=f"kvtier-sglang-{name}")
        try:
            return _Lane(name, self.url, tier, ident, self._opts, own_tier=True)
        except BaseException:
            tier.close()
            raise

    def _exists_lane(self, soft: bool = False) -> Optional[_Lane]:
        if not self.interface_v1:
            return self._lane("flat-stage-read", soft)
        return self._lane("zc-read" if self._plan is not None else "v1-stage-read", soft)

    def _close_lanes(self) -> None:
        with self._lock:
            lanes, self._lanes = self._lanes, {}
            for lane in lanes.values():
                with lane.lock:
                    lane.close()
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def close(self) -> None:
        """Closes the stores and tiers (SGLang calls it on detach); idempotent."""
        self.mem_pool_host = None  # first: no call opens a lane again
        self._close_lanes()

    def __enter__(self) -> "KvtierStorage":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- exists ------------------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys, from the first, the store holds (0 when it is down)."""
        keys = _keys(keys)
        if not keys:
            return 0
        hashes = [key_hash(k) for k in keys]
        lane = self._exists_lane(soft=True)
        if lane is None:
            return 0
        with lane.lock:
            results = lane.run("exists", hashes)
        if results is None:
            return 0
        n = 0
        while n < len(results) and results[n] == "ok":
            n += 1
        return n

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- zero copy: host pages by index ------------------------------------------

    def _host_pages(self, keys: List[str], host_indices: Any) -> Tuple[List[int], bool, List[int]]:
        """Each key's first token index in the pool, whether all are
        page-aligned, and the indices as a list."""
        pool = self._pool()
        ps = self.page_size
        try:
            n = len(host_indices)
        except TypeError:
            raise TypeError(f"host_indices: expected a tensor of token indices, not {type(host_indices).__name__}") \
                from None
        if n != len(keys) * ps:
            raise ValueError(f"host_indices: {n} token indices for {len(keys)} keys of {ps}-token pages "
                             f"(expected {len(keys) * ps})")
        flat = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        starts = flat[::ps]
        for i, t in enumerate(starts):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= pool.size - ps:
                raise IndexError(f"host_indices[{i * ps}] = {t!r}: not a page of the pool ({pool.size} tokens)")
        return starts, all(t % ps == 0 for t in starts), flat

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Loads each key's page into the host pool at host_indices (page i
        at host_indices[i * page_size]); True per page served, False for a
        miss, an object that failed its checks, or a store that is down."""
        keys = _keys(keys)
        starts, aligned, flat = self._host_pages(keys, host_indices)
        if not keys:
            return []
        pages = [t // self.page_size for t in starts]
        if len(set(pages if aligned else starts)) != len(pages):
            raise ValueError("batch_get_v1: a host page appears twice (two keys cannot load into one page)")
        if self._plan is not None and aligned:
            return self._direct("zc-read", "get", keys, pages)
        return self._staged_v1("get", keys, flat)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores each host page under its key; True per page stored."""
        keys = _keys(keys)
        starts, aligned, flat = self._host_pages(keys, host_indices)
        if not keys:
            return []
        if self._plan is not None and aligned:
            return self._direct("zc-write", "put", keys, [t // self.page_size for t in starts])
        return self._staged_v1("put", keys, flat)

    def _direct(self, name: str, op: str, keys: List[str], pages: List[int]) -> List[bool]:
        items = [(key_hash(k), p) for k, p in zip(keys, pages)]
        lane = self._lane(name, soft=True)
        if lane is None:
            return [False] * len(keys)
        with lane.lock:
            results = lane.run(op, items)
        return [r == "ok" for r in results] if results is not None else [False] * len(keys)

    def _staged_v1(self, op: str, keys: List[str], flat: List[int]) -> List[bool]:
        """Pages copied between the pool's buffers and a staging tier."""
        import torch
        pool, ps = self._pool(), self.page_size
        lane = self._lane("v1-stage-read" if op == "get" else "v1-stage-write", soft=True)
        if lane is None:
            return [False] * len(keys)
        out: List[bool] = []
        with lane.lock:
            cap = lane.tier.pages
            for c in range(0, len(keys), cap):
                chunk = keys[c:c + cap]
                metas = [_meta(pool, torch.tensor(flat[(c + i) * ps:(c + i + 1) * ps], dtype=torch.int64))
                         for i in range(len(chunk))]
                for ptrs, sizes in metas:
                    if sum(sizes) != self.page_bytes:
                        raise ValueError(f"get_page_buffer_meta: {sum(sizes)} bytes for a page, "
                                         f"registered pages hold {self.page_bytes}")
                if op == "put":
                    for i, (ptrs, sizes) in enumerate(metas):
                        self._gather(lane.page_addr(i), ptrs, sizes)
                results = lane.run(op, [(key_hash(k), i) for i, k in enumerate(chunk)])
                ok = [r == "ok" for r in results] if results is not None else [False] * len(chunk)
                if op == "get":
                    for i, (ptrs, sizes) in enumerate(metas):
                        if ok[i]:
                            self._scatter(lane.page_addr(i), ptrs, sizes)
                out += ok
        return out

    @staticmethod
    def _gather(dst: int, ptrs: List[int], sizes: List[int]) -> None:
        for p, n in zip(ptrs, sizes):
            ctypes.memmove(dst, p, n)
            dst += n

    @staticmethod
    def _scatter(src: int, ptrs: List[int], sizes: List[int]) -> None:
        for p, n in zip(ptrs, sizes):
            ctypes.memmove(p, src, n)
            src += n

    # -- tensors: SGLang's generic path (flat pages) --------------------------------

    def _flat(self, t: Any, what: str) -> int:
        """The address of a flat page tensor (contiguous host memory of one page)."""
        try:
            ti = TensorInfo.of(t)
        except TypeError as e:
            raise TypeError(f"{what}: {e}") from None
        nbytes = ti.itemsize
        for d in ti.shape:
            nbytes *= d
        if ti.device is not None or not ti.inner_contiguous(0):
            raise ValueError(f"{what}: expected a contiguous CPU tensor")
        if nbytes != self.page_bytes:
            raise ValueError(f"{what}: {nbytes} bytes, a page of the registered pool is {self.page_bytes}")
        return ti.ptr

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores flat pages (get_data_page tensors); True when all were stored."""
        keys = _keys(keys)
        self._pool()
        if values is None or len(values) != len(keys):
            raise ValueError(f"batch_set: {len(keys)} keys and "
                             f"{'no' if values is None else len(values)} values")
        addrs = [self._flat(v, f"values[{i}]") for i, v in enumerate(values)]
        ok = self._staged_flat("put", keys, addrs)
        return bool(keys) and all(ok)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Flat pages, into target_locations when given (else new tensors of
        the pool's dtype); None for each key not served."""
        keys = _keys(keys)
        pool = self._pool()
        if target_locations is None:
            import torch
            target_locations = [torch.empty(self.page_bytes // self._dtype_bytes, dtype=pool.dtype) for _ in keys]
        elif len(target_locations) != len(keys):
            raise ValueError(f"batch_get: {len(keys)} keys and {len(target_locations)} target locations")
        addrs = [self._flat(t, f"target_locations[{i}]") for i, t in enumerate(target_locations)]
        ok = self._staged_flat("get", keys, addrs)
        return [t if k else None for t, k in zip(target_locations, ok)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def _staged_flat(self, op: str, keys: List[str], addrs: List[int]) -> List[bool]:
        if not keys:
            return []
        lane = self._lane("flat-stage-read" if op == "get" else "flat-stage-write", soft=True)
        if lane is None:
            return [False] * len(keys)
        out: List[bool] = []
        n = self.page_bytes
        with lane.lock:
            cap = lane.tier.pages
            for c in range(0, len(keys), cap):
                chunk = keys[c:c + cap]
                if op == "put":
                    for i in range(len(chunk)):
                        ctypes.memmove(lane.page_addr(i), addrs[c + i], n)
                results = lane.run(op, [(key_hash(k), i) for i, k in enumerate(chunk)])
                ok = [r == "ok" for r in results] if results is not None else [False] * len(chunk)
                if op == "get":
                    for i in range(len(chunk)):
                        if ok[i]:
                            ctypes.memmove(addrs[c + i], lane.page_addr(i), n)
                out += ok
        return out

    # -- the rest of SGLang's interface -------------------------------------------

    def clear(self) -> None:
        """Nothing: the store is shared (by instances, by a fleet); empty it
        with the store's own tools."""

    def get_stats(self):
        return None

    def stats(self) -> Dict[str, Dict[str, Any]]:
        """Each open lane's store counters for its operations."""
        out = {}
        for name, lane in list(self._lanes.items()):
            ops = ("exists", "get") if name.endswith("read") else ("put",)
            out[name] = {op: lane.store.stats(op) for op in ops}
        return out

    def __repr__(self) -> str:
        path = "zero-copy" if self.zero_copy else ("staging" if self.mem_pool_host is not None else "no pool")
        return f"<kvtier.sglang.KvtierStorage {getattr(self, 'url', '?')} {path}>"

