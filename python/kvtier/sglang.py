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
same object format, so either path reads what the other wrote. (The
whole-page layouts, page_first_direct and page_head, refuse such a batch.)

The tensor calls (get, set, batch_get, batch_set: SGLang's generic path,
without ``interface_v1``) copy flat pages (``get_data_page`` tensors)
through a staging tier. They keep their own object format: a flat page's
byte order differs from the pointer order for layer_first pools. Before a
pool is registered, they (and exists, batch_exists) store any tensor's
bytes whole, as SGLang's file backend does (_sglang_objects.py).

Keys: an SGLang key (any string) becomes the 16-byte page hash
BLAKE2b-128(key) (lo, hi little-endian). The store's identity digest adds
the model (``model_name``), the TP shard (none for MLA, whose KV every rank
holds alike), the CP shard, the page size, the geometry, the dtype and a
namespace ``<namespace>[/pp<r>of<n>][/mla[/dcp<r>of<n>/tp<n>/page<n>]]/sglang-<v1|flat>/<layout>/<dtype>``,
so objects of two models, shards, layouts or formats never meet.

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
one lane. A registered pool (its engine tier and lanes) is one object,
built whole and swapped in by register_mem_pool_host: a call runs on the
pool it started on, and an old pool closes when its last call is done.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import operator
import threading
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from . import _args as _a
from ._core import Error
from ._sglang_objects import Objects, tensor_bytes
from .tier import HostMaps
from ._sglang_pool import STORAGE_BATCH_SIZE, _meta, _Registration
from .store import Store

__all__ = ["KvtierStorage", "HiCacheStorage", "key_hash", "STORAGE_BATCH_SIZE"]

logger = logging.getLogger("kvtier.sglang")


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

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

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


# Host pool layouts whose pages are whole blocks: get_page_buffer_meta of a
# token index that does not start a page points into the middle of one and
# gives a whole page's bytes from there (two pages corrupted), where SGLang's
# own page calls round the index down to its page. SGLang's controller never
# sends such an index; one is refused.
_WHOLE_PAGE_LAYOUTS = frozenset({"page_first_direct", "page_head"})
_KVTIER_KEYS = frozenset({"l3", "namespace", "model", "interface_v1", "threads", "timeout_ms", "retries"})
# what SGLang itself reads from the same JSON: the dynamic loader's, the controller's, the scheduler's
_SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
                          "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                          "hicache_storage_pass_prefix_keys", "canonical_dcp_size"})


def _int_option(extra: dict, name: str, default: int, lo: int, hi: int) -> int:
    v = extra.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"KvtierStorage: extra_config {name!r} = {v!r} (expected an integer {lo}..{hi})")
    return v


def _bool_option(v: Any, name: str) -> bool:
    """A boolean option (_args.option_flag); None is False."""
    on = False if v is None else _a.option_flag(v)
    if on is None:
        raise ValueError(f"KvtierStorage: {name} = {v!r} (expected true/false, 1/0, yes/no or on/off)")
    return on


def _interface_v1(v: Any) -> bool:
    """interface_v1, parsed strictly, and refused where SGLang would read it
    otherwise: its controller takes bool(value), so the string "false" turns
    its zero-copy calls on while meaning off."""
    on = _bool_option(v, "extra_config 'interface_v1'")
    if on != bool(v):
        raise ValueError(f"KvtierStorage: extra_config 'interface_v1' = {v!r}: SGLang reads it as bool(), "
                         f"which is {bool(v)} for this value: write JSON {str(on).lower()} or {int(on)}, "
                         "not a string")
    return on


def _int_field(storage_config: Any, name: str, default: int) -> int:
    """An integer field of the storage config (an int, or a str of one)."""
    v = _cfg(storage_config, name, default)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise ValueError(f"KvtierStorage: {name} = {v!r} (expected an integer)") from None
    if isinstance(v, bool):
        raise TypeError(f"KvtierStorage: {name} = {v!r} (expected an integer)")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"KvtierStorage: {name} = {v!r} (expected an integer)") from None


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

    Other keys are SGLang's own (ignored) or unknown (a warning names them).
    ``kwargs`` (a dict) may hold ``mem_pool_host``; SGLang registers the host
    pool with :meth:`register_mem_pool_host` right after construction.
    Before that, the tensor calls (get, set, their batch forms, exists,
    batch_exists) store tensors whole as objects, as SGLang's file backend
    does; batch_get_v1/batch_set_v1 need the pool."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[dict] = None, *,
                 mem_pool_host: Any = None) -> None:
        self._reg: Optional[_Registration] = None
        self._closed = False
        self._inside = threading.local()  # depth: this thread is in one of our calls (the pool may call back)
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"KvtierStorage: kwargs is a {type(kwargs).__name__}, expected a dict (SGLang's)")
        extra = _cfg(storage_config, "extra_config", {})
        if not isinstance(extra, dict):
            raise TypeError(f"KvtierStorage: extra_config is a {type(extra).__name__}, expected a dict")
        unknown = sorted(str(k) for k in extra if k not in _KVTIER_KEYS and k not in _SGLANG_KEYS)
        if unknown:
            logger.warning("KvtierStorage: extra_config key%s %s mean%s nothing to kvtier or SGLang: ignored "
                           "(kvtier's keys: %s)", "s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)),
                           "" if len(unknown) > 1 else "s", ", ".join(sorted(_KVTIER_KEYS)))
        url = extra.get("l3")
        if not isinstance(url, str) or not url or "\0" in url:
            raise ValueError('KvtierStorage: --hicache-storage-backend-extra-config has no "l3" store URL '
                             f'(dir:PATH, redis://HOST:PORT or redis-cluster://H:P[,H:P...]): {url!r}')
        model = extra.get("model")
        if model is None:
            model = _cfg(storage_config, "model_name", "")
            if not isinstance(model, str):
                raise TypeError(f"KvtierStorage: model_name = {model!r} (expected a str)")
        elif not isinstance(model, str) or "\0" in model:
            raise ValueError(f"KvtierStorage: extra_config 'model' = {model!r} (expected a str)")
        if not model or "\0" in model:
            raise ValueError('KvtierStorage: no model identity: SGLang passes none (set --served-model-name) '
                             f'and extra_config has no "model" ({model!r})')
        ns = extra.get("namespace", "sglang")
        if not isinstance(ns, str) or not ns or "\0" in ns:
            raise ValueError(f"KvtierStorage: extra_config 'namespace' = {ns!r} (expected a non-empty string)")
        self._opts = dict(threads=_int_option(extra, "threads", 2, 1, 64),
                          timeout_ms=_int_option(extra, "timeout_ms", 2000, 1, 600000),
                          retries=_int_option(extra, "retries", 8, 0, 1000))
        self.is_mla = _bool_option(_cfg(storage_config, "is_mla_model", False), "is_mla_model")
        tp = (_int_field(storage_config, "tp_rank", 0), _int_field(storage_config, "tp_size", 1))
        cp = (_int_field(storage_config, "attn_cp_rank", 0), _int_field(storage_config, "attn_cp_size", 1))
        pp = (_int_field(storage_config, "pp_rank", 0), _int_field(storage_config, "pp_size", 1))
        dcp = (_int_field(storage_config, "dcp_rank", 0), _int_field(storage_config, "dcp_size", 1))
        for what, (r, s) in (("tp", tp), ("attn_cp", cp), ("pp", pp), ("dcp", dcp)):
            if not 0 <= r < s:
                raise ValueError(f"KvtierStorage: {what} rank {r} of {s}")
        self.model = model
        self.tp = (0, 1) if self.is_mla else tp  # MLA: every rank holds the same latents
        self.cp = cp
        # MLA's shared latents are not TP shard 0 of 1: "/mla" keeps them apart from a one-rank MHA instance
        self.namespace = ns + (f"/pp{pp[0]}of{pp[1]}" if pp[1] > 1 else "") + ("/mla" if self.is_mla else "") + \
            self._dcp_ns(storage_config, tp, dcp)
        self.interface_v1 = _interface_v1(extra.get("interface_v1"))
        try:  # the URL and the store's reachability, checked now rather than at the first page
            with Store(url, model=model, page_tokens=1, layers=1, layer_bytes=1, ns=ns, **self._opts) as probe:
                self.url, self.backend = probe.url, probe.backend
        except Error as e:
            kind = ConnectionError if e.name == "KVT_EIO" else ValueError
            raise kind(f"KvtierStorage: cannot open the L3 store \"l3\": {url!r}: {e}") from e
        self.mem_pool_host = None
        self._reg_lock = threading.Lock()  # registrations and close, one at a time
        self._objects = Objects(url, dict(model=model, tp=self.tp, cp=self.cp, ns=self.namespace), self._opts)
        pool = mem_pool_host if mem_pool_host is not None else (kwargs or {}).get("mem_pool_host")
        if pool is not None:
            self.register_mem_pool_host(pool)

    def _dcp_ns(self, storage_config: Any, tp: Tuple[int, int], dcp: Tuple[int, int]) -> str:
        """The namespace part of an MLA DCP shard: under decode context
        parallelism each DCP rank holds a slice of every logical page, so
        the shard, the TP width and the logical page size are identity."""
        if dcp[1] == 1:
            return ""
        if not self.is_mla:
            raise ValueError(f"KvtierStorage: dcp_size {dcp[1]} without is_mla_model (DCP shards MLA latents only)")
        page = _int_field(storage_config, "logical_page_size", 0)
        if page < 1 or page % dcp[1] or tp[0] % dcp[1] != dcp[0]:
            raise ValueError(f"KvtierStorage: DCP rank {dcp[0]} of {dcp[1]} with tp rank {tp[0]} of {tp[1]} and "
                             f"logical_page_size {page} (expected a page divisible by dcp_size, "
                             "and tp_rank % dcp_size == dcp_rank)")
        return f"/dcp{dcp[0]}of{dcp[1]}/tp{tp[1]}/page{page}"

    # -- the host pool ---------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers SGLang's host pool: its geometry fixes the store identity
        and, where the pool's pointers allow, an engine tier over its memory.
        Calling it again replaces the pool: the new one is set up whole first,
        then swapped in; calls already running finish on the old one, which
        closes after them. A failure (a pool without buffers or of two sizes,
        the store down) raises and changes nothing."""
        self._not_inside("register_mem_pool_host")
        with self._reg_lock, self._call():
            self._check_open()
            try:
                new = _Registration(mem_pool_host, dict(model=self.model, tp=self.tp, cp=self.cp, ns=self.namespace),
                                    self.url, self._opts, self.interface_v1)
            except Error as e:
                if e.name != "KVT_EIO":
                    raise
                raise ConnectionError(f"KvtierStorage.register_mem_pool_host: cannot open the L3 store {self.url!r}: "
                                      f"{e}") from e
            try:
                super().register_mem_pool_host(mem_pool_host)  # SGLang's base records it
            except BaseException:
                new.retire()
                raise
            old, self._reg = self._reg, new
            self.mem_pool_host = mem_pool_host
            if old is not None:
                old.retire()

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's hybrid controller registers every host pool of the group
        here: the KV pool registered by register_mem_pool_host is taken; any
        other (a hybrid model's Mamba or SWA state, a DSA indexer, a draft
        model's pool for speculative decoding) is refused, which fails SGLang's
        attach or the pool's registration with this message, since kvtier
        stores the KV pages alone (the v2 calls are not implemented): without
        it every v2 call would raise, logged on every request and backup."""
        self._check_open()
        if host_pool is not None and host_pool is self.mem_pool_host:
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            return
        raise ValueError(f"KvtierStorage: host pool {host_pool_name!r} ({type(host_pool).__name__}) is not the KV pool "
                         "registered by register_mem_pool_host: kvtier stores the KV pages alone, not a hybrid "
                         "model's other state (Mamba, SWA, indexer) nor a speculative draft model's pool; run this "
                         "model without the storage backend")

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        self._inside.depth = getattr(self._inside, "depth", 0) + 1
        try:
            yield
        finally:
            self._inside.depth -= 1

    def _not_inside(self, what: str) -> None:
        """Registering or closing waits for the calls running; from inside one
        (a pool whose get_page_buffer_meta calls back) it would wait for itself."""
        if getattr(self._inside, "depth", 0):
            raise RuntimeError(f"KvtierStorage.{what}: called from inside another KvtierStorage call on this "
                               "thread (the pool's get_page_buffer_meta?): it would wait for that call to end")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("KvtierStorage is closed (close() was called): make a new one")

    @contextlib.contextmanager
    def _registered(self) -> Iterator[_Registration]:
        """The current registration, kept open for the call (a re-registration meanwhile waits for it)."""
        while True:
            reg = self._reg
            if reg is None:
                self._check_open()
                raise RuntimeError("KvtierStorage: no host pool registered (call register_mem_pool_host first)")
            if reg.enter():
                break
        try:
            with self._call():
                yield reg
        finally:
            reg.leave()

    @property
    def zero_copy(self) -> bool:
        """batch_get_v1/batch_set_v1 move pages straight between the store and the pool."""
        reg = self._reg
        return reg is not None and reg.plan is not None

    page_size = property(lambda self: self._current().page_size, doc="the registered pool's tokens per page")
    pages = property(lambda self: self._current().pages, doc="the registered pool's pages")
    page_bytes = property(lambda self: self._current().page_bytes, doc="the bytes of one page (every buffer)")
    layout = property(lambda self: self._current().layout, doc="the registered pool's layout name")

    @property
    def staging_reason(self) -> str:
        """Why the registered pool goes through staging ("" when it does not)."""
        reg = self._reg
        return reg.staging_reason if reg is not None else ""

    def _current(self) -> _Registration:
        reg = self._reg
        if reg is None:
            self._check_open()
            raise RuntimeError("KvtierStorage: no host pool registered (call register_mem_pool_host first)")
        return reg

    def page_addresses(self, page: int) -> List[int]:
        """The addresses the engine tier uses for a host page, in the order of
        the pool's get_page_buffer_meta (for checks against it)."""
        with self._registered() as reg:
            if reg.plan is None:
                raise ValueError(f"page_addresses: no engine tier ({reg.staging_reason})")
            if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < reg.pages:
                raise IndexError(f"page {page!r} out of range (the pool has {reg.pages} pages)")
            p = reg.plan
            return [reg.engine.plane_addr(q, page, layer) for layer in range(p.layers) for q in range(p.planes)]

    def store_key(self, key: str, fmt: Optional[str] = None) -> str:
        """The store's 32-hex-digit key of an SGLang key (the Redis key is
        "kvt:<hex>", the dir file PATH/<hex[0:2]>/<hex>), in the v1
        or the flat format (default: the one exists looks for)."""
        fmt = fmt or ("v1" if self.interface_v1 else "flat")
        if fmt not in ("v1", "flat"):
            raise ValueError(f"store_key: format {fmt!r} (choose v1 or flat)")
        with self._registered() as reg:
            lane = reg.lane("flat-stage-read" if fmt == "flat" else "zc-read" if reg.plan else "v1-stage-read")
            return lane.store.key(key_hash(key))

    def close(self) -> None:
        """Closes the stores and tiers (SGLang calls it on detach); idempotent.
        Calls running on other threads finish first; later calls raise
        RuntimeError ("KvtierStorage is closed")."""
        self._not_inside("close")
        with self._reg_lock:
            self._closed = True
            old, self._reg = self._reg, None
            self.mem_pool_host = None
        if old is not None:
            old.retire()
        self._objects.close()

    def __enter__(self) -> "KvtierStorage":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- exists ------------------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys, from the first, the store holds (0 when it is down)."""
        keys = _keys(keys)
        if self._pool_less():
            return self._objects.exists(keys, key_hash) if keys else 0
        with self._registered() as reg:
            if not keys:
                return 0
            lane = reg.exists_lane(self.interface_v1, soft=True)
            if lane is None:
                return 0
            with lane.lock:
                return lane.leading_of(keys, key_hash)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- zero copy: host pages by index ------------------------------------------

    @staticmethod
    def _host_pages(reg: _Registration, keys: List[str], host_indices: Any) -> Tuple[List[int], bool, List[int]]:
        """Each key's first token index in the pool, whether all are
        page-aligned, and the indices as a list."""
        ps = reg.page_size
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
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= reg.size - ps:
                raise IndexError(f"host_indices[{i * ps}] = {t!r}: not a page of the pool ({reg.size} tokens)")
        aligned = all(t % ps == 0 for t in starts)
        layout = getattr(reg.pool, "layout", None)
        if not aligned and layout in _WHOLE_PAGE_LAYOUTS:
            i = next(i for i, t in enumerate(starts) if t % ps)
            raise ValueError(f"host_indices[{i * ps}] = {starts[i]}: not the first token of a page, which a "
                             f"{layout} pool needs (its pages are whole: a page's buffers start at its first token)")
        return starts, aligned, flat

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Loads each key's page into the host pool at host_indices (page i
        at host_indices[i * page_size]); True per page served, False for a
        miss, an object that failed its checks, or a store that is down."""
        keys = _keys(keys)
        with self._registered() as reg:
            starts, aligned, flat = self._host_pages(reg, keys, host_indices)
            if not keys:
                return []
            pages = [t // reg.page_size for t in starts]
            runs = sorted(starts)  # each key loads tokens [start, start + page_size)
            if any(b - a < reg.page_size for a, b in zip(runs, runs[1:])):
                raise ValueError("batch_get_v1: two keys' host pages overlap (two keys cannot load into one page)")
            if reg.plan is not None and aligned:
                return self._direct(reg, "zc-read", "get", keys, pages)
            return self._staged_v1(reg, "get", keys, flat)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores each host page under its key; True per page stored."""
        keys = _keys(keys)
        with self._registered() as reg:
            starts, aligned, flat = self._host_pages(reg, keys, host_indices)
            if not keys:
                return []
            if reg.plan is not None and aligned:
                return self._direct(reg, "zc-write", "put", keys, [t // reg.page_size for t in starts])
            return self._staged_v1(reg, "put", keys, flat)

    @staticmethod
    def _direct(reg: _Registration, name: str, op: str, keys: List[str], pages: List[int]) -> List[bool]:
        items = [(key_hash(k), p) for k, p in zip(keys, pages)]
        lane = reg.lane(name, soft=True)
        if lane is None:
            return [False] * len(keys)
        with lane.lock:
            results = lane.run(op, items)
        return [r == "ok" for r in results] if results is not None else [False] * len(keys)

    @classmethod
    def _staged_v1(cls, reg: _Registration, op: str, keys: List[str], flat: List[int]) -> List[bool]:
        """Pages copied between the pool's buffers and a staging tier. Every
        page's buffers are checked before the first chunk runs: a refusal
        changes nothing."""
        import torch
        pool, ps = reg.pool, reg.page_size
        lane = reg.lane("v1-stage-read" if op == "get" else "v1-stage-write", soft=True)
        if lane is None:
            return [False] * len(keys)
        every = [_meta(pool, torch.tensor(flat[i * ps:(i + 1) * ps], dtype=torch.int64)) for i in range(len(keys))]
        for ptrs, sizes in every:
            if sum(sizes) != reg.page_bytes:
                raise ValueError(f"get_page_buffer_meta: {sum(sizes)} bytes for a page, "
                                 f"registered pages hold {reg.page_bytes}")
            reg.memory.check(ptrs, sizes, "get_page_buffer_meta")
        out: List[bool] = []
        with lane.lock:
            cap = lane.tier.pages
            for c in range(0, len(keys), cap):
                chunk = keys[c:c + cap]
                metas = every[c:c + cap]
                if op == "put":
                    for i, (ptrs, sizes) in enumerate(metas):
                        cls._gather(lane.page_addr(i), ptrs, sizes)
                results = lane.run(op, [(key_hash(k), i) for i, k in enumerate(chunk)])
                ok = [r == "ok" for r in results] if results is not None else [False] * len(chunk)
                if op == "get":
                    for i, (ptrs, sizes) in enumerate(metas):
                        if ok[i]:
                            cls._scatter(lane.page_addr(i), ptrs, sizes)
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

    @staticmethod
    def _flat(reg: _Registration, t: Any, what: str, write: bool, maps: Optional[HostMaps] = None) -> int:
        """The address of a flat page tensor (contiguous host memory of one page)."""
        ptr, nbytes = tensor_bytes(t, what, write, maps)
        if nbytes != reg.page_bytes:
            raise ValueError(f"{what}: {nbytes} bytes, a page of the registered pool is {reg.page_bytes}")
        return ptr

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores flat pages (get_data_page tensors); True when all were stored."""
        keys = _keys(keys)
        if values is None or len(values) != len(keys):
            raise ValueError(f"batch_set: {len(keys)} keys and {'no' if values is None else len(values)} values")
        if self._pool_less():
            got = [tensor_bytes(v, f"values[{i}]", False) for i, v in enumerate(values)]
            return all(self._objects.put([key_hash(k) for k in keys], [a for a, _ in got], [n for _, n in got]))
        with self._registered() as reg:
            addrs = [self._flat(reg, v, f"values[{i}]", False) for i, v in enumerate(values)]
            ok = self._staged_flat(reg, "put", keys, addrs)
        return all(ok)  # an empty batch stored all it was given, as HiCacheFile answers

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Flat pages, into target_locations when given (else new tensors of
        the pool's dtype); None for each key not served."""
        keys = _keys(keys)
        if target_locations is not None and len(target_locations) != len(keys):
            raise ValueError(f"batch_get: {len(keys)} keys and {len(target_locations)} target locations")
        if self._pool_less():
            return self._get_objects(keys, target_locations)
        with self._registered() as reg:
            if target_locations is None:
                import torch
                target_locations = [torch.empty(reg.page_bytes // reg.dtype_bytes, dtype=reg.pool.dtype)
                                    for _ in keys]
            elif len(target_locations) != len(keys):
                raise ValueError(f"batch_get: {len(keys)} keys and {len(target_locations)} target locations")
            maps = HostMaps()  # one look at the process's mappings for the batch's targets
            addrs = [self._flat(reg, t, f"target_locations[{i}]", True, maps) for i, t in enumerate(target_locations)]
            ok = self._staged_flat(reg, "get", keys, addrs)
        return [t if k else None for t, k in zip(target_locations, ok)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def _pool_less(self) -> bool:
        """No host pool registered (and not closed): the tensor calls store objects."""
        if self._reg is not None:
            return False
        self._check_open()
        return True

    def _get_objects(self, keys: List[str], targets: Any) -> List[Any]:
        """Objects into the targets, or into new uint8 tensors of each object's recorded size."""
        hashes = [key_hash(k) for k in keys]
        own = targets is None  # new tensors of the recorded sizes: writable, and the records read already
        if own:
            import torch
            sizes = self._objects.sizes(hashes)
            targets = [torch.empty(n, dtype=torch.uint8) if n else None for n in sizes]
            live = [i for i, t in enumerate(targets) if t is not None]
        else:
            live = list(range(len(keys)))
        maps = None if own else HostMaps()  # one look at the process's mappings for the caller's targets
        got = {i: tensor_bytes(targets[i], f"target_locations[{i}]", not own, maps) for i in live}
        ok = self._objects.get([hashes[i] for i in live], [got[i][0] for i in live], [got[i][1] for i in live],
                               recorded=[sizes[i] for i in live] if own else None)
        served = {i for i, g in zip(live, ok) if g}
        return [targets[i] if i in served else None for i in range(len(keys))]

    @staticmethod
    def _staged_flat(reg: _Registration, op: str, keys: List[str], addrs: List[int]) -> List[bool]:
        if not keys:
            return []
        lane = reg.lane("flat-stage-read" if op == "get" else "flat-stage-write", soft=True)
        if lane is None:
            return [False] * len(keys)
        out: List[bool] = []
        n = reg.page_bytes
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
        """Refused: the store is shared (by instances, by a fleet) and its
        objects are not this instance's to drop. SGLang's storage attachment
        catches this, logs it and returns False (its scheduler's reply in
        0.5.23 says success whatever that is), instead of the silence of an
        empty store that still serves every page."""
        raise RuntimeError("KvtierStorage.clear: the store is shared by every instance on it; empty it with the "
                           "store's own tools (a dir: store's folder, redis-cli FLUSHDB), or give the instances "
                           "a new namespace (extra config 'namespace')")

    def get_stats(self):
        return None

    def stats(self) -> Dict[str, Dict[str, Any]]:
        """Each open lane's store counters for its operations ({} with no pool registered)."""
        if self._reg is None:
            return {}
        out = {}
        with self._registered() as reg:
            for name, lane in list(reg.lanes.items()):
                ops = ("exists", "get") if name.endswith("read") else ("put",)
                out[name] = {op: lane.store.stats(op) for op in ops}
        return out

    def __repr__(self) -> str:
        reg = self._reg
        path = "closed" if self._closed else "no pool" if reg is None else \
            "zero-copy" if reg.plan is not None else "staging"
        return f"<kvtier.sglang.KvtierStorage {getattr(self, 'url', '?')} {path}>"
