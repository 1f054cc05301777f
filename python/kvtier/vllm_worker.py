"""kvtier under vLLM's OffloadingConnector: the worker half.

``KvtierOffloadingWorker`` is the ``OffloadingWorker`` that vLLM's
OffloadingConnector calls in each worker process. It copies KV blocks
between vLLM's KV tensors and a kvtier host tier, on kvtier's transfer
engine, for the page ids the scheduler-side manager (``kvtier.vllm``) hands
out in ``CPULoadStoreSpec``: one host page per offloaded chunk.

Construction (what the spec's ``get_worker(kv_caches)`` passes)::

    KvtierOffloadingWorker(kv_caches, num_chunks, blocks_per_chunk,
                           threads=1, checksum=True, huge=True)

``kv_caches``: vLLM's ``CanonicalKVCaches``. ``num_chunks``: the manager's
page count (its ids are 0..num_chunks-1). ``blocks_per_chunk``: GPU blocks
per chunk (``OffloadingSpec.blocks_per_chunk``), as vLLM's CPUOffloadingSpec
passes its CPUOffloadingWorker. A chunk takes ``blocks_per_chunk`` x the sum
of the tensors' (padded) page sizes: ``chunk_bytes``, the bytes vLLM's CPU
worker gives a chunk (``worker_kv_bytes_per_block`` x blocks_per_chunk)
without its padding to the next 4 KiB, so the same ``host_bytes`` (or
``cpu_bytes_to_use``) can hold more chunks here than under vLLM's CPU spec
(docs/vllm.md, Options).

Which bytes go where: those vLLM 0.33.0's CPU worker moves (its direct
layout: ``cpu/gpu_worker.py``, ``SingleDirectionOffloadingHandler``). vLLM
keeps one CPU tensor per canonical tensor t, a row of blocks_per_chunk x P_t
bytes per chunk (P_t: t's padded page size); GPU block b of a group goes to
sub-block j of a chunk, and for each of the group's refs (tensor t,
unpadded size s) its first s bytes move: ``gpu[t][b, :s]`` <->
``cpu[t][chunk, j*P_t : j*P_t + s]``. A group's blocks fill its chunks in
order from sub-block ``block_indices[g] % blocks_per_chunk`` of its first
chunk (a prefix part of which is already elsewhere), so the i-th block of
group g lands in flat sub-block skip + i of the group's chunks. Here the same
bytes live in one host page per chunk, sub-block major, so that every
(chunk, sub-block) is one fixed stride from the next:

    host page c (chunk_bytes = bpc x row):
      [ sub 0: t0 (P_0) | t1 (P_1) | ... ][ sub 1: t0 | t1 | ... ] ... [ sub bpc-1 ]
    vLLM's cpu[t][c, j*P_t : (j+1)*P_t]  ==  page c at j*row + off_t (off_t = P_0 + .. + P_t-1)

Copies. A copy class is a set of refs with one unpadded size s and one
padded size P (refs of one group on distinct tensors; groups with equal
sets share it). Per class: an engine tier over vLLM's tensors
(``Tier.from_tensors``: one layer per ref, pieces of s bytes at stride P),
an engine tier over the host page's memory (one layer per ref at its
offset, pieces of s bytes, one page per (chunk, sub-block), stride ``row``),
a second engine tier over vLLM's tensors for expedited loads (its own queue
and workers in the transfer engine, so they never wait behind regular
loads), and one ``Transfer`` over the three. A job is one batch per class it
touches; kvtier copies each (block, ref) piece, coalescing the pieces that
are contiguous on both sides. One host tier shared by every group, rather
than a host tier per class, because vLLM's hybrid models overlay their
groups on the same tensors and a chunk holds one group's key at a time: a
tier per class would take the memory once per group.

    submit_store/submit_load (caller)   checks the specs, plans the copies,
        |                               queues the job: returns at once
        v
    the worker's thread                 waits for vLLM's CUDA stream (CUDA
        |                               tensors), verifies a load's pages,
        |                               submits the batches; polls them;
        v                               records a store's page checksums
    get_finished (caller)               each job's TransferResult, once

Integrity (``checksum``): the host tier keeps kvtier's XXH3-64 per page
(``Tier.checksums()``, ``Tier.page_sum``). The copies reach it through the
per-class engine tiers over its memory, which keep no sums, so the worker's
thread keeps them: a store records its pages' sums when its copies are done;
a load checks them before anything is copied, and a mismatch fails the load
(success=False, nothing written to vLLM's blocks). The sum covers the whole
chunk, also the bytes of sub-blocks and tensors the store did not write (a
chunk belongs to one key and one store at a time, so nothing else changes
them meanwhile). Cost: one XXH3 pass over each chunk a job touches, on the
worker's thread, not the caller's.

Not supported: vLLM's canonical layout (the spec refuses it; the refs'
canonical page mappings are ignored, as vLLM's CPU worker ignores them in
the direct layout). CUDA tensors make device engine tiers (a build
with CUDA); the host memory is registered with the device through the
per-class views; that path is not exercised by the suite.

Failures: a malformed spec (lengths that do not add up, an id out of range)
raises at submit, as vLLM's own worker asserts. A copy that fails, a
checksum that does not match, or memory under a tier resized since it was
made reports the job with success=False. vLLM 0.33.0's stock connector
asserts success (it has no failure path for a transfer), so a failure
stops it rather than serving blocks that were not loaded. Under
``kvtier.vllm.KvtierOffloadingConnector`` (``report_errors``) a load
that fails instead reports success and hands its GPU blocks to
``take_load_errors``: the connector gives them to vLLM's scheduler as
blocks with load errors, which it recomputes, and tells the manager which
keys to forget. A store that fails reports success too, its job id in
``take_store_errors``: the manager forgets its keys once the job ends (the
GPU blocks are fine; their host copies are not), and no load from its
pages passes until they are filled again.

``transfer_size`` counts bytes as vLLM's worker does (per block, the sum of
its group's ref sizes); ``transfer_time`` is seconds from the batches'
submission to the last one's completion.

Threads: one thread per worker runs the jobs; submit, get_finished, wait and
shutdown may be called from any thread.
"""
from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from . import _args as _a
from ._core import hash_arg
from .tier import Plane, Tier
from .vllm import method_diffs
from .xfer import Transfer

try:
    import torch
    from vllm.v1.kv_offload import base as _vbase
    from vllm.v1.kv_offload.base import (BlockIDsLoadStoreSpec, CanonicalKVCaches, GPULoadStoreSpec, LoadStoreSpec,
                                         OffloadingWorker, TransferResult)
except ImportError as e:  # pragma: no cover - the suite runs with vLLM installed
    raise ImportError(f"kvtier.vllm_worker needs vLLM 0.33.0's offloading modules ({e}); "
                      "pip install --no-deps vllm==0.33.0 (see docs/python.md)") from e

__all__ = ["KvtierOffloadingWorker", "check_worker_interface"]

log = logging.getLogger(__name__)


class _Stopped(BaseException):
    """A failure of the worker's own loop raised where a job's errors are
    caught (``except Exception``): it stops the thread, not that job."""

# What this module implements of vLLM's OffloadingWorker, as vLLM 0.33.0 declares it.
_WORKER_SIGNATURES = {
    "submit_store": ["self", "job_id", "src_spec", "dst_spec"],
    "submit_load": ["self", "job_id", "src_spec", "dst_spec", "expedited"],
    "get_finished": ["self"],
    "wait": ["self", "job_ids"],
    "shutdown": ["self"],
}
_FIELDS = {
    "CanonicalKVCacheTensor": ("tensor", "page_size_bytes"),
    "CanonicalKVCacheRef": ("tensor_idx", "page_size_bytes"),
    "CanonicalKVCaches": ("tensors", "group_data_refs"),
    "TransferResult": ("job_id", "success", "transfer_size", "transfer_time"),
}


def check_worker_interface() -> List[str]:
    """The differences between vLLM's OffloadingWorker (and the structures it
    is handed) and what this worker implements (empty: none)."""
    diffs = method_diffs(OffloadingWorker, _WORKER_SIGNATURES)
    for cls, want in _FIELDS.items():
        have = getattr(getattr(_vbase, cls, None), "__dataclass_fields__", {})
        missing = [f for f in want if f not in have]
        if missing:
            diffs.append(f"vllm.v1.kv_offload.base.{cls} lacks {', '.join(missing)}")
    gpu_fields = set(inspect.signature(GPULoadStoreSpec.__init__).parameters)
    if not {"block_ids", "group_sizes", "block_indices"} <= gpu_fields:
        diffs.append(f"GPULoadStoreSpec{tuple(gpu_fields)}: kvtier reads block_ids, group_sizes, block_indices")
    return diffs


_DIFFS = check_worker_interface()
if _DIFFS:
    raise ImportError("kvtier.vllm_worker implements vLLM 0.33.0's OffloadingWorker, and this vLLM's differs: "
                      + "; ".join(_DIFFS))


@dataclass
class _Class:
    """Refs that copy alike: unpadded size s at padded stride P, on these tensors."""
    s: int
    P: int
    tensors: Tuple[int, ...]
    gpu: Optional[Tier] = None
    gpu_fast: Optional[Tier] = None  # the same memory: expedited loads' own queue
    host: Optional[Tier] = None
    xfer: Optional[Transfer] = None
    busy: int = 0  # batches submitted, not yet polled

    GPU, HOST, GPU_FAST = 0, 1, 2  # tier indices in xfer


@dataclass
class _Job:
    job_id: int
    load: bool
    expedited: bool
    batches: List[Tuple[int, np.ndarray]]  # (class, [n, 2] (src page, dst page))
    pages: np.ndarray  # the host pages (chunks) it reads or writes
    size: int
    ready: Any = None  # a CUDA event on vLLM's stream, recorded at submit
    pending: int = 0
    ok: bool = True
    why: str = ""
    t0: float = 0.0
    seq: int = 0
    gpu_blocks: Any = None  # a load's destination blocks (what a load error names)
    fetch: List[Tuple[int, bytes]] = field(default_factory=list)  # a load's pages to get from L3 first: (page, hash)
    put: List[Tuple[bytes, int]] = field(default_factory=list)  # a store's pages to write through: (hash, page)


def _ids(v: Any, job_id: int, what: str) -> np.ndarray:
    """A spec's block or chunk ids as int64: integers only (1.9 is no id)."""
    a = np.asarray(v).ravel()
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"job {job_id}: {what} ids of dtype {a.dtype}, expected integers")
    return a.astype(np.int64, copy=False)


class KvtierOffloadingWorker(OffloadingWorker):
    """Copies vLLM's KV blocks to and from a kvtier host tier of
    ``num_chunks`` pages of ``blocks_per_chunk`` GPU blocks each, on kvtier's
    transfer engine (module docstring: the layout and what moves)."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int, blocks_per_chunk: int, threads: int = 1,
                 checksum: bool = True, huge: bool = True, l3: Optional[Callable[[Tier], Any]] = None) -> None:
        if not isinstance(kv_caches, CanonicalKVCaches):
            raise TypeError(f"kv_caches: expected vLLM's CanonicalKVCaches, not {type(kv_caches).__name__}")
        for what, v in (("num_chunks", num_chunks), ("blocks_per_chunk", blocks_per_chunk)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{what}: {v!r} (expected an integer >= 1)")
        if not kv_caches.tensors:
            raise ValueError("kv_caches: no tensors")
        self.num_chunks = int(num_chunks)
        self.blocks_per_chunk = bpc = int(blocks_per_chunk)
        self.checksum = _a.flag(checksum, "checksum")
        huge = _a.flag(huge, "huge")
        self._closed = False
        self._classes: List[_Class] = []
        self._host: Optional[Tier] = None
        self._sums = None
        self._l3 = None
        try:
            self._build(kv_caches, threads, huge)
            if l3 is not None:  # the L3 store over the host tier: gets fill its pages, puts read them
                self._l3 = l3(self._host)
        except BaseException:
            self._free()
            raise
        self._l3_wait: Dict[int, _Job] = {}  # store ticket -> the job waiting on it
        self.l3_counts = {"pages_fetched": 0, "fetches_failed": 0, "pages_put": 0, "puts_failed": 0}
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
        self._todo: deque = deque()  # jobs to start, in submission order
        self._todo_fast: deque = deque()  # expedited loads: started before those
        self._running: Dict[int, _Job] = {}  # by seq: batches in flight
        self._inflight: Set[int] = set()  # job ids submitted, not yet finished
        self._finished: List[TransferResult] = []
        # failed jobs reported as done (report_errors): a load's GPU blocks, a store's None ...
        self._errors: Dict[int, Optional[List[int]]] = {}
        self._told_loads: Dict[int, List[int]] = {}  # ... once get_finished has returned them
        self._told_stores: Set[int] = set()
        # a failed job: success=False (vLLM's stock connector then stops), or, set by
        # kvtier.vllm.KvtierOffloadingConnector, success=True, and the job in take_load_errors
        # or take_store_errors
        self.report_errors = False
        self._stopping = False
        self._dead = ""  # why the thread stopped, if not by shutdown
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-vllm-worker", daemon=True)
        self._thread.start()
        log.info("kvtier worker: %d chunks x %d B (%d blocks/chunk, %d tensors, %d copy classes), checksum %s",
                 self.num_chunks, self.chunk_bytes, bpc, len(self._P), len(self._classes), self.checksum)

    # ---- setup -------------------------------------------------------------------

    def _build(self, kv: CanonicalKVCaches, threads: int, huge: bool) -> None:
        bpc = self.blocks_per_chunk
        views, self._P = [], []
        for i, ct in enumerate(kv.tensors):
            P = int(ct.page_size_bytes)
            if P < 1:
                raise ValueError(f"kv_caches.tensors[{i}]: page_size_bytes {P}")
            views.append(ct.tensor.view(torch.int8).view((-1, P)))  # as vLLM's worker sees it
            self._P.append(P)
        self._offsets = [sum(self._P[:t]) for t in range(len(self._P))]
        self.row_bytes = sum(self._P)
        self.chunk_bytes = bpc * self.row_bytes
        self.num_blocks = min(v.shape[0] for v in views)
        devices = {v.device for v in views}
        if len(devices) != 1:
            raise ValueError(f"kv_caches: tensors on several devices ({sorted(map(str, devices))})")
        dev = devices.pop()
        self._device = dev if dev.type == "cuda" else None

        # per group: [(class index)], and its bytes per block as vLLM counts them
        index: Dict[Tuple[int, int, Tuple[int, ...]], int] = {}
        self._group_classes: List[List[int]] = []
        self._group_bytes: List[int] = []
        for g, refs in enumerate(kv.group_data_refs):
            by_size: Dict[Tuple[int, int], List[int]] = {}
            for r in refs:
                t, s = int(r.tensor_idx), int(r.page_size_bytes)
                if not 0 <= t < len(self._P):
                    raise ValueError(f"group {g}: a ref to tensor {t} (there are {len(self._P)})")
                if not 0 < s <= self._P[t]:
                    raise ValueError(f"group {g}: a ref of {s} bytes on tensor {t} of {self._P[t]}-byte pages")
                # a ref's canonical page mapping (r.mapping) is for vLLM's canonical layout, which the
                # spec refuses: pages keep the direct layout, as vLLM's CPU worker keeps them by default
                ts = by_size.setdefault((s, self._P[t]), [])
                if t not in ts:  # a ref twice on one tensor moves the same bytes twice in vLLM: once here
                    ts.append(t)
            mine = []
            for (s, P), ts in by_size.items():
                key = (s, P, tuple(ts))
                if key not in index:
                    index[key] = len(self._classes)
                    self._classes.append(_Class(s, P, tuple(ts)))
                mine.append(index[key])
            self._group_classes.append(mine)
            self._group_bytes.append(sum(int(r.page_size_bytes) for r in refs))

        self._host = Tier.host(self.num_chunks, 1, self.chunk_bytes, checksum=self.checksum, huge=huge,
                               name="vllm-offload")
        base = self._host.plane_addr(0, 0, 0)
        last = self._host.plane_addr(0, self.num_chunks - 1, 0)
        if last != base + (self.num_chunks - 1) * self.chunk_bytes:  # the views below assume one block
            raise RuntimeError("the host tier's pages are not one contiguous block")
        if self.checksum:
            self._sums = self._host.checksums()
        slots = self.num_chunks * bpc
        for c in self._classes:
            pieces = [views[t][:, :c.s] for t in c.tensors]
            c.gpu = Tier.from_tensors(pieces, pages=self.num_blocks, name="vllm-kv")
            c.gpu_fast = Tier.from_tensors(pieces, pages=self.num_blocks, name="vllm-kv-expedited")
            c.host = Tier.engine([Plane(c.s, self.row_bytes, layer_bases=[base + self._offsets[t] for t in c.tensors])],
                                 pages=slots, layers=len(c.tensors), keep=[self._host],
                                 register=self._device is not None, name="vllm-offload-slots")
            c.xfer = Transfer([c.gpu, c.host, c.gpu_fast], threads=threads, checksum=False)

    def _free(self) -> None:
        if self._l3 is not None:
            self._l3.close()
            self._l3 = None
        for c in self._classes:
            for name in ("xfer", "gpu", "gpu_fast", "host"):
                obj = getattr(c, name)
                if obj is not None:
                    obj.close()
                    setattr(c, name, None)
        if self._sums is not None:
            self._sums.release()
            self._sums = None
        if self._host is not None:
            self._host.close()
            self._host = None

    # ---- what the layout is --------------------------------------------------------

    @property
    def host(self) -> Tier:
        """The host tier: page c is chunk c (module docstring: its layout)."""
        if self._host is None:
            raise RuntimeError("the worker is shut down")
        return self._host

    def host_offset(self, sub_block: int, tensor_idx: int) -> int:
        """Where, in a host page, sub-block ``sub_block`` of canonical tensor
        ``tensor_idx`` starts (its page_size_bytes follow): vLLM's CPU worker
        keeps those bytes at ``cpu[tensor_idx][chunk, sub_block * P : (sub_block + 1) * P]``."""
        if not 0 <= sub_block < self.blocks_per_chunk or not 0 <= tensor_idx < len(self._P):
            raise IndexError(f"sub-block {sub_block} of tensor {tensor_idx}: there are {self.blocks_per_chunk} "
                             f"sub-blocks and {len(self._P)} tensors")
        return sub_block * self.row_bytes + self._offsets[tensor_idx]

    # ---- planning (the caller's thread) --------------------------------------------

    def _plan(self, job_id: int, gpu: GPULoadStoreSpec, host: LoadStoreSpec, load: bool, expedited: bool) -> _Job:
        if not isinstance(gpu, GPULoadStoreSpec):
            raise TypeError(f"job {job_id}: the GPU side is a {type(gpu).__name__}, expected GPULoadStoreSpec")
        if not isinstance(host, BlockIDsLoadStoreSpec) or isinstance(host, GPULoadStoreSpec):
            raise TypeError(f"job {job_id}: the host side is a {type(host).__name__}, expected CPULoadStoreSpec")
        if isinstance(job_id, bool) or not hasattr(type(job_id), "__index__"):  # vLLM's are ints
            raise TypeError(f"job id: expected an int, not {type(job_id).__name__} {job_id!r}")
        blocks, chunks = _ids(gpu.block_ids, job_id, "GPU block"), _ids(host.block_ids, job_id, "chunk")
        sizes = [_a.integer(n, f"job {job_id}: group size", 0, 1 << 62) for n in gpu.group_sizes]
        starts = [_a.integer(i, f"job {job_id}: block index", 0, 1 << 62) for i in gpu.block_indices]
        if len(sizes) != len(self._group_classes) or len(starts) != len(sizes):
            raise ValueError(f"job {job_id}: {len(sizes)} group sizes and {len(starts)} block indices for "
                             f"{len(self._group_classes)} KV cache groups")
        if blocks.size and (blocks.min() < 0 or blocks.max() >= self.num_blocks):
            raise IndexError(f"job {job_id}: a GPU block id out of 0..{self.num_blocks - 1}")
        if chunks.size and (chunks.min() < 0 or chunks.max() >= self.num_chunks):
            raise IndexError(f"job {job_id}: a chunk id out of 0..{self.num_chunks - 1} (with pipeline stages that "
                             "hold different KV per block, host_bytes gives each stage its own number of chunks, "
                             "and the scheduler hands out stage 0's: give num_chunks instead)")
        bpc = self.blocks_per_chunk
        per_class: Dict[int, List[Tuple[np.ndarray, np.ndarray]]] = {}
        b0 = c0 = size = 0
        for g, (n, start) in enumerate(zip(sizes, starts)):
            n = int(n)
            if n == 0:
                continue
            skip = int(start) % bpc
            nchunks = -(-(n + skip) // bpc)
            gb, gc = blocks[b0:b0 + n], chunks[c0:c0 + nchunks]
            if len(gb) != n or len(gc) != nchunks:
                raise ValueError(f"job {job_id}: group {g} needs {n} blocks in {nchunks} chunks; the specs run out")
            slots = (gc[:, None] * bpc + np.arange(bpc)).ravel()[skip:skip + n]
            for k in self._group_classes[g]:
                per_class.setdefault(k, []).append((gb, slots))
            size += n * self._group_bytes[g]
            b0, c0 = b0 + n, c0 + nchunks
        if b0 != len(blocks) or c0 != len(chunks):
            raise ValueError(f"job {job_id}: the groups take {b0} blocks and {c0} chunks; "
                             f"the specs hold {len(blocks)} and {len(chunks)}")
        batches = []
        for k, parts in sorted(per_class.items()):
            gb = np.concatenate([p[0] for p in parts])
            hs = np.concatenate([p[1] for p in parts])
            pairs = np.stack([hs, gb] if load else [gb, hs], axis=1)
            if len(np.unique(pairs[:, 1])) != len(pairs):  # refused here, not failed later by the copy engine
                raise ValueError(f"job {job_id}: a {'GPU block' if load else 'chunk'} written twice")
            batches.append((k, pairs))
        job = _Job(job_id, load, expedited, batches, np.unique(chunks), size, gpu_blocks=blocks if load else None)
        if self._l3 is not None:
            if load:
                fetch = getattr(host, "fetch", ())
                if any(not 0 <= i < len(chunks) for i, _ in fetch):
                    raise IndexError(f"job {job_id}: an L3 fetch names block index {[i for i, _ in fetch]}, "
                                     f"the load has {len(chunks)} blocks")
                job.fetch = [(int(chunks[i]), hash_arg(h, f"job {job_id}: an L3 fetch's page hash")) for i, h in fetch]
            elif getattr(host, "hashes", None):
                if len(host.hashes) != len(chunks):
                    raise ValueError(f"job {job_id}: {len(host.hashes)} page hashes for {len(chunks)} chunks")
                job.put = [(hash_arg(h, f"job {job_id}: a page hash to write through"), c)
                           for h, c in zip(host.hashes, chunks.tolist())]
        elif getattr(host, "fetch", None):
            raise ValueError(f"job {job_id}: a load from the L3 store, and this worker has none")
        return job

    def _submit(self, job: _Job) -> bool:
        if self._device is not None:  # copy after what vLLM's stream has queued: the model's writes, zeroing
            job.ready = torch.cuda.Event()
            job.ready.record(torch.cuda.current_stream(self._device))
        with self._cv:
            if self._closed or self._stopping or self._dead:
                raise RuntimeError(self._dead or "the worker is shut down")
            if job.job_id in self._inflight:
                raise ValueError(f"job {job.job_id} is already in flight")
            self._seq += 1
            job.seq = self._seq
            self._inflight.add(job.job_id)
            (self._todo_fast if job.expedited else self._todo).append(job)
            self._cv.notify_all()
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Async GPU -> host: queued at once, reported by get_finished."""
        return self._submit(self._plan(job_id, src_spec, dst_spec, load=False, expedited=False))

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        """Async host -> GPU; an expedited load goes before queued loads and
        copies on its own queue."""
        return self._submit(self._plan(job_id, dst_spec, src_spec, load=True, expedited=bool(expedited)))

    # ---- the worker's thread -------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # a bug: say so to every caller rather than leave wait() hanging
            log.exception("kvtier worker: the thread stopped")
            with self._cv:
                self._dead = f"the kvtier worker's thread stopped: {type(e).__name__}: {e}"
                self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._todo_fast or self._todo or self._running or self._l3_wait or self._stopping):
                    self._cv.wait()
                if self._stopping and not (self._todo_fast or self._todo or self._running or self._l3_wait):
                    return
                todo = list(self._todo)
                self._todo.clear()
            self._expedite()
            for job in todo:  # (a regular job's start may hash its pages: an expedited one goes between)
                self._start(job)
                self._expedite()
            self._reap()

    def _expedite(self) -> None:
        """Starts the expedited loads submitted so far, and reports those done:
        vLLM waits on them for its step, so they go before regular jobs, and
        a regular job's start (a load hashes its pages first) does not hold
        up their completion. Called in the middle of a regular job's start:
        what raises here is no fault of that job's, and stops the thread as
        it would from the loop (_Stopped is no Exception)."""
        try:
            with self._cv:
                fast = list(self._todo_fast)
                self._todo_fast.clear()
            for job in fast:
                self._start(job)
            if any(j.expedited for j in self._running.values()):
                self._reap(wait=False)
        except Exception as e:
            raise _Stopped(f"{type(e).__name__}: {e}") from e

    def _start(self, job: _Job) -> None:
        if job.fetch and job.ok:  # the L3 store fills the reserved host pages first; then the copies
            try:
                self._l3_wait[self._l3.get([(h, p) for p, h in job.fetch], user=job.seq)] = job
                return
            except Exception as e:
                job.ok, job.why = False, f"L3 get: {type(e).__name__}: {e}"
        self._copy(job)

    def _fetched(self, job: _Job, r: Any) -> None:
        """A load's L3 get answered: its pages' sums recorded, then its copies."""
        bad = [h for (p, h), res in zip(job.fetch, r.results) if res != "ok"]
        if bad:
            self.l3_counts["fetches_failed"] += 1
            job.ok, job.why = False, f"L3 get: {len(bad)} of {len(job.fetch)} pages {set(r.results) - {'ok'}}"
            self._spoil([p for (p, _), res in zip(job.fetch, r.results) if res != "ok"])
            gone = [h for (p, h), res in zip(job.fetch, r.results) if res == "bad"]
            if gone:  # an object that failed its checks: removed for every instance
                self._l3.remove(gone, user=0)
        else:
            self.l3_counts["pages_fetched"] += len(job.fetch)
            if self._sums is not None:
                for p, _ in job.fetch:
                    self._sums[p] = self._host.page_sum(p)
        self._copy(job)

    def _copy(self, job: _Job) -> None:
        try:
            if job.ready is not None:
                job.ready.synchronize()
            if job.ok and job.load and self._sums is not None:  # a job failed already keeps its reason
                for i, p in enumerate(job.pages.tolist()):
                    if self._host.page_sum(p) != self._sums[p]:
                        job.ok, job.why = False, f"host page {p} fails its checksum"
                        break
                    if i % 256 == 255 and not job.expedited:  # (16 MiB of 64 KiB pages: ~2 ms)
                        self._expedite()
            job.t0 = time.monotonic()
            if job.ok:
                for k, pairs in job.batches:
                    c = self._classes[k]
                    src, dst = (c.HOST, c.GPU_FAST if job.expedited else c.GPU) if job.load else (c.GPU, c.HOST)
                    c.xfer.submit(src, dst, pairs, user=job.seq)
                    job.pending += 1
                    c.busy += 1
        except Exception as e:  # kvtier's errors, a resized tensor, a CUDA error: nothing more is submitted
            job.ok, job.why = False, f"{type(e).__name__}: {e}"
        if job.pending:
            self._running[job.seq] = job
        else:
            self._copied(job)

    def _reap(self, wait: bool = True) -> None:
        busy = [c for c in self._classes if c.busy]
        for c in busy:
            for r in c.xfer.poll(timeout=0.001 / len(busy) if wait else 0.0):
                c.busy -= 1
                job = self._running[r.user]
                job.pending -= 1
                if not r.ok and job.ok:
                    job.ok, job.why = False, f"copy failed: {r.status}"
                if job.pending == 0:
                    del self._running[r.user]
                    self._copied(job)
        if self._l3_wait:
            for r in self._l3.poll(timeout=0.0 if busy or not wait else 0.001):
                job = self._l3_wait.pop(r.ticket, None)
                if job is None:  # a removal of bad objects
                    continue
                if job.load:
                    self._fetched(job, r)
                    continue
                ok = sum(res == "ok" for res in r.results)
                self.l3_counts["pages_put"] += ok
                self.l3_counts["puts_failed"] += ok != len(r.results)  # the L3 copy is best effort
                self._finish(job)

    def _spoil(self, pages: List[int]) -> None:
        """Host pages that a failed get or copy left holding no key's bytes
        (another key's, or some of each): a sum they do not match, so that no
        load from them passes until a store or a fetch fills them."""
        if self._sums is not None:
            for p in pages:
                self._sums[p] = self._host.page_sum(p) ^ 1

    def _copied(self, job: _Job) -> None:
        """A job's copies are done. A store written through to L3 reports when
        the put has read its pages: the manager keeps them pending until then,
        so they cannot be handed to another key meanwhile."""
        if not job.load and not job.ok:
            self._spoil(job.pages.tolist())
        elif not job.load and self._sums is not None:  # a store's pages: their sums (a put checks them)
            for p in job.pages.tolist():
                self._sums[p] = self._host.page_sum(p)
        if job.ok and job.put:
            try:
                self._l3_wait[self._l3.put(job.put, user=job.seq)] = job
                return
            except Exception as e:
                log.warning("kvtier worker: L3 put of job %d: %s: %s", job.job_id, type(e).__name__, e)
                self.l3_counts["puts_failed"] += 1
        self._finish(job)

    def _finish(self, job: _Job) -> None:
        seconds = time.monotonic() - job.t0 if job.t0 else 0.0
        if not job.ok:
            log.warning("kvtier worker: %s job %d failed: %s", "load" if job.load else "store", job.job_id, job.why)
        as_error = not job.ok and self.report_errors
        result = TransferResult(job_id=job.job_id, success=job.ok or as_error, transfer_size=job.size,
                                transfer_time=seconds)
        with self._cv:
            if as_error:
                self._errors[job.job_id] = job.gpu_blocks.tolist() if job.load else None
            self._finished.append(result)
            self._inflight.discard(job.job_id)
            self._cv.notify_all()

    # ---- completion ----------------------------------------------------------------

    def get_finished(self) -> List[TransferResult]:
        """The jobs finished since the last call, each reported once."""
        with self._cv:
            out, self._finished = self._finished, []
            for r in out:  # a failed job is told once its result has been
                if r.job_id in self._errors:
                    blocks = self._errors.pop(r.job_id)
                    if blocks is None:
                        self._told_stores.add(r.job_id)
                    else:
                        self._told_loads[r.job_id] = blocks
        return out

    def take_load_errors(self) -> Dict[int, List[int]]:
        """The failed loads among the jobs get_finished has returned (as
        successes, ``report_errors``) since the last call: job id -> its
        GPU blocks, none of which the job wrote."""
        with self._cv:
            out, self._told_loads = self._told_loads, {}
        return out

    def take_store_errors(self) -> Set[int]:
        """The failed stores among the jobs get_finished has returned (as
        successes, ``report_errors``) since the last call: their job ids."""
        with self._cv:
            out, self._told_stores = self._told_stores, set()
        return out

    def wait(self, job_ids: Set[int]) -> None:
        """Blocks until every job of ``job_ids`` has finished (their results
        still come from get_finished). Ids not in flight return at once."""
        want = set(job_ids)
        with self._cv:
            while want & self._inflight:
                if self._dead:
                    raise RuntimeError(self._dead)
                self._cv.wait()

    def shutdown(self) -> None:
        """Lets the jobs in flight finish, stops the thread and frees the host
        tier, the tiers over vLLM's tensors (the tensors are vLLM's) and the
        transfer engines. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._stopping = True
            self._cv.notify_all()
        self._thread.join()
        with self._cv:
            self._closed = True
        self._free()

    def __repr__(self) -> str:
        state = "shut down" if self._closed else f"{len(self._inflight)} jobs in flight"
        return (f"<KvtierOffloadingWorker {self.num_chunks} chunks x {self.chunk_bytes} B, "
                f"{self.blocks_per_chunk} blocks/chunk, {state}>")
