"""The PD hand-off (pd.h): a prefill group of C ranks hands a request's KV
pages to a decode instance over TCP or UCX. The decode side runs a
:class:`PdReceiver` over a pool tier; each prefill rank a :class:`PdSender`
from its own tier."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, NamedTuple, Optional

from . import _args as _a
from . import _fields
from ._core import Handle, check, error, poll_sliced
from ._lib import PdEvent, PdRankStats, PdReceiverConfig, PdSenderConfig, PdStats, lib
from .xfer import copies_arg

__all__ = ["PdReceiver", "PdSender", "PdEventInfo", "TRANSPORTS"]

TRANSPORTS = ("tcp", "ucx")
EVENTS = {1: "complete", 2: "failed", 3: "end"}
REASONS = ("none", "vanished", "send", "timeout", "bye")
PD_STATS = tuple(f for f, _, _ in _fields.PD_STATS)
PD_RANK_STATS = tuple(f for f, _, _ in _fields.PD_RANK_STATS)


def _transport(t: str) -> int:
    if not isinstance(t, str):
        raise TypeError(f"transport: expected a str ({', '.join(TRANSPORTS)}), not {type(t).__name__}")
    if t not in TRANSPORTS:
        raise ValueError(f"transport: {t!r} (choose from {', '.join(TRANSPORTS)})")
    if t == "ucx" and not lib.kvt_net_ucx_built():
        raise error(-13, "transport ucx", "this library was built without UCX")
    return TRANSPORTS.index(t)


class PdEventInfo(NamedTuple):
    """A hand-off that completed (its pool pages are the caller's until
    release), failed (release it too), or the end of the control loop."""
    type: str
    handoff: int
    status: str
    rank: int
    reason: str
    pages: tuple


def _rank_dict(r: PdRankStats) -> Dict[str, Any]:
    d: Dict[str, Any] = {n: getattr(r, n) for n in PD_RANK_STATS}
    d["gbps"], d["straggler_factor"] = r.gbps, r.straggler_factor
    return d


def _token(token: Any, what: str) -> int:
    t = _a.u64(token, what)
    if t == 0:
        raise ValueError(f"{what}: 0 would let any writer into the pool: the group's secret is a nonzero number")
    return t


class PdReceiver(Handle):
    """Decode's end: listens on a data port (the page server writing into
    ``pool``) and a control port; ``ranks`` senders must join. Any thread
    may call it; polls take turns; ``close`` waits for the calls in flight."""

    def __init__(self, pool: Any, ranks: int, token: int, transport: str = "tcp", host: Optional[str] = None,
                 data_port: int = 0, control_port: int = 0, generation: int = 0, resume_from: int = 0,
                 timeout_ms: int = 0, join_timeout_ms: int = 0, window: int = 0, straggler_factor: float = 0.0,
                 max_live: int = 0) -> None:
        super().__init__()
        from .tier import Tier
        w = "PdReceiver"
        _a.instance(pool, Tier, f"{w} pool")
        self._host = _a.text(host, f"{w} host", optional=True)
        cfg = PdReceiverConfig(size=ctypes.sizeof(PdReceiverConfig), transport=_transport(transport),
                               host=self._host, data_port=_a.u16(data_port, f"{w} data_port"),
                               control_port=_a.u16(control_port, f"{w} control_port"),
                               ranks=_a.u32(ranks, f"{w} ranks"), token=_token(token, f"{w} token"),
                               generation=_a.u32(generation, f"{w} generation"),
                               resume_from=_a.u64(resume_from, f"{w} resume_from"),
                               timeout_ms=_a.u64(timeout_ms, f"{w} timeout_ms"),
                               join_timeout_ms=_a.u64(join_timeout_ms, f"{w} join_timeout_ms"),
                               window=_a.u32(window, f"{w} window"),
                               straggler_factor=_a.number(straggler_factor, f"{w} straggler_factor"),
                               max_live=_a.u32(max_live, f"{w} max_live"))
        h = ctypes.c_void_p()
        with pool._use as pp:
            pool._check_memory()
            cfg.pool = pp
            check(lib.kvt_pd_receiver_create(ctypes.byref(h), ctypes.byref(cfg)), "PdReceiver",
                  f"ranks={ranks} (1..32), a host-visible pool tier, free ports")
            self._own(h.value, (pool,))

    def _destroy(self, h: int) -> None:
        lib.kvt_pd_receiver_destroy(h)

    @property
    def data_port(self) -> int:
        with self._use as h:
            return lib.kvt_pd_receiver_data_port(h)

    @property
    def control_port(self) -> int:
        with self._use as h:
            return lib.kvt_pd_receiver_control_port(h)

    def poll(self, timeout: float = 0.0, max: int = 16) -> List[PdEventInfo]:
        timeout = _a.number(timeout, "PdReceiver.poll timeout", 0.0, 1e9)
        max = _a.integer(max, "PdReceiver.poll max", 1, 1 << 16)
        out = (PdEvent * max)()

        def once(h: int, wait_ns: int) -> list:  # (an event's pages point into the receiver until its next poll)
            got = check(lib.kvt_pd_receiver_poll(h, out, max, wait_ns), "PdReceiver.poll")
            return [PdEventInfo(EVENTS.get(e.type, str(e.type)), e.handoff, lib.kvt_err_name(e.status).decode(),
                                e.rank, REASONS[e.reason] if 0 <= e.reason < len(REASONS) else str(e.reason),
                                tuple(e.pages[i] for i in range(e.npages)) if e.pages else ())
                    for e in out[:got]]

        return poll_sliced(self._use_poll, once, timeout)

    def release(self, handoff: int) -> None:
        """The caller is done with a hand-off's pool pages."""
        handoff = _a.u64(handoff, "PdReceiver.release handoff")
        with self._use as h:
            check(lib.kvt_pd_receiver_release(h, handoff), "PdReceiver.release")

    def stats(self) -> Dict[str, Any]:
        st = PdStats(size=ctypes.sizeof(PdStats))
        with self._use as h:
            check(lib.kvt_pd_receiver_stats(h, ctypes.byref(st)), "PdReceiver.stats")
        d: Dict[str, Any] = {n: getattr(st, n) for n in PD_STATS}
        d.update(straggler=st.straggler, straggler_factor=st.straggler_factor, first_vanished=st.first_vanished,
                 first_failed=st.first_failed, ranks=[_rank_dict(st.rank[i]) for i in range(st.ranks)],
                 data_last_error=st.data_last_error.decode(errors="replace"),
                 control_last_error=st.control_last_error.decode(errors="replace"))
        h = st.handoff_ns  # first REQ to last DONE
        d["handoff_ns"] = {q: lib.kvt_hist_percentile(ctypes.byref(h), v)
                           for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))} if h.count else {}
        return d


class PdSender(Handle):
    """One prefill rank's end: joins the receiver (blocking until welcomed)
    and sends its pages of each hand-off from tier ``src``. The C sender is
    used by one thread at a time: this object serialises calls from several."""

    _SERIAL = True

    def __init__(self, src: Any, rank: int, ranks: int, token: int, data_port: int, control_port: int,
                 transport: str = "tcp", host: Optional[str] = None, streams: int = 0, max_batch_bytes: int = 0,
                 welcome_timeout_ms: int = 0) -> None:
        super().__init__()
        from .tier import Tier
        w = "PdSender"
        _a.instance(src, Tier, f"{w} src")
        self._host = _a.text(host, f"{w} host", optional=True)
        cfg = PdSenderConfig(size=ctypes.sizeof(PdSenderConfig), transport=_transport(transport),
                             host=self._host, data_port=_a.u16(data_port, f"{w} data_port"),
                             control_port=_a.u16(control_port, f"{w} control_port"), rank=_a.u32(rank, f"{w} rank"),
                             ranks=_a.u32(ranks, f"{w} ranks"), token=_a.u64(token, f"{w} token"),
                             streams=_a.u32(streams, f"{w} streams"),
                             max_batch_bytes=_a.u64(max_batch_bytes, f"{w} max_batch_bytes"),
                             welcome_timeout_ms=_a.u64(welcome_timeout_ms, f"{w} welcome_timeout_ms"))
        h = ctypes.c_void_p()
        with src._use as sp:
            cfg.src = sp
            check(lib.kvt_pd_sender_create(ctypes.byref(h), ctypes.byref(cfg)), "PdSender",
                  "cannot join the receiver (wrong ports, token, rank or group size?)")
            self._own(h.value, (src,))
        self._src = src

    def _destroy(self, h: int) -> None:
        lib.kvt_pd_sender_destroy(h)

    def begin(self, handoff: int, npages: int) -> List[int]:
        """The pool page of each of the hand-off's npages pages (all ranks');
        blocks while decode waits for room."""
        handoff = _a.u64(handoff, "PdSender.begin handoff")
        npages = _a.integer(npages, "PdSender.begin npages", 1, _a.U32_MAX)
        dst = (ctypes.c_uint32 * npages)()
        with self._use as h:
            check(lib.kvt_pd_sender_begin(h, handoff, npages, dst), "PdSender.begin")
        return list(dst)

    def send(self, handoff: int, copies: Any) -> None:
        """Sends this rank's pages of the hand-off ((src_page, pool_page) pairs,
        pool_page = begin's list[j] for j % ranks == rank: another rank's page
        is refused, nothing sent) and waits until decode acknowledged every
        byte, then says DONE."""
        handoff = _a.u64(handoff, "PdSender.send handoff")
        arr, n = copies_arg(copies)
        with self._use as h:
            self._src._check_memory()
            check(lib.kvt_pd_sender_send(h, handoff, arr, n), "PdSender.send")

    def finish(self) -> None:
        """Goodbye: every hand-off of this rank is done."""
        with self._use as h:
            check(lib.kvt_pd_sender_finish(h), "PdSender.finish")

    @property
    def linked(self) -> bool:
        with self._use as h:
            return bool(lib.kvt_pd_sender_linked(h))

    def stats(self) -> Dict[str, Any]:
        st = PdRankStats()
        with self._use as h:
            check(lib.kvt_pd_sender_stats(h, ctypes.byref(st)), "PdSender.stats")
        return _rank_dict(st)

