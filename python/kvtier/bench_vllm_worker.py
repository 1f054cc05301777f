"""The worker side of vLLM's offloading: ``KvtierOffloadingWorker``'s copies
against the machine's best single-thread copy of the same bytes.
``.venv/bin/python -m kvtier.bench_vllm_worker [--layouts ...] [--block-bytes 16384] [--mb 64] [--reps 7] [--cpus 1]``.

Each layout is a ``CanonicalKVCaches`` as vLLM 0.33.0's connector builds it
(per tensor a ``(num_blocks, page_bytes)`` int8 view of one backing
allocation), here in host memory:

  per_layer   one tensor per layer, the block's K and V inside one page of
              ``block-bytes`` (vLLM's standardized layout); one group
  kv_split    per layer a K tensor and a V tensor of ``block-bytes / 2`` each
              (K and V planes apart, as SGLang's pools and older vLLM layouts)
  packed      one tensor whose page is every layer's block (vLLM's packed
              layouts: one region per block)
  groups      two KV cache groups overlaying the per-layer tensors (a hybrid
              model's full and sliding-window layers), half the blocks each

A store moves every block of the layout (``--mb`` MiB in all) to the host
tier and a load moves it back, one job each; GPU block ids in a random order
(vLLM's free-block queue after some churn; ``--order sequential``: in
order), host chunks in order. ``--huge`` puts the tensors on transparent
huge pages.
``--blocks-per-chunk`` GPU blocks per host chunk. Per repetition, back to
back on the same thread: the reference copies (``ctypes.memmove`` of one
contiguous block of the same bytes, and a streaming-store copy of it: one
span through kvtier's transfer engine between two host tiers), then the
worker's store and load. ``ratio`` is the worker against the better
reference of the same repetition; the JSON gives medians, min and max over
repetitions. ``wall`` is submit to ``wait`` returning (planning, the
worker's thread, polling included); ``copy`` is the worker's own
``transfer_time`` (the copies). The worker runs without checksums (the
copies alone); ``--checksum`` adds them (a store hashes every chunk it
wrote, a load every chunk before it copies). ``--cpus`` pins the process and
its threads, as ``kvtier bench xfer --cpus`` (docs/performance.md, *Which
core copies*)."""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import statistics
import time
from typing import Dict, List

import numpy as np
import torch
from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from .tier import Tier
from .vllm_worker import KvtierOffloadingWorker
from .xfer import Transfer

LAYOUTS = ("per_layer", "kv_split", "packed", "groups")


def layout(name: str, layers: int, block_bytes: int, num_blocks: int, huge: bool = False):
    """(CanonicalKVCaches, what keeps its memory, groups) of one layout."""
    if name == "per_layer" or name == "groups":
        pages = [block_bytes] * layers
    elif name == "kv_split":
        pages = [block_bytes // 2, block_bytes - block_bytes // 2] * layers
    elif name == "packed":
        pages = [block_bytes * layers]
    else:
        raise ValueError(f"layout {name!r}: expected one of {', '.join(LAYOUTS)}")
    n, buf = num_blocks * sum(pages), None
    if huge:  # transparent huge pages under the tensors, as the host tier has them
        buf = mmap.mmap(-1, n + (2 << 20))
        buf.madvise(mmap.MADV_HUGEPAGE)
        backing = torch.frombuffer(buf, dtype=torch.int8)[:n]
    else:
        backing = torch.empty(n, dtype=torch.int8)
    backing.view(torch.uint8).numpy()[:] = np.random.default_rng(1).integers(0, 256, backing.numel(), np.uint8)
    tensors, off = [], 0
    for P in pages:
        tensors.append(CanonicalKVCacheTensor(backing[off:off + num_blocks * P].view(num_blocks, P), P))
        off += num_blocks * P
    refs = [CanonicalKVCacheRef(t, P) for t, P in enumerate(pages)]
    groups = [refs, list(refs)] if name == "groups" else [refs]
    return CanonicalKVCaches(tensors, groups), (backing, buf), len(groups)


def job_specs(num_blocks: int, ngroups: int, bpc: int, rng: np.random.Generator, order: str):
    """(GPU spec, host spec) of one job moving every block once: the groups
    take equal shares of the blocks, each from its own chunks."""
    blocks = rng.permutation(num_blocks) if order == "random" else np.arange(num_blocks)
    per = num_blocks // ngroups
    sizes = [per] * (ngroups - 1) + [num_blocks - per * (ngroups - 1)]
    nchunks = sum(-(-n // bpc) for n in sizes)
    gpu = GPULoadStoreSpec(blocks.tolist(), group_sizes=sizes, block_indices=[0] * ngroups)
    return gpu, CPULoadStoreSpec(list(range(nchunks))), nchunks


def timed_job(w: KvtierOffloadingWorker, job_id: int, gpu, host, load: bool):
    t0 = time.perf_counter()
    (w.submit_load(job_id, host, gpu) if load else w.submit_store(job_id, gpu, host))
    w.wait({job_id})
    wall = time.perf_counter() - t0
    (r,) = w.get_finished()
    if not r.success:
        raise RuntimeError(f"job {job_id} failed")
    return wall, r.transfer_time


def stat(xs: List[float]) -> Dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def bench_layout(name: str, a: argparse.Namespace) -> dict:
    bytes_total = a.mb << 20
    num_blocks = bytes_total // (a.block_bytes * a.layers)
    kv, backing, ngroups = layout(name, a.layers, a.block_bytes, num_blocks, a.huge)
    rng = np.random.default_rng(a.seed)
    gpu, host, nchunks = job_specs(num_blocks, ngroups, a.blocks_per_chunk, rng, a.order)
    w = KvtierOffloadingWorker(kv, nchunks, a.blocks_per_chunk, checksum=a.checksum)
    moved = num_blocks * a.block_bytes * a.layers
    # the references: one block of the same bytes, memmove and a streamed span (host tier to host tier)
    ra, rb = Tier.host(1, 1, moved, huge=True), Tier.host(1, 1, moved, huge=True)
    rx = Transfer([ra, rb], checksum=False)
    pa, pb = ra.plane_addr(0, 0, 0), rb.plane_addr(0, 0, 0)
    ctypes.memset(pa, 0x5a, moved)
    ctypes.memset(pb, 0xa5, moved)
    out = {k: [] for k in ("memmove", "stream", "store_wall", "store_copy", "load_wall", "load_copy")}
    ratios = {k: [] for k in ("store_wall", "store_copy", "load_wall", "load_copy")}
    try:
        timed_job(w, 0, gpu, host, load=False)  # faults the host tier in
        for r in range(a.reps):
            t0 = time.perf_counter()
            ctypes.memmove(pb, pa, moved)
            mm = moved / (time.perf_counter() - t0) / 1e9
            t0 = time.perf_counter()
            rx.wait(rx.submit(0, 1, [(0, 0)]))
            st = moved / (time.perf_counter() - t0) / 1e9
            best = max(mm, st)
            out["memmove"].append(mm)
            out["stream"].append(st)
            for load in (False, True):
                wall, copy = timed_job(w, 1 + 2 * r + load, gpu, host, load)
                d = "load" if load else "store"
                for kind, s in (("wall", wall), ("copy", copy)):
                    gbps = moved / s / 1e9
                    out[f"{d}_{kind}"].append(gbps)
                    ratios[f"{d}_{kind}"].append(gbps / best)
        # the bytes, outside the clock: stored, overwritten, loaded back (a worker that moved nothing fails)
        want = backing[0].clone()
        timed_job(w, 1 + 2 * a.reps, gpu, host, load=False)
        backing[0].fill_(0)
        timed_job(w, 2 + 2 * a.reps, gpu, host, load=True)
        if not torch.equal(backing[0], want):
            raise RuntimeError(f"{name}: the blocks loaded back differ from those stored")
    finally:
        w.shutdown()
        rx.close()
        ra.close()
        rb.close()
    del backing
    return {"layout": name, "tensors": len(kv.tensors), "groups": ngroups, "blocks": num_blocks,
            "bytes": moved, "gbps": {k: stat(v) for k, v in out.items()},
            "ratio": {k: stat(v) for k, v in ratios.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_vllm_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--block-bytes", type=int, default=16384, help="bytes of one block of one layer (16384)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--mb", type=int, default=64, help="MiB one job moves (64: well past the last-level cache)")
    p.add_argument("--blocks-per-chunk", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--checksum", action="store_true", help="the worker keeps and checks page checksums")
    p.add_argument("--order", choices=("random", "sequential"), default="random",
                   help="GPU block ids of a job: a random permutation (vLLM's free-block queue after churn) or in order")
    p.add_argument("--huge", action="store_true", help="vLLM's tensors on transparent huge pages (madvise)")
    p.add_argument("--cpus", default="", help="pin to these CPUs, e.g. 1 (default: not pinned)")
    a = p.parse_args(argv)
    names = [n for n in a.layouts.split(",") if n]
    for n in names:
        if n not in LAYOUTS:
            p.error(f"--layouts: {n!r} (expected some of {', '.join(LAYOUTS)})")
    if a.block_bytes < 2 or a.layers < 1 or a.mb < 1 or a.blocks_per_chunk < 1 or a.reps < 1:
        p.error("--block-bytes >= 2, --layers, --mb, --blocks-per-chunk and --reps >= 1")
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    torch.set_num_threads(1)
    results = [bench_layout(n, a) for n in names]
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": a.cpus or "all",
                      "block_bytes": a.block_bytes, "layers": a.layers, "mb": a.mb,
                      "blocks_per_chunk": a.blocks_per_chunk, "order": a.order, "huge": a.huge, "reps": a.reps,
                      "checksum": a.checksum,
                      "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
