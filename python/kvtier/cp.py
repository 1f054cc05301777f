"""CP shared KV (cp.h): C rank processes of one node run the same
deterministic cache over shared tiers, each loading and writing the pages of
its own owner lane, rank 0 making the group's backups. Ranks are started by
anyone (torchrun, a fork, a shell loop) and join a named group."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Sequence

from ._core import Handle, c_str, error
from ._lib import KVT_CP_RESULT_BYTES, CpGroupConfig, CpGroupInfo, TierConfig, lib
from .tier import CHECKSUM, Tier, _geom
from .xfer import Transfer

__all__ = ["CpGroup", "lane_of", "lane_page"]


def lane_of(page: int, ranks: int) -> int:
    """The rank (owner lane) of L1 page ``page``."""
    return page % ranks


def lane_page(page: int, ranks: int, pages_per_rank: int) -> int:
    """The page of the group's L1 tier that L1 page ``page`` is (rank-major)."""
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

    def __init__(self, name: str, rank: int, ranks: int, l1_pages: int, l2_pages: int, page_tokens: int = 16,
                 layers: int = 1, layer_bytes: int = 0, layout: str = "page_first", requests: int = 0, tag: int = 0,
                 timeout_ms: int = 0, wait_ms: int = 0) -> None:
        super().__init__()
        self._name = c_str(name)
        g = _geom(max(l1_pages, 1), layers, layer_bytes, layout)
        cfg = CpGroupConfig(size=ctypes.sizeof(CpGroupConfig), name=self._name, rank=rank, ranks=ranks,
                            l1_pages=l1_pages, l2_pages=l2_pages, page_tokens=page_tokens, layers=layers,
                            layer_bytes=layer_bytes, layout=g.layout, requests=requests, tag=tag,
                            timeout_ms=timeout_ms, wait_ms=wait_ms)
        h = ctypes.c_void_p()
        why = ctypes.c_char_p()
        rc = lib.kvt_cp_group_join(ctypes.byref(h), ctypes.byref(cfg), ctypes.byref(why))
        if rc < 0:
            raise error(rc, f"CpGroup({name!r}, rank {rank})", why.value.decode() if why.value else "")
        self._own(h.value)
        self.rank, self.ranks, self.l1_pages = rank, ranks, l1_pages
        self._left = False

    def _destroy(self, h: int) -> None:
        why = ctypes.c_char_p()
        lib.kvt_cp_group_leave(h, ctypes.byref(why))

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise error(rc, f"CpGroup.{what}", self.why)
        return rc

    @property
    def why(self) -> str:
        """Why the group stopped ("" while it runs)."""
        w = lib.kvt_cp_group_why(self._ptr)
        return w.decode() if w else ""

    def open_tier(self, suffix: str, pages: int, layers: int, layer_bytes: int, layout: str = "page_first",
                  checksum: bool = False) -> Tier:
        """The shared tier /dev/shm/<name>-<suffix>: rank 0 creates it, the others attach."""
        cfg = TierConfig(size=ctypes.sizeof(TierConfig), geom=_geom(pages, layers, layer_bytes, layout),
                         flags=CHECKSUM if checksum else 0)
        h = ctypes.c_void_p()
        self._check(lib.kvt_cp_group_open_tier(self._ptr, suffix.encode(), ctypes.byref(cfg), ctypes.byref(h)),
                    "open_tier")
        t = Tier.__new__(Tier)
        Handle.__init__(t)
        t._keep = []
        t._own(h.value)
        self._users.add(t)  # the group is left after its tiers are closed
        return t

    def wait_joined(self) -> None:
        """Waits for every rank to join (KVT_ETIMEDOUT names those that did not)."""
        self._check(lib.kvt_cp_group_wait_joined(self._ptr), "wait_joined")

    def transfer(self, tiers: Sequence[Any], l1_index: int = 0, threads: int = 1) -> Transfer:
        """A transfer engine whose rank-0 backups out of tier l1_index publish when they land."""
        x = Transfer(tiers, threads=threads,
                     _configure=lambda cfg: lib.kvt_cp_group_xfer_config(self._ptr, ctypes.byref(cfg), l1_index))
        self._users.add(x)
        return x

    def attach(self, cache: Any, xfer: Any, l1: Any, l2: Any) -> None:
        """kvt_cache_attach_cp with the group's hooks."""
        self._check(lib.kvt_cp_group_attach(self._ptr, cache._ptr, xfer._ptr, l1._ptr, xfer.index(l1), l2._ptr,
                                            xfer.index(l2)), "attach")
        cache._own(cache._h, (xfer, l1, l2))
        self._users.add(cache)

    def admitted(self, req: Any) -> None:
        """After the current request's admission: waits until rank 0 has copied
        out the old content of the pages this rank writes."""
        ids = (ctypes.c_uint32 * max(len(req.l1_ids), 1))(*req.l1_ids)
        self._check(lib.kvt_cp_group_admitted(self._ptr, ctypes.byref(req._req), ids), "admitted")

    def filled(self, i: int) -> None:
        """This rank has written its pages of request i."""
        self._check(lib.kvt_cp_group_filled(self._ptr, i), "filled")

    def step(self, i: int, digest: int) -> None:
        """Request i is done here; digest (``Cache.digest`` of a cache made with
        ``decision_digest=True``, or a hash of it) goes into the table the ranks agree through."""
        self._check(lib.kvt_cp_group_step(self._ptr, i, digest & (2 ** 64 - 1)), "step")

    def check_digests(self, n: int) -> int:
        """The first request (1-based) of the first n whose digests differ across ranks; 0: none."""
        out = ctypes.c_uint64()
        self._check(lib.kvt_cp_group_check_digests(self._ptr, n, ctypes.byref(out)), "check_digests")
        return out.value

    def fail(self, why: str) -> None:
        """Stops the group with a reason every rank sees."""
        lib.kvt_cp_group_fail(self._ptr, why.encode())

    def finish(self, result: bytes = b"") -> None:
        """Publishes this rank's result (<= 256 bytes); rank 0 waits for every rank's."""
        if len(result) > KVT_CP_RESULT_BYTES:
            raise ValueError(f"finish: {len(result)} bytes, at most {KVT_CP_RESULT_BYTES}")
        buf = ctypes.create_string_buffer(bytes(result), max(len(result), 1))
        self._check(lib.kvt_cp_group_finish(self._ptr, buf, len(result)), "finish")

    def result(self, rank: int, size: int = KVT_CP_RESULT_BYTES) -> bytes:
        buf = ctypes.create_string_buffer(size)
        """A finished rank's published result (``size`` bytes)."""
        self._check(lib.kvt_cp_group_result(self._ptr, rank, buf, size), "result")
        return buf.raw

    def info(self) -> Dict[str, Any]:
        st = CpGroupInfo(size=ctypes.sizeof(CpGroupInfo))
        self._check(lib.kvt_cp_group_info(self._ptr, ctypes.byref(st)), "info")
        return {n: getattr(st, n) for n, _ in CpGroupInfo._fields_ if n != "size"}
