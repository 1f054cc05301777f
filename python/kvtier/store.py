"""The L3 store (store.h): page objects in a directory, a Redis server or a
Redis Cluster, keyed by the chained page hash and the model identity, every
object checked on get."""
from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from . import _args as _a
from . import _fields
from ._core import ClosedError, Handle, IOFailure, Tickets, check, error, hash_arg, in_callback, poll_sliced, wait_ticket
from ._lib import STORE_LOG, StoreConfig, StoreDone, StorePage, StoreStats, lib

__all__ = ["Store", "StoreResult", "OPS", "RESULTS"]

OPS = ("exists", "get", "put", "remove")
RESULTS = ("ok", "miss", "bad", "failed")
STORE_STATS = tuple(f for f, _, _ in _fields.STORE_STATS)


def _redacted(url: bytes) -> str:
    """The URL with the password of its credentials replaced by ***: errors never show it."""
    buf = ctypes.create_string_buffer(len(url) + 8)
    return lib.kvt_store_url_redact(url, buf, len(buf)).decode(errors="replace")


def _log_callback(store: "Store", log: Any) -> Any:
    """log(message) on a worker thread, as the C log: a call into the store
    from it (a close, a wait on the worker's own batch), or into the cache
    that drives the store (which may be waiting on this very batch, holding
    its lock), is refused, and nothing it raises gets into C. The worker is
    remembered: a store whose last reference goes while its log runs is
    closed from another thread (a worker cannot wait for itself)."""
    ref = weakref.ref(store)  # the store holds the callback: no cycle through it

    def call(_arg: Any, msg: bytes) -> None:
        _in_log.depth = getattr(_in_log, "depth", 0) + 1
        try:
            s = ref()
            with in_callback(s), in_callback(s._driven_by() if s is not None else None):
                del s  # (the context managers hold it while the log runs: the last reference may go with them)
                log(msg.decode(errors="replace"))
        except BaseException:  # noqa: B036 - an exception must not unwind through C
            pass  # (a log that fails loses its line, nothing else)
        finally:
            _in_log.depth -= 1

    return call


_in_log = threading.local()  # depth: the thread runs a store's log (a worker's, or a sync call's)


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


_PAGE_SIZE = ctypes.sizeof(StorePage)
_PAGE_PAD = bytes(_PAGE_SIZE - 20)  # after the hash (16 bytes) and the page (4)
_NO_PAGE = bytes(_PAGE_SIZE - 16)
_PAGE_AT = struct.Struct(f"<{StorePage.page.offset}xI{_PAGE_SIZE - StorePage.page.offset - 4}x")


def _packed(items: List[Any], with_page: bool) -> Optional[bytes]:
    """The items as the C array's bytes when every hash is 16 bytes (and every
    page a u32), the form SGLang's backend passes: one join instead of a
    field by field fill, which costs microseconds a key. None otherwise."""
    try:
        if with_page:
            if all(type(h) is bytes and len(h) == 16 and type(p) is int and 0 <= p <= 0xFFFFFFFF for h, p in items):
                return b"".join([h + p.to_bytes(4, "little") + _PAGE_PAD for h, p in items])
        elif all(type(h) is bytes and len(h) == 16 for h in items):
            return b"".join([h + _NO_PAGE for h in items])
    except (TypeError, ValueError):  # not pairs: the slow path names the item
        pass
    return None


def _pages(items: Iterable[Any], with_page: bool) -> Tuple[Any, int]:
    if isinstance(items, (str, bytes)):
        raise TypeError(f"keys: expected a list of {'(page_hash, tier_page)' if with_page else 'page hashes'}, "
                        f"not {type(items).__name__}")
    items = list(items)
    packed = _packed(items, with_page) if items else None
    if packed is not None:  # 16-byte hashes are (lo, hi) little-endian, as hash_arg reads them
        return (StorePage * len(items)).from_buffer_copy(packed), len(items)
    arr = (StorePage * max(len(items), 1))()
    for i, it in enumerate(items):
        if with_page:
            try:
                h, p = it
            except (TypeError, ValueError):
                raise TypeError(f"key {i}: expected (page_hash, tier_page)") from None
            try:
                arr[i].page = _a.u32(p, f"key {i}: tier page")
            except ValueError:
                raise ValueError(f"key {i}: tier page {p!r} out of range") from None
        else:
            h = it
        arr[i].hash = hash_arg(h, f"key {i}: page hash")
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
    wait in one call. Any thread may call it, concurrently; polls (and the
    waits that poll) take turns; ``close`` waits for the calls in flight."""

    def __init__(self, url: str, tier: Any = None, model: str = "", page_tokens: int = 0, layers: int = 0,
                 layer_bytes: int = 0, dtype_bytes: int = 2, tp: Tuple[int, int] = (0, 1),
                 cp: Tuple[int, int] = (0, 1), ns: str = "default", threads: int = 2, timeout_ms: int = 2000,
                 retries: int = 8, log: Optional[Any] = None) -> None:
        super().__init__()
        from .tier import Tier
        w = "Store"
        url_b = _a.text(url, f"{w} url")
        _a.instance(tier, Tier, f"{w} tier", optional=True)
        cfg = StoreConfig()
        lib.kvt_store_config_default(ctypes.byref(cfg))
        self._model = _a.text(model, f"{w} model") or None
        self._ns = _a.text(ns, f"{w} ns")
        cfg.model, cfg.ns = self._model, self._ns
        cfg.page_tokens = _a.u32(page_tokens, f"{w} page_tokens")
        cfg.layers = _a.u32(layers, f"{w} layers")
        cfg.layer_bytes = _a.u64(layer_bytes, f"{w} layer_bytes")
        cfg.dtype_bytes = _a.u32(dtype_bytes, f"{w} dtype_bytes")
        cfg.tp_rank, cfg.tp_size = _a.u32_pair(tp, f"{w} tp")
        cfg.cp_rank, cfg.cp_size = _a.u32_pair(cp, f"{w} cp")
        cfg.threads = _a.u32(threads, f"{w} threads")
        cfg.timeout_ms = _a.u32(timeout_ms, f"{w} timeout_ms")
        cfg.retries = _a.u32(retries, f"{w} retries")
        self._log = None
        if log is not None:  # called on a worker thread with each message
            if not callable(log):
                raise TypeError(f"{w} log: expected a callable taking a str, not {type(log).__name__}")
            self._log = STORE_LOG(_log_callback(self, log))
            cfg.log = ctypes.cast(self._log, ctypes.c_void_p)
        h = ctypes.c_void_p()
        with (tier._use if tier is not None else _NoUse()) as tp_ptr:
            cfg.tier = tp_ptr
            rc = lib.kvt_store_open(ctypes.byref(h), url_b, ctypes.byref(cfg))
            if rc < 0:
                raise error(rc, f"Store({_redacted(url_b)!r})", lib.kvt_store_last_error(None).decode(errors="replace"))
            self._own(h.value, (tier,) if tier is not None else ())
        self.tier = tier
        self._done: Dict[int, StoreResult] = {}
        self._tickets = Tickets()

    def _close(self, wait: bool) -> None:
        if getattr(_in_log, "depth", 0) and threading.get_ident() not in self._in_callback:
            # finalized inside a log (it held the last reference; a close from the log itself is refused),
            # maybe on one of the store's own workers, which the close joins: another thread makes it,
            # holding the store (and so its tier) until it is done
            threading.Thread(target=self._close, args=(True,), name="kvtier-store-close").start()
            return
        super()._close(wait)

    def _destroy(self, h: int) -> None:
        lib.kvt_store_close(h)

    @property
    def url(self) -> str:
        with self._use as h:
            return lib.kvt_store_url(h).decode(errors="replace")

    @property
    def backend(self) -> str:
        """"dir", "redis" or "redis-cluster"."""
        with self._use as h:
            return lib.kvt_store_backend(h).decode()

    @property
    def last_error(self) -> str:
        with self._use as h:
            return lib.kvt_store_last_error(h).decode(errors="replace")  # (cut at a byte count)

    @property
    def object_bytes(self) -> int:
        with self._use as h:
            return lib.kvt_store_object_bytes(h)

    def key(self, page_hash: Any) -> str:
        """The 32-hex-digit key of a page hash under this store's identity."""
        buf = ctypes.create_string_buffer(33)
        ph = hash_arg(page_hash)
        with self._use as h:
            lib.kvt_store_key(h, ctypes.byref(ph), buf)
        return buf.value.decode()

    # -- batches ---------------------------------------------------------------

    def _submit(self, fn, op: str, items: Iterable[Any], with_page: bool, user: int) -> int:
        user = _a.u64(user, f"Store.{op} user")
        self._undriven(f"Store.{op}")
        arr, n = _pages(items, with_page)
        t = ctypes.c_uint64()
        with self._use as h:
            if with_page and self.tier is not None:
                self.tier._check_memory()
            check(fn(h, arr, n, user, ctypes.byref(t)), f"Store.{op}",
                  "no keys, a tier page out of range or twice, or no tier" if with_page else "no keys")
        return self._tickets.issued(t.value)

    def exists(self, hashes: Iterable[Any], user: int = 0) -> int:
        """Queues an exists batch of page hashes; the ticket."""
        return self._submit(lib.kvt_store_exists, "exists", hashes, False, user)

    def exists_leading(self, hashes: Iterable[Any]) -> int:
        """How many keys, from the first, are present, asked on the caller's
        thread (no worker's wake-up): a directory checks key by key up to
        the first absent one, Redis counts them in one command per node. A
        store that fails counts nothing present."""
        arr, n = _pages(hashes, False)
        if n == 0:
            return 0
        count = ctypes.c_size_t()
        with self._use as h:
            check(lib.kvt_store_exists_leading(h, arr, n, ctypes.byref(count)), "Store.exists_leading", "no keys")
        return count.value

    def get(self, pages: Iterable[Tuple[Any, int]], user: int = 0) -> int:
        """Queues gets of (page_hash, tier_page): each object checked, then
        written into its tier page (which belongs to the store until polled)."""
        return self._submit(lib.kvt_store_get, "get", pages, True, user)

    def put(self, pages: Iterable[Tuple[Any, int]], user: int = 0) -> int:
        """Queues puts of (page_hash, tier_page)."""
        return self._submit(lib.kvt_store_put, "put", pages, True, user)

    def remove(self, hashes: Iterable[Any], user: int = 0) -> int:
        return self._submit(lib.kvt_store_remove, "remove", hashes, False, user)

    def run(self, op: str, items: Iterable[Any]) -> Tuple[Tuple[str, ...], int]:
        """A batch on the caller's thread, returned when it is done (no
        worker's wake-up, no poll: what a small batch costs most): per-key
        results and the count (exists: the leading keys present; others:
        the keys "ok"). ``items`` as the op's asynchronous call takes them.
        One caller at a time goes through the store's context for callers."""
        if not isinstance(op, str) or op not in OPS:  # (an object equal to every op would pass `in`)
            raise ValueError(f"Store.run: op {op!r}: expected one of {', '.join(OPS)}")
        with_page = op in ("get", "put")
        self._undriven(f"Store.run({op})")
        arr, n = _pages(items, with_page)
        results = ctypes.create_string_buffer(max(n, 1))
        count = ctypes.c_size_t()
        with self._use as h:
            if with_page and self.tier is not None:
                self.tier._check_memory()
            rc = lib.kvt_store_run(h, OPS.index(op), arr, n, results, ctypes.byref(count))
        if rc != IOFailure.code:  # a key that failed says so in its result
            check(rc, f"Store.run({op})",
                  "no keys, a tier page out of range or twice, or no tier" if with_page else "no keys")
        return tuple(RESULTS[r] for r in results.raw[:n]), count.value

    def poll(self, timeout: float = 0.0, max: int = 64) -> List[StoreResult]:
        """Batches answered (waiting up to ``timeout`` seconds for the first)."""
        res = self._completions(timeout, max)
        self._tickets.taken(res)
        return res

    def _completions(self, timeout: float = 0.0, max: int = 64) -> List[StoreResult]:
        """poll's results, not yet marked taken (wait marks them as it keeps them)."""
        timeout = _a.number(timeout, "Store.poll timeout", 0.0, 1e9)
        max = _a.integer(max, "Store.poll max", 1, 1 << 16)
        self._undriven("Store.poll")
        out = (StoreDone * max)()

        def once(h: int, wait_ns: int) -> list:  # (the results point into the store until its next poll)
            res = []
            got = check(lib.kvt_store_poll(h, out, max, wait_ns), "Store.poll")
            for d in out[:got]:
                # each array read whole (one copy), not element by element through ctypes
                results = tuple(RESULTS[r] for r in ctypes.string_at(d.results, d.n)) if d.n else ()
                pages = tuple(p for (p,) in _PAGE_AT.iter_unpack(ctypes.string_at(d.pages, d.n * _PAGE_SIZE))) \
                    if d.n else ()
                res.append(StoreResult(d.ticket, d.user, OPS[d.op], lib.kvt_err_name(d.status).decode(),
                                       results, pages, d.count, d.latency_ns))
            return res

        return poll_sliced(self._use_poll, once, timeout)

    def wait(self, ticket: int, timeout: float = 60.0) -> StoreResult:
        """One batch's answer (others polled meanwhile wait for their own wait())."""
        return wait_ticket(self._done, ticket, self._completions, timeout, "Store.wait", self._tickets)

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
        with self._use as h:
            return lib.kvt_store_pending(h)

    def stats(self, op: str) -> Dict[str, Any]:
        """One operation's counters, with latency percentiles (ns)."""
        if not isinstance(op, str) or op not in OPS:
            raise ValueError(f"Store.stats: unknown op {op!r} (choose from {', '.join(OPS)})")
        st = StoreStats(size=ctypes.sizeof(StoreStats))
        with self._use as h:
            check(lib.kvt_store_stats(h, OPS.index(op), ctypes.byref(st)), "Store.stats")
        out: Dict[str, Any] = {n: getattr(st, n) for n in STORE_STATS}
        out["stored_bytes"], out["stored_objects"] = st.stored_bytes, st.stored_objects
        h = st.latency_ns
        out["latency_ns"] = {q: lib.kvt_hist_percentile(ctypes.byref(h), v)
                             for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))} if h.count else {}
        return out

    def __repr__(self) -> str:
        try:
            return f"<kvtier.Store {self.url}>"
        except ClosedError:
            return "<kvtier.Store closed>"


class _NoUse:
    """A stand-in for a handle's _use() where there is no handle (a store without a tier)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        pass

