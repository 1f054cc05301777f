"""A smoke-size run of the peer benchmark (python -m kvtier.bench_peers):
every backend it compares (kvtier over a directory, a Redis server and a
3-master Redis Cluster; SGLang's HiCacheFile; SGLang's MooncakeStore over
Mooncake Store with its master, metadata server and a storage client) is
started, driven through SGLang's real host pool and controller calls, checked
byte for byte by the benchmark itself, and stopped. It runs in this process
so that SGLang is imported once for the suite."""
from __future__ import annotations

import json
import os
import shutil

import psutil
import pytest

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


def _servers() -> list:
    return [p for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_smoke_run_every_backend(capsys, tmp_path):
    if not os.access(REDIS, os.X_OK):
        pytest.skip(f"{REDIS} is not installed (apt-get install redis-server)")
    from kvtier import bench_peers
    before = {p.pid for p in _servers()}
    assert bench_peers.main(["--smoke", "--dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)

    names = list(bench_peers.BACKENDS)
    assert out["backends"] == names and out["smoke"]
    cells = {(r["backend"], r["op"], r["page"], r["batch"]) for r in out["rows"]}
    want = {(n, op, "64KiB", b) for n in names for op in ("batch_set_v1", "batch_get_v1") for b in (1, 16)}
    assert cells == want
    for r in out["rows"]:
        assert r["gbps"]["median"] > 0 and r["batches_per_repeat"] == 2, r
        assert 0 < r["p50_ms"]["median"] <= r["p99_ms"]["median"], r
    for n in names:
        for chain in ("all", "half", "none"):
            assert out["batch_exists_128"][n][chain]["p50_us"]["median"] > 0
    # a ratio for every kvtier row with a like-for-like peer, none for the rest
    pairs = {(q["kvtier"], q["peer"]) for q in out["ratios"]}
    assert pairs == {(k, p) for k, ps in bench_peers.LIKE.items() for p in ps}
    assert len(out["ratios"]) == sum(len(ps) for ps in bench_peers.LIKE.values()) * (4 + 3)
    # every server it started is gone, and its files with them
    assert {p.pid for p in _servers()} - before == set()
    assert os.listdir(tmp_path) == []
    table = bench_peers.table(out)
    assert table.count("\n| batch_set_v1 | 64KiB |") == 2 and "| none |" in table


def test_a_page_served_for_another_key_fails_the_cell():
    """The cell's own check: a store answering a key with the page it holds
    for another key (of the same batch, of another batch at the same place,
    the last one written, a batch of one page) is caught, not timed as a fast
    get: every key's bytes are its own."""
    from types import SimpleNamespace

    import torch

    from kvtier import bench_peers
    ps = 4

    def backend(batch, wrong):
        pool = SimpleNamespace(page_size=ps, kv_buffer=torch.zeros((2, 2 * batch * ps, 1, 2), dtype=torch.float16))
        held = {}

        def put(keys, idx):
            for j, k in enumerate(keys):
                held[k] = pool.kv_buffer[:, idx[j * ps:(j + 1) * ps]].clone()
            return True

        def get(keys, idx):
            for j, k in enumerate(keys):
                pool.kv_buffer[:, idx[j * ps:(j + 1) * ps]] = held[wrong(keys, j, k, list(held))]
            return len(keys)
        return SimpleNamespace(name="fake", pool=pool, set=put, get=get, reset=held.clear)

    right = lambda keys, j, k, written: k  # noqa: E731
    for batch, iters in ((3, 2), (1, 4)):
        bench_peers.run_cell(backend(batch, right), 16, batch, iters, "t")
    cases = [(3, 2, lambda keys, j, k, written: keys[(j + 1) % 3]),  # another key of the batch
             (3, 4, lambda keys, j, k, written: bench_peers._keys("t/0", 3)[j]),  # the first batch's, same place
             (1, 4, lambda keys, j, k, written: written[-1]),  # the last object written
             (3, 4, lambda keys, j, k, written: written[(written.index(k) + 3) % len(written)])]  # the next batch's
    for batch, iters, wrong in cases:
        with pytest.raises(RuntimeError, match="differ from the pages written"):
            bench_peers.run_cell(backend(batch, wrong), 16, batch, iters, "t")


def test_ratios_are_kvtiers_over_its_peers_repeat_by_repeat():
    """aggregate's figures against cells made up here: a kvtier backend twice
    as fast as its peer in every repeat gives a GB/s ratio of 2 and a p50
    speed-up of 2, its range [2, 2], clear; one ahead in one repeat and
    behind in another has a range holding 1, not clear; rows keep each
    side's median and range."""
    from kvtier import bench_peers
    name, peer = next((k, ps[0]) for k, ps in bench_peers.LIKE.items() if ps)

    def cell(gbps, ms):
        return {op: {"gbps": gbps, "p50_ms": ms, "p99_ms": 2 * ms, "batches": 5}
                for op in ("batch_set_v1", "batch_get_v1")}

    def chain(us):
        return {w: {"p50_us": us, "p99_us": 2 * us} for w in ("all", "half", "none")}
    samples = {(name, 65536, 1): [cell(2.0, 1.0), cell(4.0, 0.5), cell(3.0, 0.8)],
               (peer, 65536, 1): [cell(1.0, 2.0), cell(2.0, 1.0), cell(1.5, 1.6)],
               (name, 65536, 16): [cell(1.0, 1.0), cell(3.0, 1.0), cell(2.0, 1.0)],
               (peer, 65536, 16): [cell(2.0, 1.0), cell(1.0, 1.0), cell(2.0, 1.0)]}
    rows, ex, ratios = bench_peers.aggregate(samples, {name: [chain(10.0)], peer: [chain(30.0)]})
    by = {(q["op"], q.get("batch"), q.get("chain")): q for q in ratios}
    q = by[("batch_set_v1", 1, None)]
    assert q["gbps_ratio"] == {"median": 2.0, "range": [2.0, 2.0], "clear": True}
    assert q["p50_speedup"]["median"] == 2.0 and q["p50_speedup"]["clear"]
    q = by[("batch_get_v1", 16, None)]
    assert q["gbps_ratio"]["median"] == 1.0 and q["gbps_ratio"]["range"] == [0.5, 3.0]
    assert not q["gbps_ratio"]["clear"]
    assert by[("batch_exists", None, "none")]["p50_speedup"]["median"] == 3.0
    row = next(r for r in rows if r["backend"] == name and r["batch"] == 1 and r["op"] == "batch_get_v1")
    assert row["gbps"] == {"median": 3.0, "range": [2.0, 4.0]} and row["p50_ms"]["median"] == 0.8
    assert ex[peer]["all"]["p50_us"]["median"] == 30.0
    assert not by[("batch_exists", None, "all")]["p50_speedup"]["clear"]  # one repeat says nothing
