"""The cache (cache.h): the radix prefix tree, the page allocators and the
tier policies, driven by an engine's scheduler thread."""
from __future__ import annotations

import array
import collections
import ctypes
import math
import warnings
import weakref
from typing import Any, Dict, Optional

from . import _args as _a
from . import _fields
from ._core import Busy, ClosedError, Error, Handle, _Serial, check, enum_arg, enum_names, error, tokens_arg, using
from ._lib import CacheConfig, CacheReq, CacheStats, RadixStats, lib

__all__ = ["Cache", "Request", "Prefetch", "POLICIES", "WRITE_POLICIES", "PREFETCH_POLICIES"]

POLICIES = enum_names(lib.kvt_policy_name, 7)
WRITE_POLICIES = enum_names(lib.kvt_write_policy_name, 3)
PREFETCH_POLICIES = enum_names(lib.kvt_prefetch_policy_name, 3)
PREFETCH_OUTCOMES = enum_names(lib.kvt_prefetch_outcome_name, 5)
CACHE_STATS = tuple(f for f, _, _ in _fields.CACHE_STATS)
RADIX_STATS = tuple(f for f, _, _ in _fields.RADIX_STATS)

_ENUMS = {
    "policy": (lib.kvt_policy_parse, POLICIES),
    "write_policy": (lib.kvt_write_policy_parse, WRITE_POLICIES),
    "l3_write_policy": (lib.kvt_write_policy_parse, WRITE_POLICIES),
    "prefetch_policy": (lib.kvt_prefetch_policy_parse, PREFETCH_POLICIES),
}
CONFIG_FIELDS = tuple(n for n, _ in CacheConfig._fields_ if n != "size")
_FIELD_TYPE = dict(CacheConfig._fields_)
_INT_MAX = {ctypes.c_uint32: _a.U32_MAX, ctypes.c_uint64: _a.U64_MAX}


def _config_value(k: str, v: Any) -> Any:
    """A Cache() keyword checked against its C field's type."""
    if k in _ENUMS:
        return enum_arg(v, _ENUMS[k][0], k, _ENUMS[k][1])
    t = _FIELD_TYPE[k]
    if t is ctypes.c_bool:
        return _a.flag(v, f"Cache: {k}")
    if t is ctypes.c_double:
        return _a.number(v, f"Cache: {k}", -math.inf)
    return _a.integer(v, f"Cache: {k}", 0, _INT_MAX[t])


def _default_config() -> CacheConfig:
    cfg = CacheConfig()
    lib.kvt_cache_config_default(ctypes.byref(cfg))
    return cfg


def default_config() -> Dict[str, Any]:
    """The library's defaults for every Cache() keyword (enums by name)."""
    cfg = _default_config()
    out = {}
    for n in CONFIG_FIELDS:
        v = getattr(cfg, n)
        out[n] = _ENUMS[n][1][v] if n in _ENUMS else v
    return out


def attach_data_plane(owner: Any, c: int, what: str, xfer: Any, l1: Any, l2: Any, l1_index: Optional[int],
                      l2_index: Optional[int]) -> list:
    """kvt_cache_attach on cache pointer ``c`` (owner's, held by the caller):
    the engine and tiers become owner's dependencies, and the engine owner's
    alone to submit to and poll. The attached tiers whose memory is checked
    before each call that copies."""
    from .tier import Tier
    from .xfer import Transfer
    _a.instance(xfer, Transfer, f"{what} xfer")
    _a.instance(l1, Tier, f"{what} l1")
    _a.instance(l2, Tier, f"{what} l2")
    n = len(xfer._tiers)
    l1_index = xfer.index(l1) if l1_index is None else _a.index(l1_index, f"{what} l1_index", n, "tiers:")
    l2_index = xfer.index(l2) if l2_index is None else _a.index(l2_index, f"{what} l2_index", n, "tiers:")
    xfer._may_drive(owner, "cache", f"{what} xfer")
    not_anothers(owner, (l1, l2), what)
    with using(xfer, l1, l2) as (xp, p1, p2):
        rc = lib.kvt_cache_attach(c, xp, p1, l1_index, p2, l2_index)
        if rc < 0:
            raise error(rc, what, _attach_refused(owner, xp, xfer, l1, l2, l1_index, l2_index, rc))
        owner._attached = True
        owner._own(owner._h, (xfer, l1, l2))
        xfer._drive(owner, "cache")
    return [t for t in (l1, l2) if t._probes]


def _attach_refused(owner: Any, xp: int, xfer: Any, l1: Any, l2: Any, i1: int, i2: int, rc: int) -> str:
    """Why kvt_cache_attach refused (looked for once it has: its checks, in its order)."""
    cfg = getattr(owner._cfg, "cache", owner._cfg)  # a Hybrid's cache config, or the Cache's
    store = getattr(owner, "_store", None)
    if rc == Busy.code:
        if getattr(owner, "_attached", False):
            return "attached already: a cache has one data plane"
        if lib.kvt_xfer_pending(xp):
            return "the Transfer has batches in flight that are not the cache's"
        return "requests were admitted already: attach before the first admission"
    if i1 == i2:
        return f"l1 and l2 are both the Transfer's tier {i1}"
    if cfg.l2_pages == 0:
        return "the cache has no L2 (l2_pages=0): there is nothing to copy"
    if xfer._tiers[i1] is not l1 or xfer._tiers[i2] is not l2:
        return f"l1_index {i1} and l2_index {i2} must name l1 and l2 among the Transfer's tiers"
    if l1.pages < cfg.l1_pages or l2.pages < cfg.l2_pages:
        return (f"the tiers are smaller than the cache: l1 has {l1.pages} pages of its {cfg.l1_pages}, "
                f"l2 {l2.pages} of its {cfg.l2_pages}")
    if cfg.l1_pages % cfg.l1_lanes:
        return f"l1_pages {cfg.l1_pages} is not a multiple of l1_lanes {cfg.l1_lanes}"
    if cfg.l3_pages:
        return "a modeled L3 (l3_pages) holds no bytes to load"
    if store is not None and store.tier is not l2:
        return "the cache's store reads another tier than l2"
    return ("a store over a checksummed l2 that the Transfer (checksum=False) leaves unsummed, or a tier or the "
            "Transfer that is another data plane's")


def not_anothers(owner: Any, tiers: Any, what: str) -> None:
    """Raises when a tier is another open cache's already (a Cache's or a
    Hybrid's, attached): its pages would be written by two caches."""
    for t in tiers:
        for u in list(getattr(t, "_users", ())):  # what is not a Tier is refused by the caller's checks
            if u is not owner and getattr(u, "_copies_into_tiers", False) and not u.closed:
                raise error(-1, what, f"a tier another {type(u).__name__} copies into already: its pages would be "
                            "written by two caches")


def memory_intact(owner: Any, what: str) -> bool:
    """Whether the memory under owner's attached tiers is all there (a Cache
    or a Hybrid closing with requests live). When it is not, a RuntimeWarning
    says that the C cache is left as it is, never freed: freeing it releases
    the live requests, and a release copies, out of memory that is gone."""
    try:
        owner._check_memory()
        return True
    except Exception as e:  # noqa: BLE001 - whatever the check raised, the memory cannot be trusted
        warnings.warn(f"{what} closed without freeing its C cache (its requests' copies would use freed memory): {e}",
                      RuntimeWarning, stacklevel=3)
        return False


def attach_store(owner: Any, c: int, what: str, store: Any) -> Any:
    """kvt_cache_attach_store on cache pointer ``c`` (owner's, held by the
    caller): the store becomes owner's dependency, owner's alone to submit
    to and poll, and is returned."""
    from .store import Store
    _a.instance(store, Store, f"{what} store")
    store._may_drive(owner, "cache", f"{what} store")
    with store._use as sp:
        check(lib.kvt_cache_attach_store(c, sp), what,
              "the store's tier must be the cache's L2, with l2_pages pages, before any admission or prefetch, "
              "with no batches on the store, under a model identity of its own (not a hybrid cache's pieces')")
        owner._own(owner._h, (store,))
        store._drive(owner, "cache")
    return store


class _Held(weakref.ref):
    """The cache's reference to an admitted request or a started prefetch:
    weak to the Python object, strong to what the C cache needs to let it go
    (the C request, or the prefetch's id). When the object is collected
    while still held, the callback queues this reference, and the cache's
    next call lets it go (``Cache._settle``): dropping a request must not
    keep its pages locked for the cache's life."""

    __slots__ = ("what",)

    def __new__(cls, o: Any, queue: Any, what: Any) -> "_Held":
        self = super().__new__(cls, o, queue)
        self.what = what
        return self

    def __init__(self, o: Any, queue: Any, what: Any) -> None:
        super().__init__(o, queue)


class _Holds:
    """What a cache (Cache, Hybrid) holds for its requests and prefetches:
    each by a _Held reference, by the reference's id, in the order they were
    made; and the references whose object was collected while held, let go
    at the cache's next call (_Settling). The cache says how to let go of
    one (_let_go)."""

    def _holding(self) -> None:
        self._live: Dict[int, _Held] = {}
        self._dropped: collections.deque = collections.deque()
        self._use = self._use_poll = _Settling(self)

    def _hold(self, o: Any, what: Any) -> None:
        """o (a request or prefetch, made under the cache's lock) is held until let go."""
        ref = _Held(o, self._dropped.append, what)
        o._key = id(ref)
        self._live[o._key] = ref

    def _holds(self, o: Any) -> bool:
        """Whether o is a request or prefetch this cache holds now."""
        ref = self._live.get(o._key)
        return ref is not None and ref() is o

    def _start_prefetch(self, what: str, tokens: Any, ns: int, c_cache: Any, kind: type) -> Any:
        """A prefetch (a ``kind``) of the C cache ``c_cache(h)`` gives, held while started."""
        ns = _a.u32(ns, f"{what} ns")
        addr, n, keep = tokens_arg(tokens)
        pid = ctypes.c_uint64()
        with self._use as h:
            self._check_memory()
            check(lib.kvt_cache_prefetch(c_cache(h), ns, addr, n, ctypes.byref(pid)), what)
            p = kind(self, pid.value, keep)
            if pid.value:
                self._hold(p, pid.value)
        return p

    def _let_go(self, h: int, what: Any) -> bool:  # pragma: no cover - each cache has its own
        """Lets go of what a collected object held: False when it cannot be yet."""
        raise NotImplementedError

    def _settle(self, h: int) -> None:
        """Lets go of what was collected while held: a request is aborted (its
        KV cannot be known to be written), a prefetch cancelled. A request
        that cannot be aborted yet (one admitted after it depends on its new
        pages) is tried again at the next call. Under the cache's lock."""
        busy = []
        while self._dropped:
            ref = self._dropped.popleft()
            if self._live.get(id(ref)) is not ref:
                continue  # let go before it was collected
            if not self._let_go(h, ref.what):
                busy.append(ref)
                continue
            del self._live[id(ref)]
        self._dropped.extend(busy)


class _Settling(_Serial):
    """A cache's calls: each first lets go of what was collected while held
    (_Holds._settle), on the thread that makes the call, under its lock."""

    __slots__ = ()

    def __enter__(self) -> int:
        h = super().__enter__()
        o = self._ref()
        if o._dropped:
            try:
                o._settle(h)
            except BaseException:
                super().__exit__()
                raise
        return h


def _leave_block(req: Any, owner: Any, exc: Optional[BaseException]) -> None:
    """The end of a request's ``with`` block (a Request's, a HybridRequest's):
    it is released, or aborted when the block raised (exc). An abort refused
    lets the block's own exception go on, saying so: the request stays held."""
    if req.released or owner.closed:
        return
    try:
        req.release() if exc is None else req.abort()
    except ClosedError:  # the cache closed meanwhile, on another thread: it let the request go
        pass
    except Busy as refused:
        if exc is None:
            raise
        if hasattr(exc, "add_note"):  # Python 3.11
            exc.add_note(f"kvtier: the request was not aborted and is still held ({refused}); abort it once the "
                         "requests that matched its new pages are let go")


class Request:
    """An admitted request: which of its pages were hits where, and the L1
    page of each of its first ``pages`` pages (``l1_ids``). Let it go once:
    ``release()`` once its forward pass wrote its new pages (``commit()``
    says so earlier; release commits), ``abort()`` if it did not. Its
    ``with`` block releases it, or aborts it when the block raises. A
    request collected without either is aborted at the cache's next call."""

    __slots__ = ("_cache", "_req", "_key", "l1_ids", "tokens", "released", "__weakref__")

    def __init__(self, cache: "Cache", req: CacheReq, l1_ids: array.array, ntokens: int) -> None:
        self._cache = cache
        self._req = req
        self._key = 0  # the cache's key of its _Held (Cache._hold)
        self.l1_ids = l1_ids  # the L1 page of each of its first `pages` pages
        self.tokens = ntokens
        self.released = False

    pages = property(lambda self: self._req.pages, doc="pages of the request now in the cache, in order")
    l1_hit_pages = property(lambda self: self._req.l1_hit_pages, doc="matched pages that were in L1")
    l2_hit_pages = property(lambda self: self._req.l2_hit_pages, doc="matched pages loaded back from L2")
    l3_hit_pages = property(lambda self: self._req.l3_hit_pages, doc="matched pages that came from L3")
    l3_foreign_pages = property(lambda self: self._req.l3_foreign_pages,
                                doc="L3 hit pages another instance put")
    new_pages = property(lambda self: self._req.new_pages, doc="pages allocated for the part computed now")
    uncached_pages = property(lambda self: self._req.uncached_pages, doc="full pages that found no room")
    committed = property(lambda self: bool(self._req.committed))
    prefetch = property(lambda self: PREFETCH_OUTCOMES[self._req.prefetch],
                        doc="what became of the request's prefetch")
    prefetch_wait_ns = property(lambda self: self._req.prefetch_wait_ns)

    @property
    def hit_pages(self) -> int:
        """Pages whose KV is already there: L1 hits, L2 and L3 load-backs."""
        r = self._req
        return r.l1_hit_pages + r.l2_hit_pages + r.l3_hit_pages

    def commit(self) -> None:
        """The request's new pages now hold their KV (write_through backs them up)."""
        with self._cache._use as h:
            if self.released:
                raise error(-1, "Request.commit", "the request was released")
            self._cache._check_memory()
            check(lib.kvt_cache_commit(h, ctypes.byref(self._req)), "Request.commit")

    def release(self) -> None:
        """Lets go of the request's pages (they stay cached); commits first."""
        with self._cache._use as h:
            if self.released:
                raise error(-1, "Request.release", "the request was released already")
            if self._cache._tiers:
                self._cache._check_memory()
            check(lib.kvt_cache_release(h, ctypes.byref(self._req)), "Request.release")
            self.released = True
            del self._cache._live[self._key]

    def abort(self) -> None:
        """Lets go of a request whose forward pass did not run or failed: its
        new pages hold no KV and leave the cache; the pages it matched stay
        cached. Committed, it is released. Busy (nothing changed) while a
        request admitted after it holds its new pages or sits below them
        (it matched them before this one committed): abort that one first."""
        with self._cache._use as h:
            if self.released:
                raise error(-1, "Request.abort", "the request was released already")
            check(lib.kvt_cache_abort(h, ctypes.byref(self._req)), "Request.abort",
                  "a request admitted after it holds its new pages or was admitted below them (it matched "
                  "them before this one committed): abort that one first; this one is still held")
            self.released = True
            del self._cache._live[self._key]

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _leave_block(self, self._cache, exc)

    def __repr__(self) -> str:
        r = self._req
        return (f"<kvtier.Request pages={r.pages} l1_hit={r.l1_hit_pages} l2_hit={r.l2_hit_pages} "
                f"l3_hit={r.l3_hit_pages} new={r.new_pages}{' released' if self.released else ''}>")


class Prefetch:
    """A prefetch started when a request arrived (:meth:`Cache.prefetch`);
    finished by the request's admission (``Cache.admit(tokens, prefetch=p)``)
    or dropped by ``cancel()``."""

    __slots__ = ("_cache", "id", "_tokens", "done", "_key", "__weakref__")

    def __init__(self, cache: "Cache", pid: int, tokens: Any) -> None:
        self._cache, self.id, self._tokens, self.done, self._key = cache, pid, tokens, pid == 0, 0

    def cancel(self) -> None:
        with self._cache._use as h:
            if not self.done:
                check(lib.kvt_cache_prefetch_cancel(h, self.id), "Prefetch.cancel")
                self._finished()

    def _finished(self) -> None:  # (under the cache's lock)
        self.done = True
        if self._key:
            del self._cache._live[self._key]


class Cache(Handle, _Holds):
    __doc__ = """A KV cache over L1 (GPU pages), L2 (host pages) and optionally an L3
    store, with planned eviction against free-room targets.

    Keywords are the fields of kvt_cache_config_t (``default_config()``
    lists them with the library's defaults); enums go by name::

        with kvtier.Cache(l1_pages=4096, l2_pages=8192, policy="lru") as c:
            with c.admit(tokens) as req:
                ...  # compute KV for tokens[req.hit_pages * c.page_tokens:], into req.l1_ids

    Without :meth:`attach` the cache manages page ids only (no bytes move);
    with it, loads and backups copy bytes between the tiers on a transfer
    engine. The C cache belongs to one thread; this object serialises the
    calls made on it (and on its requests) from several threads with a lock
    of its own, so any thread may call it, one call at a time.

    Options and the library's defaults:

""" + "\n".join(f"        {k} = {v!r}" for k, v in default_config().items()) + "\n"

    _SERIAL = True

    _copies_into_tiers = True  # the tiers it attaches are its own (not_anothers)

    def __init__(self, **config: Any) -> None:
        """Creates the cache; every keyword is a kvt_cache_config_t field (see the
        class). TypeError for an unknown option, ValueError for an unknown
        policy name, InvalidArgument for a value out of range."""
        super().__init__()
        self._holding()
        cfg = _default_config()
        for k, v in config.items():
            if k not in CONFIG_FIELDS:
                raise TypeError(f"Cache: unknown option {k!r} (options: {', '.join(CONFIG_FIELDS)})")
            setattr(cfg, k, _config_value(k, v))
        why = ctypes.c_char_p()
        if lib.kvt_cache_config_check(ctypes.byref(cfg), ctypes.byref(why)) < 0:
            text = why.value.decode()  # "field: its range"
            field = text.split(":")[0]
            raise error(-1, "Cache", text + (f" (given {config[field]!r})" if field in config else ""))
        h = ctypes.c_void_p()
        rc = lib.kvt_cache_create(ctypes.byref(h), ctypes.byref(cfg))
        if rc < 0:
            raise error(rc, "Cache")
        self._own(h.value)
        self._cfg = cfg
        self._ids = array.array("I", bytes(4 * 64))
        self._store = None
        self._tiers: list = []  # attached engine tiers whose memory is checked before each call that copies

    def _check_memory(self) -> None:
        for t in self._tiers:
            t._check_memory()

    def _let_go(self, h: int, what: Any) -> bool:
        if isinstance(what, CacheReq):
            return lib.kvt_cache_abort(h, ctypes.byref(what)) >= 0
        lib.kvt_cache_prefetch_cancel(h, what)
        return True

    def _destroy(self, h: int) -> None:
        held = [ref.what for ref in self._live.values() if isinstance(ref.what, CacheReq)]
        if held and not memory_intact(self, "Cache"):
            return  # letting them go could copy out of freed memory: the C cache is left, not freed
        for req in reversed(held):  # the last admitted first: a request depends only on earlier ones
            if lib.kvt_cache_abort(h, ctypes.byref(req)) < 0:
                lib.kvt_cache_release(h, ctypes.byref(req))
        for ref in self._live.values():
            o = ref()
            if o is not None and isinstance(o, Request):
                o.released = True
        self._live.clear()
        lib.kvt_cache_destroy(h)

    @property
    def page_tokens(self) -> int:
        return self._cfg.page_tokens

    @property
    def config(self) -> Dict[str, Any]:
        return {n: (_ENUMS[n][1][getattr(self._cfg, n)] if n in _ENUMS else getattr(self._cfg, n))
                for n in CONFIG_FIELDS}

    # -- data plane ----------------------------------------------------------

    def attach(self, xfer: Any, l1: Any, l2: Any, l1_index: Optional[int] = None,
               l2_index: Optional[int] = None) -> None:
        """Copies move bytes from now on: between tier ``l1`` and tier ``l2`` on
        transfer engine ``xfer`` (indices default to the tiers' places in it).
        Before the first admission; the engine and tiers stay open while the
        cache is."""
        with self._use as h:
            self._tiers = attach_data_plane(self, h, "Cache.attach", xfer, l1, l2, l1_index, l2_index)

    def attach_store(self, store: Any) -> None:
        """The store becomes the third tier (its tier is the cache's L2)."""
        with self._use as h:
            self._store = attach_store(self, h, "Cache.attach_store", store)

    @property
    def has_l3(self) -> bool:
        """An L3 behind L2: an attached store, or the modeled one (l3_pages)."""
        return self._store is not None or self._cfg.l3_pages > 0

    # -- requests ------------------------------------------------------------

    def admit(self, tokens: Any, ns: int = 0, priority: int = 0, prefetch: Optional[Prefetch] = None) -> Request:
        """Admits a request: its longest cached prefix is matched and locked
        (the part only in L2, or prefetched from L3, is loaded into L1 first),
        pages for the rest are allocated. Only whole pages are cached."""
        ns = _a.u32(ns, "Cache.admit ns")
        priority = _a.i32(priority, "Cache.admit priority")
        if prefetch is not None:
            _a.instance(prefetch, Prefetch, "Cache.admit prefetch", optional=True)
        addr, n, keep = tokens_arg(tokens)
        req = CacheReq()
        with self._use as h:
            if self._tiers:
                self._check_memory()
            need = n // self._cfg.page_tokens + 1
            if len(self._ids) < need:
                self._ids = array.array("I", bytes(4 * max(need, 2 * len(self._ids))))
            ids_addr = self._ids.buffer_info()[0]
            if prefetch is None:
                rc = lib.kvt_cache_admit(h, ns, addr, n, priority, ids_addr, ctypes.byref(req))
            else:
                if prefetch._cache is not self or prefetch.done and prefetch.id:
                    raise error(-1, "Cache.admit", "the prefetch is not this cache's, or is over")
                rc = lib.kvt_cache_admit_prefetched(h, prefetch.id, ns, addr, n, priority, ids_addr,
                                                    ctypes.byref(req))
                if rc == 0:
                    prefetch._finished()
            del keep
            if rc < 0:
                raise error(rc, "Cache.admit")
            r = Request(self, req, self._ids[:req.pages], n)
            self._hold(r, req)
        return r

    def prefetch(self, tokens: Any, ns: int = 0) -> Prefetch:
        """Starts the L3 prefetch of a request that just arrived (pass the
        result to its admit). A no-op prefetch (id 0) when there is no L3,
        the request is below the threshold, or nothing of it is in L3."""
        return self._start_prefetch("Cache.prefetch", tokens, ns, lambda h: h, Prefetch)

    @property
    def prefetches(self) -> int:
        with self._use as h:
            return lib.kvt_cache_prefetches(h)

    def poll(self) -> int:
        """Applies the copies that completed; how many."""
        with self._use as h:
            self._check_memory()
            return check(lib.kvt_cache_poll(h), "Cache.poll")

    def sync(self) -> None:
        """Waits for every copy and store call in flight."""
        with self._use as h:
            self._check_memory()
            check(lib.kvt_cache_sync(h), "Cache.sync")

    def restore_room(self) -> int:
        """Evicts until every tier's free-room target holds; pages evicted."""
        with self._use as h:
            self._check_memory()
            return lib.kvt_cache_restore_room(h)

    # -- introspection -------------------------------------------------------

    def stats(self) -> Dict[str, int]:
        """kvt_cache_stats_t as a dict (the fields of KVT_CACHE_STATS_FIELDS)."""
        st = CacheStats(size=ctypes.sizeof(CacheStats))
        with self._use as h:
            check(lib.kvt_cache_stats(h, ctypes.byref(st)), "Cache.stats")
        return {n: getattr(st, n) for n in CACHE_STATS}

    def tree_stats(self) -> Dict[str, int]:
        """The radix tree's kvt_radix_stats_t (nodes, pages per tier, metadata bytes...)."""
        st = RadixStats(size=ctypes.sizeof(RadixStats))
        with self._use as h:
            check(lib.kvt_radix_stats(lib.kvt_cache_tree(h), ctypes.byref(st)), "Cache.tree_stats")
        return {n: getattr(st, n) for n in RADIX_STATS}

    def check(self) -> None:
        """Recomputes every invariant of the tree and the allocators; raises
        CorruptError naming the first violation."""
        why = ctypes.c_char_p()
        with self._use as h:
            rc = lib.kvt_cache_check(h, ctypes.byref(why))
            if rc < 0:
                raise error(rc, "Cache.check", why.value.decode() if why.value else "")

    @property
    def digest(self) -> int:
        """A running hash of the cache's decisions: caches fed the same calls agree on it
        exactly when they decided alike. Kept only by a cache made with
        ``decision_digest=True`` (CP groups compare it); 0 otherwise."""
        with self._use as h:
            return lib.kvt_cache_digest(h)

    def __repr__(self) -> str:
        if self.closed:
            return "<kvtier.Cache closed>"
        c = self._cfg
        return f"<kvtier.Cache L1 {c.l1_pages} L2 {c.l2_pages} pages of {c.page_tokens} tokens>"

