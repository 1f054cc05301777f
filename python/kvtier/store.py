"""The L3 store (store.h): page objects in a directory, a Redis server or a
Redis Cluster, keyed by the chained page hash and the model identity, every
object checked on get."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from . import _fields
from ._core import Handle, c_str, check, error, hash_arg, wait_ticket
from ._lib import STORE_LOG, StoreConfig, StoreDone, StorePage, StoreStats, lib

__all__ = ["Store", "StoreResult", "OPS", "RESULTS"]

OPS = ("exists", "get", "put", "remove")
RESULTS = ("ok", "miss", "bad", "failed")
STORE_STATS = tuple(f for f, _, _ in _fields.STORE_STATS)


class StoreResult(NamedTuple):
    """A batch the store has answered: a result per key ("ok", "miss", "bad":
    an object that failed its checks, never served; "failed": the store was
    down, timed out or full) and ``count`` (exists: the leading keys present;
    others: the keys that were "ok")."""
    ticket: int
    user: int
    op: str
    status: str
    results: Tuple[str, ...]
    pages: Tuple[int, ...]
    count: int
    latency_ns: int


def _pages(items: Iterable[Any], with_page: bool) -> Tuple[Any, int]:
    items = list(items)
    arr = (StorePage * max(len(items), 1))()
    for i, it in enumerate(items):
        if with_page:
            try:
                h, p = it
            except (TypeError, ValueError):
                raise TypeError(f"key {i}: expected (page_hash, tier_page)") from None
            if not isinstance(p, int) or not 0 <= p < 1 << 32:
                raise ValueError(f"key {i}: tier page {p!r} out of range")
            arr[i].page = p
        else:
            h = it
        arr[i].hash = hash_arg(h)
    return arr, len(items)


class Store(Handle):
    """A store opened from a URL, the URLs of ``kvtier replay --l3``::

        dir:PATH[,max=SIZE]   redis://HOST:PORT   redis-cluster://H:P[,H:P...]

    ``tier`` is the host tier gets write into and puts read from (page by
    page; None for a store used for exists/remove only). ``model`` and the
    geometry (page_tokens, layers, layer_bytes, dtype_bytes, the TP and CP
    shard, the namespace ``ns``) make the model identity in every key, so two
    models or shards never share an object. Calls are batches that complete
    asynchronously (``poll``/``wait``); ``exists_sync`` and friends submit and
    wait in one call. The store can be used from any thread; poll from one."""

    def __init__(self, url: str, tier: Any = None, model: str = "", page_tokens: int = 0, layers: int = 0,
                 layer_bytes: int = 0, dtype_bytes: int = 2, tp: Tuple[int, int] = (0, 1),
                 cp: Tuple[int, int] = (0, 1), ns: str = "default", threads: int = 2, timeout_ms: int = 2000,
                 retries: int = 8, delay_us: int = 0, log: Optional[Any] = None) -> None:
        super().__init__()
        cfg = StoreConfig()
        lib.kvt_store_config_default(ctypes.byref(cfg))
        cfg.tier = tier._ptr if tier is not None else None
        self._model = c_str(model) if model else None
        self._ns = c_str(ns)
        cfg.model, cfg.page_tokens, cfg.layers, cfg.layer_bytes = self._model, page_tokens, layers, layer_bytes
        cfg.dtype_bytes = dtype_bytes
        cfg.tp_rank, cfg.tp_size = tp
        cfg.cp_rank, cfg.cp_size = cp
        cfg.ns, cfg.threads, cfg.timeout_ms, cfg.retries, cfg.delay_us = self._ns, threads, timeout_ms, retries, delay_us
        self._log = None
        if log is not None:  # called on a worker thread with each message
            self._log = STORE_LOG(lambda _arg, msg: log(msg.decode(errors="replace")))
            cfg.log = ctypes.cast(self._log, ctypes.c_void_p)
        h = ctypes.c_void_p()
        rc = lib.kvt_store_open(ctypes.byref(h), url.encode(), ctypes.byref(cfg))
        if rc < 0:
            raise error(rc, f"Store({url!r})", lib.kvt_store_last_error(None).decode())
        self._own(h.value, (tier,) if tier is not None else ())
        self.tier = tier
        self._done: Dict[int, StoreResult] = {}

    def _destroy(self, h: int) -> None:
        lib.kvt_store_close(h)

    @property
    def url(self) -> str:
        return lib.kvt_store_url(self._ptr).decode()

    @property
    def backend(self) -> str:
        """"dir", "redis" or "redis-cluster"."""
        return lib.kvt_store_backend(self._ptr).decode()

    @property
    def last_error(self) -> str:
        return lib.kvt_store_last_error(self._ptr).decode()

    @property
    def object_bytes(self) -> int:
        return lib.kvt_store_object_bytes(self._ptr)

    def key(self, page_hash: Any) -> str:
        """The 32-hex-digit key of a page hash under this store's identity."""
        buf = ctypes.create_string_buffer(33)
        h = hash_arg(page_hash)
        lib.kvt_store_key(self._ptr, ctypes.byref(h), buf)
        return buf.value.decode()

    # -- batches ---------------------------------------------------------------

    def _submit(self, fn, op: str, items: Iterable[Any], with_page: bool, user: int) -> int:
        arr, n = _pages(items, with_page)
        t = ctypes.c_uint64()
        check(fn(self._ptr, arr, n, user, ctypes.byref(t)), f"Store.{op}",
              "no keys, a tier page out of range or twice, or no tier" if with_page else "no keys")
        return t.value

    def exists(self, hashes: Iterable[Any], user: int = 0) -> int:
        """Queues an exists batch of page hashes; the ticket."""
        return self._submit(lib.kvt_store_exists, "exists", hashes, False, user)

    def get(self, pages: Iterable[Tuple[Any, int]], user: int = 0) -> int:
        """Queues gets of (page_hash, tier_page): each object checked, then
        written into its tier page (which belongs to the store until polled)."""
        return self._submit(lib.kvt_store_get, "get", pages, True, user)

    def put(self, pages: Iterable[Tuple[Any, int]], user: int = 0) -> int:
        """Queues puts of (page_hash, tier_page)."""
        return self._submit(lib.kvt_store_put, "put", pages, True, user)

    def remove(self, hashes: Iterable[Any], user: int = 0) -> int:
        return self._submit(lib.kvt_store_remove, "remove", hashes, False, user)

    def poll(self, timeout: float = 0.0, max: int = 64) -> List[StoreResult]:
        """Batches answered (waiting up to ``timeout`` seconds for the first)."""
        out = (StoreDone * max)()
        got = check(lib.kvt_store_poll(self._ptr, out, max, int(timeout * 1e9)), "Store.poll")
        res = []
        for d in out[:got]:
            res.append(StoreResult(d.ticket, d.user, OPS[d.op], lib.kvt_err_name(d.status).decode(),
                                   tuple(RESULTS[d.results[i]] for i in range(d.n)),
                                   tuple(d.pages[i].page for i in range(d.n)), d.count, d.latency_ns))
        return res

    def wait(self, ticket: int, timeout: float = 60.0) -> StoreResult:
        """One batch's answer (others polled meanwhile wait for their own wait())."""
        return wait_ticket(self._done, ticket, self.poll, timeout, "Store.wait")

    def exists_sync(self, hashes: Sequence[Any]) -> StoreResult:
        return self.wait(self.exists(hashes))

    def get_sync(self, pages: Sequence[Tuple[Any, int]]) -> StoreResult:
        return self.wait(self.get(pages))

    def put_sync(self, pages: Sequence[Tuple[Any, int]]) -> StoreResult:
        return self.wait(self.put(pages))

    def remove_sync(self, hashes: Sequence[Any]) -> StoreResult:
        return self.wait(self.remove(hashes))

    @property
    def pending(self) -> int:
        return lib.kvt_store_pending(self._ptr)

    def stats(self, op: str) -> Dict[str, Any]:
        """One operation's counters, with latency percentiles (ns)."""
        if op not in OPS:
            raise ValueError(f"Store.stats: unknown op {op!r} (choose from {', '.join(OPS)})")
        st = StoreStats(size=ctypes.sizeof(StoreStats))
        check(lib.kvt_store_stats(self._ptr, OPS.index(op), ctypes.byref(st)), "Store.stats")
        out: Dict[str, Any] = {n: getattr(st, n) for n in STORE_STATS}
        out["stored_bytes"], out["stored_objects"] = st.stored_bytes, st.stored_objects
        h = st.latency_ns
        out["latency_ns"] = {q: lib.kvt_hist_percentile(ctypes.byref(h), v)
                             for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))} if h.count else {}
        return out

    def __repr__(self) -> str:
        return "<kvtier.Store closed>" if self.closed else f"<kvtier.Store {self.url}>"

