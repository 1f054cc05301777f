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
    for another key (of the same batch, or of another batch at the same
    place) is caught, not timed as a fast get."""
    from types import SimpleNamespace

    import torch

    from kvtier import bench_peers
    ps, batch = 4, 3
    pool = SimpleNamespace(page_size=ps, kv_buffer=torch.randint(0, 256, (2, 2 * batch * ps, 1, 2), dtype=torch.uint8))

    def backend(wrong):
        held = {}

        def put(keys, idx):
            for j, k in enumerate(keys):
                held[k] = pool.kv_buffer[:, idx[j * ps:(j + 1) * ps]].clone()
            return True

        def get(keys, idx):
            for j, k in enumerate(keys):
                pool.kv_buffer[:, idx[j * ps:(j + 1) * ps]] = held[wrong(keys, j, k)]
            return len(keys)
        return SimpleNamespace(name="fake", pool=pool, set=put, get=get, reset=held.clear)

    first = bench_peers._keys("t/0", batch)
    right = backend(lambda keys, j, k: k)
    bench_peers.run_cell(right, 16, batch, 2, "t")
    for wrong in (lambda keys, j, k: keys[(j + 1) % batch],  # another key of the batch
                  lambda keys, j, k: first[j]):  # the first batch's key at that place
        with pytest.raises(RuntimeError, match="differ from the pages written"):
            bench_peers.run_cell(backend(wrong), 16, batch, 2, "t")
