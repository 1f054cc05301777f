"""Mooncake request traces (JSONL: timestamp, input_length, output_length,
hash_ids), their token ids as `kvtier replay` builds them, and a replay
through the binding that makes the calls an engine makes per request."""
from __future__ import annotations

import ctypes
import json
import os
import time
from typing import Any, Dict, List, NamedTuple

import numpy as np

from . import _args
from ._core import check
from ._lib import Trace, TraceReq, lib

BLOCK_TOKENS = 512  # tokens a Mooncake hash id stands for (KVT_TRACE_BLOCK_TOKENS)

__all__ = ["TraceRequest", "load", "block_tokens", "request_tokens", "replay"]


class TraceRequest(NamedTuple):
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple


def load(path: Any, limit: int = 0) -> List[TraceRequest]:
    """Parses a Mooncake trace with the library's parser (kvtier/trace.h, the
    one `kvtier replay` uses): a malformed line raises ParseError (a
    ValueError) naming ``path:line`` and what is wrong; a file that cannot be
    read, IOFailure (an OSError). ``limit``: the first requests only (0: all);
    the whole file is parsed first, as `kvtier replay --limit` parses it, so a
    malformed line past them is an error too."""
    name = _args.text(os.fspath(path) if isinstance(path, os.PathLike) else path, "path")
    limit = _args.u64(limit, "limit")
    t = Trace()
    err = ctypes.create_string_buffer(512)
    rc = lib.kvt_trace_load(name, ctypes.byref(t), err, len(err))
    check(rc, "kvtier.trace.load", err.value.decode(errors="replace"))
    try:
        n = t.n if limit == 0 else min(limit, t.n)
        return [TraceRequest(r.timestamp_ms, r.input_length, r.output_length, tuple(r.hash_ids[:r.nblocks]))
                for r in (t.req[i] for i in range(n))]
    finally:
        lib.kvt_trace_free(ctypes.byref(t))


def block_tokens(ids: Any, block: int = BLOCK_TOKENS) -> np.ndarray:
    """The tokens of hash-id blocks, concatenated: token j of block id is
    splitmix64(id << 9 | j) & 0x7fffffff (kvt_trace_block_tokens, as
    `kvtier replay` builds them), the first ``block`` of each block's 512."""
    block = _args.integer(block, "block", 0, BLOCK_TOKENS)
    if isinstance(ids, np.ndarray):
        ids = ids.tolist()
    ids = [_args.u32(i, "ids[]") for i in _args.sequence(ids, "ids")]
    out = np.empty((len(ids), BLOCK_TOKENS), dtype=np.int32)
    base = out.ctypes.data
    for k, i in enumerate(ids):
        lib.kvt_trace_block_tokens(i, ctypes.cast(base + k * BLOCK_TOKENS * 4, ctypes.POINTER(ctypes.c_int32)))
    return out[:, :block].reshape(-1)


def request_tokens(r: TraceRequest) -> np.ndarray:
    """A request's int32 token ids, exactly as `kvtier replay` builds them
    (kvt_trace_request_tokens)."""
    ids_in = r.hash_ids.tolist() if isinstance(r.hash_ids, np.ndarray) else r.hash_ids
    hash_ids = [_args.u32(i, "request_tokens hash_ids[]") for i in _args.sequence(ids_in, "request_tokens hash_ids")]
    n, length = len(hash_ids), _args.u64(r.input_length, "request_tokens input_length")
    if not 0 < length <= n * BLOCK_TOKENS or length <= (n - 1) * BLOCK_TOKENS:
        raise ValueError(f"input_length {length} does not fit {n} blocks of {BLOCK_TOKENS} tokens")
    ids = (ctypes.c_uint32 * n)(*hash_ids)
    req = TraceReq(0, length, 0, ids, n)  # (the times and output length make no tokens)
    out = np.empty(length, dtype=np.int32)  # the length checked above (input_length is read once)
    lib.kvt_trace_request_tokens(ctypes.byref(req), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
    return out


def replay(cache: Any, reqs: List[TraceRequest], prefetch_ahead: int = 4) -> Dict[str, Any]:
    """Feeds every request through a Cache as an engine would: tokens built,
    prefetched ahead when the cache has an L3, admitted, committed, released.
    Returns the cache's statistics with the hit rate and the time taken (the
    same calls, in the same order, as `kvtier replay`)."""
    has_l3 = cache.has_l3
    ahead = prefetch_ahead if has_l3 else 0
    ring: List[Any] = [None] * (ahead + 1)
    nxt = 0
    n = len(reqs)
    build_s = 0.0
    t0 = time.perf_counter()
    for i in range(n):
        while nxt < n and nxt <= i + ahead:
            tb = time.perf_counter()
            tk = request_tokens(reqs[nxt])
            build_s += time.perf_counter() - tb
            ring[nxt % len(ring)] = (tk, cache.prefetch(tk) if has_l3 else None)
            nxt += 1
        tk, pf = ring[i % len(ring)]
        req = cache.admit(tk, prefetch=pf)
        req.commit()
        req.release()
    cache.sync()
    wall = time.perf_counter() - t0
    st = cache.stats()
    hits = st["l1_hit_tokens"] + st["l2_hit_tokens"] + st["l3_hit_tokens"]
    st.update(hit_rate=hits / st["tokens"] if st["tokens"] else 0.0, wall_s=wall, requests_per_s=n / wall,
              tokens_s=build_s)  # of wall_s: building the requests' tokens
    return st


def _main(argv=None) -> int:
    """python3 -m kvtier.trace: a replay through the binding, next to `kvtier replay` (the same settings)."""
    import argparse
    import statistics
    import subprocess

    from .cache import Cache, PREFETCH_POLICIES

    p = argparse.ArgumentParser(prog=".venv/bin/python -m kvtier.trace",
                                description="Replays a Mooncake trace through the Python binding; with --compare, "
                                            "also through `kvtier replay` with the same settings, and reports both "
                                            "hit rates and costs per request (medians of --repeat runs).")
    p.add_argument("trace")
    p.add_argument("--l1-pages", type=int, default=65536)
    p.add_argument("--l2-pages", type=int, default=262144)
    p.add_argument("--l3-pages", type=int, default=0, help="a modeled L3 (prefetches on)")
    p.add_argument("--prefetch-policy", default="best_effort", choices=PREFETCH_POLICIES)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--compare", metavar="KVTIER", help="the kvtier command to compare with (e.g. build/kvtier)")
    a = p.parse_args(argv)
    for name, lo in (("l1_pages", 1), ("l2_pages", 0), ("l3_pages", 0), ("limit", 0), ("repeat", 1)):
        if getattr(a, name) < lo:
            p.error(f"--{name.replace('_', '-')}: {getattr(a, name)} (expected at least {lo})")
    if a.l3_pages and not a.l2_pages:
        p.error("--l3-pages: needs an L2 tier (--l2-pages > 0): pages reach L3 through L2")
    if a.prefetch_policy != "best_effort" and not a.l3_pages:
        p.error("--prefetch-policy: needs an L3 (--l3-pages): prefetches come from it")
    try:
        reqs = load(a.trace, limit=a.limit)
    except (OSError, ValueError) as e:  # (ParseError is a ValueError: FILE:LINE and why)
        p.exit(1, f"{p.prog}: {e}\n")
    cfg = dict(l1_pages=a.l1_pages, l2_pages=a.l2_pages, l3_pages=a.l3_pages, prefetch_policy=a.prefetch_policy)
    try:
        Cache(**cfg).close()  # (a setting the cache refuses: a usage error, before any run)
    except (ValueError, TypeError) as e:
        p.error(str(e))
    py, tok, st = [], [], {}
    for _ in range(a.repeat):
        with Cache(**cfg) as c:
            st = replay(c, reqs)
        py.append(st["wall_s"] / len(reqs))
        tok.append(st["tokens_s"] / len(reqs))
    out: Dict[str, Any] = {"requests": len(reqs), "settings": cfg, "hit_rate": st["hit_rate"],
                           "hit_tokens": {t: st[f"{t}_hit_tokens"] for t in ("l1", "l2", "l3")},
                           "binding_us_per_request": {"median": 1e6 * statistics.median(py), "max": 1e6 * max(py)},
                           "of_which_token_building_us": 1e6 * statistics.median(tok)}
    if a.compare:
        cmd = [a.compare, "replay", a.trace, "--json", "--l1-pages", str(a.l1_pages), "--l2-pages", str(a.l2_pages),
               "--l3-pages", str(a.l3_pages), "--prefetch-policy", a.prefetch_policy]
        if a.limit:
            cmd += ["--limit", str(a.limit)]
        cs, c_out = [], {}
        for _ in range(a.repeat):
            try:
                run = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                p.exit(1, f"{p.prog}: --compare: cannot run {a.compare}: {e}\n")
            if run.returncode != 0:
                p.exit(1, f"{p.prog}: --compare: {' '.join(cmd)} failed (exit {run.returncode}): {run.stderr.strip()}\n")
            try:
                c_out = json.loads(run.stdout)
            except ValueError:
                p.exit(1, f"{p.prog}: --compare: {a.compare} printed no JSON report\n")
            cs.append(c_out["wall_s"] / c_out["requests"])
        same = c_out["hit_tokens"] == out["hit_tokens"] and c_out["tokens"] == st["tokens"]
        out.update(command_us_per_request={"median": 1e6 * statistics.median(cs), "max": 1e6 * max(cs)},
                   command_hit_rate=c_out["hit_rate"], same_hits=same,
                   binding_overhead_us_per_request=1e6 * (statistics.median(py) - statistics.median(cs)),
                   ratio=statistics.median(py) / statistics.median(cs))
    print(json.dumps(out, indent=1))
    return 0 if out.get("same_hits", True) else 1


if __name__ == "__main__":
    raise SystemExit(_main())
