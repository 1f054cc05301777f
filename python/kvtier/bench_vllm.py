"""The scheduler side of vLLM's offloading, kvtier's manager beside vLLM's own:
``.venv/bin/python -m kvtier.bench_vllm [TRACE] [--requests N] [--blocks N] [--repeat N] [--policy lru|arc]``.

Each request of a Mooncake trace (its hash ids are its blocks, one group)
makes the calls vLLM's OffloadingConnectorScheduler makes: a new request,
lookups along its block chain up to the first miss, a load of the hits and its
completion, a store of the rest (with each block's end-token position) and its
completion, the request's end. The same calls go to vLLM's
CPUOffloadingManager and to kvtier's manager of the same policy (lru:
KvtierOffloadingManager; arc: KvtierArcOffloadingManager) and capacity,
``--repeat`` times each, taking turns at going first; the JSON gives the
medians and ranges of the cost per request and per lookup, their ratios,
the time the garbage collector took in each, and checks that both made the
same decisions (hits, stores, evictions) in every repetition.

The process's heap is frozen after the set-up, as vLLM's engine core
freezes its own after start-up (vLLM's ``freeze_gc_heap``), and collected
before each run: a full collection during a run then walks that run's own
objects, not the hundreds of thousands torch and vLLM left at import."""
from __future__ import annotations

import argparse
import gc
import json
import pathlib
import platform
import statistics
import time

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.utils.gc_utils import freeze_gc_heap
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from .vllm import KvtierArcOffloadingManager, KvtierOffloadingManager

TRACE = pathlib.Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"
BLOCK_TOKENS = 512  # the trace's hash ids each stand for 512 tokens


def load(path: pathlib.Path, n: int):
    reqs = []
    with open(path) as f:
        for line in f:
            if len(reqs) >= n:
                break
            ids = json.loads(line)["hash_ids"]
            # a block's key stands for its whole prefix (vLLM chains its block hashes): no repeats
            reqs.append(list(dict.fromkeys(make_offload_key(i.to_bytes(32, "big"), 0) for i in ids)))
    return reqs


def run(manager, reqs):
    hits = stores = evicted = looked = 0
    lookup_s = 0.0
    clock = time.perf_counter
    t0 = clock()
    for r, keys in enumerate(reqs):
        ctx = ReqContext(req_id=str(r))
        for i, k in enumerate(keys):
            ctx.set_offload_key_position(k, (i + 1) * BLOCK_TOKENS)
        manager.on_new_request(ctx)
        n = 0
        t1 = clock()
        for k in keys:
            if manager.lookup(k, ctx) != LookupResult.HIT:
                break
            n += 1
        lookup_s += clock() - t1
        looked += min(n + 1, len(keys))
        if n:
            manager.prepare_load(keys[:n], ctx)
            manager.complete_load(keys[:n], ctx)
            hits += n
        out = manager.prepare_store(keys[n:], ctx) if n < len(keys) else None
        if out is not None and out.keys_to_store:
            manager.complete_store(out.keys_to_store, ctx)
            stores += len(out.keys_to_store)
            evicted += len(out.evicted_keys)
        manager.on_request_finished(ctx)
    return clock() - t0, lookup_s, looked, (hits, stores, evicted)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default=str(TRACE))
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--blocks", type=int, default=6000, help="host tier capacity in blocks")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--policy", choices=("lru", "arc"), default="lru", help="both managers' eviction order")
    a = p.parse_args(argv)
    if a.requests < 1 or a.blocks < 1 or a.repeat < 1:
        p.error("--requests, --blocks and --repeat must be at least 1")
    reqs = load(pathlib.Path(a.trace), a.requests)
    times = {"vllm": [], "kvtier": []}
    lookups = {"vllm": [], "kvtier": []}
    gc_s = {"vllm": [], "kvtier": []}
    decisions = {"vllm": [], "kvtier": []}
    looked = 0
    collecting = [0.0, 0.0]  # seconds in collections, the start of the one running

    def on_gc(phase, _info):
        if phase == "start":
            collecting[1] = time.perf_counter()
        else:
            collecting[0] += time.perf_counter() - collecting[1]

    freeze_gc_heap()
    gc.callbacks.append(on_gc)
    try:
        for rep in range(a.repeat):
            for name in ("vllm", "kvtier") if rep % 2 == 0 else ("kvtier", "vllm"):
                ours = KvtierArcOffloadingManager if a.policy == "arc" else KvtierOffloadingManager
                m = (CPUOffloadingManager(num_chunks=a.blocks, cache_policy=a.policy) if name == "vllm"
                     else ours(a.blocks))
                gc.collect()  # the other side's garbage is not this run's to collect
                collecting[0] = 0.0
                t, tl, looked, d = run(m, reqs)
                gc_s[name].append(collecting[0])
                times[name].append(t)
                lookups[name].append(tl)
                decisions[name].append(d)
                m.shutdown()
    finally:
        gc.callbacks.remove(on_gc)
        gc.unfreeze()

    def summary(name):
        ts, tl = times[name], lookups[name]
        per_req, per_look = 1e6 / len(reqs), 1e6 / looked
        return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                "us_per_request": statistics.median(ts) * per_req,
                "us_per_request_range": [min(ts) * per_req, max(ts) * per_req],
                "us_per_lookup": statistics.median(tl) * per_look,
                "us_per_lookup_range": [min(tl) * per_look, max(tl) * per_look],
                "gc_s_median": statistics.median(gc_s[name])}

    out = {"bench": "vllm_manager", "machine": platform.machine(), "cpu": platform.processor() or "unknown",
           "trace": a.trace, "requests": len(reqs), "blocks": a.blocks, "repeat": a.repeat, "policy": a.policy,
           "keys_looked_up": looked,
           "vllm": summary("vllm"), "kvtier": summary("kvtier"),
           "ratio_kvtier_over_vllm": statistics.median(times["kvtier"]) / statistics.median(times["vllm"]),
           "lookup_ratio_kvtier_over_vllm": statistics.median(lookups["kvtier"]) / statistics.median(lookups["vllm"]),
           "hits_stores_evictions": {"vllm": decisions["vllm"][-1], "kvtier": decisions["kvtier"][-1]},
           "same_decisions": len(set(decisions["vllm"] + decisions["kvtier"])) == 1}
    print(json.dumps(out, indent=2))
    return 0 if out["same_decisions"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
