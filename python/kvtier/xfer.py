"""The transfer engine (xfer.h): batches of page copies between tiers, run
asynchronously on worker threads, coalesced into contiguous runs, measured."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, NamedTuple, Sequence

from . import _args as _a
from . import _fields
from ._core import Handle, InvalidArgument, Tickets, check, error, poll_sliced, using, wait_ticket
from ._lib import XferConfig, XferCopy, XferDone, XferStats, lib

__all__ = ["Transfer", "XferResult"]

XFER_STATS = tuple(f for f, _, _ in _fields.XFER_STATS)


class XferResult(NamedTuple):
    ticket: int
    user: int
    status: str    # "KVT_OK", "KVT_EIO" (a copy failed), "KVT_ECORRUPT" (a checksum failed)
    src: int
    dst: int
    n: int
    bad_page: int  # KVT_ECORRUPT: the source page whose checksum failed

    @property
    def ok(self) -> bool:
        return self.status == "KVT_OK"


def copies_arg(copies: Any):
    """(array, n) of XferCopy from (src_page, dst_page) pairs or an [n, 2] integer array."""
    if type(copies).__module__ == "numpy" and copies.ndim == 2 and copies.shape[1] == 2 and copies.dtype.kind in "iu":
        return _copies_of_array(copies)
    if hasattr(copies, "__array_interface__") or type(copies).__module__.startswith("torch"):
        pairs = copies.tolist()
    elif isinstance(copies, (str, bytes)) or not hasattr(copies, "__iter__"):
        raise TypeError(f"copies: expected (src_page, dst_page) pairs, not {type(copies).__name__}")
    else:
        pairs = list(copies)
    arr = (XferCopy * max(len(pairs), 1))()
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise TypeError(f"copy {i}: expected a (src_page, dst_page) pair, not {pair!r}")
        s, d = pair
        try:
            arr[i].src_page, arr[i].dst_page = _a.u32(s, f"copy {i} src_page"), _a.u32(d, f"copy {i} dst_page")
        except ValueError:
            raise ValueError(f"copy {i}: pages ({s}, {d}) out of range") from None
    return arr, len(pairs)


def _copies_of_array(a: Any):
    """copies_arg of an [n, 2] numpy integer array, checked and converted
    whole: per pair in Python it costs microseconds, with the GIL held."""
    import numpy as np
    bad = np.flatnonzero(((a < 0) | (a > 0xFFFFFFFF)).any(axis=1))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"copy {i}: pages ({a[i, 0]}, {a[i, 1]}) out of range")
    n = len(a)
    arr = (XferCopy * max(n, 1))()
    if n:  # XferCopy is two uint32, so an [n, 2] uint32 array is its bytes
        u32 = np.ascontiguousarray(a, dtype=np.uint32)
        ctypes.memmove(arr, u32.ctypes.data, 8 * n)
    return arr, n


class Transfer(Handle):
    """A transfer engine over ``tiers`` (indices are their places in the list).

    ``threads`` workers per destination; ``checksum`` records a page's XXH3
    when it lands in a checksummed host tier and verifies it when it is read
    back. The tiers stay open while the engine is. Any thread may submit,
    concurrently; polls (and the waits that poll) take turns; ``close`` waits
    for the calls in flight."""

    def __init__(self, tiers: Sequence[Any], threads: int = 1, checksum: bool = True,
                 max_batch_bytes: int = 0, max_batch_copies: int = 0, _configure: Any = None) -> None:
        super().__init__()
        from .tier import Tier
        for i, t in enumerate(_a.sequence(tiers, "Transfer tiers")):
            _a.instance(t, Tier, f"Transfer tiers[{i}]")
            if any(u is t for u in tiers[:i]):  # a copy between its two places would overlap itself
                raise ValueError(f"Transfer tiers[{i}]: the tier is already tiers[{[u is t for u in tiers].index(True)}]")
        cfg = XferConfig()
        lib.kvt_xfer_config_default(ctypes.byref(cfg))
        if _configure is not None:  # a CP group's completion hook (CpGroup.transfer)
            _configure(cfg)
        cfg.threads = _a.u32(threads, "Transfer threads")
        cfg.checksum = _a.flag(checksum, "Transfer checksum")
        if _a.u64(max_batch_bytes, "Transfer max_batch_bytes"):
            cfg.max_batch_bytes = max_batch_bytes
        if _a.u32(max_batch_copies, "Transfer max_batch_copies"):
            cfg.max_batch_copies = max_batch_copies
        self._tiers = list(tiers)
        h = ctypes.c_void_p()
        with using(*self._tiers) as ptrs:
            arr = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
            check(lib.kvt_xfer_create(ctypes.byref(h), ctypes.byref(cfg), arr, len(self._tiers)), "Transfer",
                  f"{len(self._tiers)} tiers, threads={threads} (1..64)")
            self._own(h.value, self._tiers)
        self._results: Dict[int, XferResult] = {}
        self._tickets = Tickets()

    def _destroy(self, h: int) -> None:
        lib.kvt_xfer_destroy(h)

    def index(self, tier: Any) -> int:
        """The index of a tier in this engine."""
        for i, t in enumerate(self._tiers):
            if t is tier:
                return i
        raise ValueError("the tier is not one of this transfer engine's")

    def submit(self, src: int, dst: int, copies: Any, user: int = 0) -> int:
        """Queues copies (src_page, dst_page) from tier src to tier dst; the ticket."""
        src = _a.index(src, "Transfer.submit src", len(self._tiers), "tiers:")
        dst = _a.index(dst, "Transfer.submit dst", len(self._tiers), "tiers:")
        user = _a.u64(user, "Transfer.submit user")
        self._undriven("Transfer.submit")
        arr, n = copies_arg(copies)
        t = ctypes.c_uint64()
        with self._use as h:
            self._tiers[src]._check_memory()
            self._tiers[dst]._check_memory()
            rc = lib.kvt_xfer_submit(h, src, dst, arr, n, user, ctypes.byref(t))
            if rc < 0:
                why = self._refused(src, dst, arr, n) if rc == InvalidArgument.code else ""
                raise error(rc, "Transfer.submit", why)
        return self._tickets.issued(t.value)

    def _refused(self, src: int, dst: int, arr: Any, n: int) -> str:
        """Why kvt_xfer_submit refused these copies (looked for once it has:
        the checks it makes, in its order, without their cost on every call)."""
        ts, td = self._tiers[src], self._tiers[dst]
        if src == dst:
            return f"src and dst are both tier {src}: a copy goes from one tier to another"
        if n == 0:
            return "no copies"
        if ts.kind in ("tcp", "ucx"):
            return f"tier {src} is a peer's ({ts.kind}): it is written, never read"
        if td.kind in ("tcp", "ucx") and not ts.host_visible:
            return (f"tier {dst} is a peer's ({td.kind}) and tier {src} is a GPU's: a GPU's pages go to a peer "
                    "from a host tier")
        seen = set()
        for i in range(n):
            c = arr[i]
            if c.src_page >= ts.pages:
                return f"copy {i}: src page {c.src_page} of tier {src}'s {ts.pages} pages"
            if c.dst_page >= td.pages:
                return f"copy {i}: dst page {c.dst_page} of tier {dst}'s {td.pages} pages"
            if c.dst_page in seen:
                return f"copy {i}: dst page {c.dst_page} a second time"
            seen.add(c.dst_page)
        return "the copies"  # (nothing left that the library refuses: a new check of its, unknown here)

    def poll(self, timeout: float = 0.0, max: int = 64) -> List[XferResult]:
        """Completed batches (waiting up to ``timeout`` seconds for the first)."""
        res = self._completions(timeout, max)
        self._tickets.taken(res)
        return res

    def _completions(self, timeout: float = 0.0, max: int = 64) -> List[XferResult]:
        """poll's results, not yet marked taken (wait marks them as it keeps them)."""
        timeout = _a.number(timeout, "Transfer.poll timeout", 0.0, 1e9)
        max = _a.integer(max, "Transfer.poll max", 1, 1 << 16)
        self._undriven("Transfer.poll")
        out = (XferDone * max)()

        def once(h: int, wait_ns: int) -> list:
            got = check(lib.kvt_xfer_poll(h, out, max, wait_ns), "Transfer.poll")
            return [XferResult(d.ticket, d.user, lib.kvt_err_name(d.status).decode(), d.src, d.dst, d.n, d.bad_page)
                    for d in out[:got]]

        return poll_sliced(self._use_poll, once, timeout)

    def wait(self, ticket: int, timeout: float = 60.0) -> XferResult:
        """The result of one batch (other batches polled meanwhile are kept for their own wait)."""
        return wait_ticket(self._results, ticket, self._completions, timeout, "Transfer.wait", self._tickets)

    @property
    def pending(self) -> int:
        with self._use as h:
            return lib.kvt_xfer_pending(h)

    def stats(self, src: int, dst: int) -> Dict[str, Any]:
        """Counters for copies src -> dst, with gbps and latency percentiles (ns)."""
        src = _a.index(src, "Transfer.stats src", len(self._tiers), "tiers:")
        dst = _a.index(dst, "Transfer.stats dst", len(self._tiers), "tiers:")
        if src == dst:
            raise error(InvalidArgument.code, "Transfer.stats", f"src and dst are both tier {src}: a pair is two tiers")
        st = XferStats(size=ctypes.sizeof(XferStats))
        with self._use as h:
            check(lib.kvt_xfer_stats(h, src, dst, ctypes.byref(st)), "Transfer.stats")
        out: Dict[str, Any] = {n: getattr(st, n) for n in XFER_STATS}
        out["gbps"] = st.gbps
        for h in ("queue_ns", "copy_ns", "e2e_ns"):
            hist = getattr(st, h)
            out[h] = {q: lib.kvt_hist_percentile(ctypes.byref(hist), v)
                      for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))} if hist.count else {}
        return out
