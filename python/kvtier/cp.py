"""CP shared KV (cp.h): C rank processes of one node run the same
deterministic cache over shared tiers, each loading and writing the pages of
its own owner lane, rank 0 making the group's backups. Ranks are started by
anyone (torchrun, a fork, a shell loop) and join a named group."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Dict, Sequence

from . import _args as _a
from ._core import Handle, error, using
from ._lib import KVT_CP_RESULT_BYTES, CpGroupConfig, CpGroupInfo, TierConfig, lib
from .tier import CHECKSUM, Tier, _geom
from .xfer import Transfer

__all__ = ["CpGroup", "lane_of", "lane_page"]


def lane_of(page: int, ranks: int) -> int:
    """The rank (owner lane) of L1 page ``page``."""
    return _a.u64(page, "lane_of page") % _a.u32(ranks, "lane_of ranks", 1)


def lane_page(page: int, ranks: int, pages_per_rank: int) -> int:
    """The page of the group's L1 tier that L1 page ``page`` is (rank-major):
    ``page`` is one of the group's ``ranks * pages_per_rank`` L1 pages."""
    ranks = _a.u32(ranks, "lane_page ranks", 1)
    pages_per_rank = _a.u64(pages_per_rank, "lane_page pages_per_rank", 1)
    page = _a.integer(page, "lane_page page", 0, ranks * pages_per_rank - 1)
    return (page % ranks) * pages_per_rank + page // ranks


class CpGroup(Handle):
    """This process's membership of CP group ``name`` as ``rank`` of ``ranks``.

    Every rank must agree on the geometry (l1_pages over all lanes, l2_pages,
    page_tokens, layers, layer_bytes, layout), ``requests`` (rows of the
    digest table) and ``tag``; a rank that differs is refused naming the
    field. The calls of a rank, in order: the constructor (join),
    :meth:`open_tier` ("l1", "l2"), :meth:`wait_joined`, :meth:`transfer`,
    :meth:`attach`; per request i: ``cache.admit`` -> :meth:`admitted` ->
    write this rank's pages -> :meth:`filled` -> commit, release ->
    :meth:`step`; then :meth:`finish` and :meth:`close` (leave)."""

    _SERIAL = True  # one thread of each rank makes the calls (fail: any thread)

    def __init__(self, name: str, rank: int, ranks: int, l1_pages: int, l2_pages: int, page_tokens: int = 16,
                 layers: int = 1, layer_bytes: int = 0, layout: str = "page_first", requests: int = 0, tag: int = 0,
                 timeout_ms: int = 0, wait_ms: int = 0) -> None:
        super().__init__()
        w = "CpGroup"
        self._name = _a.text(name, f"{w} name")
        l1_pages = _a.u64(l1_pages, f"{w} l1_pages")
        g = _geom(max(l1_pages, 1), layers, layer_bytes, layout, w, min_layer_bytes=0)
        cfg = CpGroupConfig(size=ctypes.sizeof(CpGroupConfig), name=self._name, rank=_a.u32(rank, f"{w} rank"),
                            ranks=_a.u32(ranks, f"{w} ranks"), l1_pages=l1_pages,
                            l2_pages=_a.u64(l2_pages, f"{w} l2_pages"),
                            page_tokens=_a.u32(page_tokens, f"{w} page_tokens"), layers=g.layers,
                            layer_bytes=g.layer_bytes, layout=g.layout, requests=_a.u64(requests, f"{w} requests"),
                            tag=_a.u64(tag, f"{w} tag"), timeout_ms=_a.u32(timeout_ms, f"{w} timeout_ms"),
                            wait_ms=_a.u32(wait_ms, f"{w} wait_ms"))
        h = ctypes.c_void_p()
        why = ctypes.c_char_p()
        rc = lib.kvt_cp_group_join(ctypes.byref(h), ctypes.byref(cfg), ctypes.byref(why))
        if rc < 0:
            raise error(rc, f"CpGroup({name!r}, rank {rank})", why.value.decode() if why.value else "")
        self._own(h.value)
        self._cache: Any = None  # weakref to the cache attach gave the group
        self.rank, self.ranks, self.l1_pages = rank, ranks, l1_pages

    def _destroy(self, h: int) -> None:
        why = ctypes.c_char_p()
        lib.kvt_cp_group_leave(h, ctypes.byref(why))

    @staticmethod
    def _why(h: int) -> str:
        w = lib.kvt_cp_group_why(h)
        return w.decode() if w else ""

    def _check(self, rc: int, what: str, h: int) -> int:
        if rc < 0:
            raise error(rc, f"CpGroup.{what}", self._why(h))
        return rc

    @property
    def why(self) -> str:
        """Why this rank's last refused or failed call was (who stopped the
        group and why, once it stopped); "" when none was."""
        with self._use_any as h:
            return self._why(h)

    def open_tier(self, suffix: str, pages: int, layers: int, layer_bytes: int, layout: str = "page_first",
                  checksum: bool = False) -> Tier:
        """The shared tier /dev/shm/<name>-<suffix>: rank 0 creates it, the others attach."""
        sfx = _a.text(suffix, "CpGroup.open_tier suffix")
        cfg = TierConfig(size=ctypes.sizeof(TierConfig), geom=_geom(pages, layers, layer_bytes, layout, "open_tier"),
                         flags=CHECKSUM if _a.flag(checksum, "CpGroup.open_tier checksum") else 0)
        th = ctypes.c_void_p()
        with self._use as h:
            self._check(lib.kvt_cp_group_open_tier(h, sfx, ctypes.byref(cfg), ctypes.byref(th)), "open_tier", h)
            t = Tier._from_handle(th.value)
            self._add_user(t)  # the group is left after its tiers are closed
        return t

    def wait_joined(self) -> None:
        """Waits for every rank to join (KVT_ETIMEDOUT names those that did not)."""
        with self._use as h:
            self._check(lib.kvt_cp_group_wait_joined(h), "wait_joined", h)

    def transfer(self, tiers: Sequence[Any], l1_index: int = 0, threads: int = 1) -> Transfer:
        """A transfer engine whose rank-0 backups out of tier l1_index publish when they land."""
        l1_index = _a.index(l1_index, "CpGroup.transfer l1_index", len(_a.sequence(tiers, "CpGroup.transfer tiers")),
                            "tiers:")
        with self._use as h:
            x = Transfer(tiers, threads=threads,
                         _configure=lambda cfg: lib.kvt_cp_group_xfer_config(h, ctypes.byref(cfg), l1_index))
            self._add_user(x)
        return x

    def attach(self, cache: Any, xfer: Any, l1: Any, l2: Any) -> None:
        """kvt_cache_attach_cp with the group's hooks."""
        from .cache import Cache
        _a.instance(cache, Cache, "CpGroup.attach cache")
        _a.instance(xfer, Transfer, "CpGroup.attach xfer")
        _a.instance(l1, Tier, "CpGroup.attach l1")
        _a.instance(l2, Tier, "CpGroup.attach l2")
        from .cache import not_anothers
        i1, i2 = xfer.index(l1), xfer.index(l2)
        xfer._may_drive(cache, "cache", "CpGroup.attach xfer")  # as Cache.attach: the cache polls it alone
        not_anothers(cache, (l1, l2), "CpGroup.attach")
        with self._use as h, using(cache, xfer, l1, l2) as (cp, xp, p1, p2):
            self._check(lib.kvt_cp_group_attach(h, cp, xp, p1, i1, p2, i2), "attach", h)
            cache._own(cp, (xfer, l1, l2))
            self._add_user(cache)
            xfer._drive(cache, "cache")
            cache._tiers += [t for t in (l1, l2) if t._probes]  # their memory checked, as Cache.attach's
            self._cache = weakref.ref(cache)

    def admitted(self, req: Any) -> None:
        """After the current request's admission: waits until rank 0 has copied
        out the old content of the pages this rank writes."""
        from .cache import Request
        _a.instance(req, Request, "CpGroup.admitted req")
        if self._cache is None or req._cache is not self._cache():
            raise error(-1, "CpGroup.admitted", "the request is not of the cache this group attached")
        if len(req.l1_ids) != req._req.pages:  # C reads that many ids
            raise ValueError(f"CpGroup.admitted: the request's l1_ids hold {len(req.l1_ids)} ids for its "
                             f"{req._req.pages} pages (changed since its admission)")
        ids = (ctypes.c_uint32 * max(len(req.l1_ids), 1))(*req.l1_ids)
        with self._use as h:
            self._check(lib.kvt_cp_group_admitted(h, ctypes.byref(req._req), ids), "admitted", h)

    def filled(self, i: int) -> None:
        """This rank has written its pages of request i."""
        i = _a.u64(i, "CpGroup.filled i")
        with self._use as h:
            self._check(lib.kvt_cp_group_filled(h, i), "filled", h)

    def step(self, i: int, digest: int) -> None:
        """Request i is done here; digest (``Cache.digest`` of a cache made with
        ``decision_digest=True``, or a hash of it) goes into the table the ranks agree through."""
        i = _a.u64(i, "CpGroup.step i")
        digest = _a.integer(digest, "CpGroup.step digest", -(1 << 63), _a.U64_MAX) & _a.U64_MAX
        with self._use as h:
            self._check(lib.kvt_cp_group_step(h, i, digest), "step", h)

    def check_digests(self, n: int) -> int:
        """The first request (1-based) of the first n whose digests differ across ranks; 0: none."""
        n = _a.u64(n, "CpGroup.check_digests n")
        out = ctypes.c_uint64()
        with self._use as h:
            self._check(lib.kvt_cp_group_check_digests(h, n, ctypes.byref(out)), "check_digests", h)
        return out.value

    def fail(self, why: str) -> None:
        """Stops the group with a reason every rank sees (any thread)."""
        why_b = _a.text(why, "CpGroup.fail why")
        with self._use_any as h:
            lib.kvt_cp_group_fail(h, why_b)

    def finish(self, result: bytes = b"") -> None:
        """Publishes this rank's result (<= 256 bytes); rank 0 waits for every rank's."""
        if not isinstance(result, (bytes, bytearray, memoryview)):
            raise TypeError(f"CpGroup.finish result: expected bytes, not {type(result).__name__}")
        data = bytes(result)  # a memoryview of wider items: its bytes, not its element count
        if len(data) > KVT_CP_RESULT_BYTES:
            raise ValueError(f"finish: {len(data)} bytes, at most {KVT_CP_RESULT_BYTES}")
        buf = ctypes.create_string_buffer(data, max(len(data), 1))
        with self._use as h:
            self._check(lib.kvt_cp_group_finish(h, buf, len(data)), "finish", h)

    def result(self, rank: int, size: int = KVT_CP_RESULT_BYTES) -> bytes:
        """A finished rank's published result (``size`` bytes)."""
        rank = _a.u32(rank, "CpGroup.result rank")
        size = _a.integer(size, "CpGroup.result size", 1, KVT_CP_RESULT_BYTES)
        buf = ctypes.create_string_buffer(size)
        with self._use as h:
            self._check(lib.kvt_cp_group_result(h, rank, buf, size), "result", h)
        return buf.raw

    def info(self) -> Dict[str, Any]:
        st = CpGroupInfo(size=ctypes.sizeof(CpGroupInfo))
        with self._use as h:
            self._check(lib.kvt_cp_group_info(h, ctypes.byref(st)), "info", h)
        return {n: getattr(st, n) for n, _ in CpGroupInfo._fields_ if n != "size"}
