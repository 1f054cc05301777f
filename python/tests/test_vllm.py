"""kvtier.vllm against vLLM 0.33.0's own code: its CPUOffloadingManager with
the LRU policy is the oracle. Both managers get the same calls, in the order
vLLM's OffloadingConnectorScheduler makes them (lookups of a request's block
chain, loads of the hits, stores of the new blocks with their end-token
positions, completions that succeed or fail, touches, finished requests,
resets), and every answer is compared: lookups, stores (the keys stored and
the keys evicted, or a refusal), and the events."""
import os
import random

import pytest

vllm_base = pytest.importorskip("vllm.v1.kv_offload.base")
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

import kvtier.vllm as kv  # noqa: E402
from kvtier.keyed import unpack_keys  # noqa: E402


def test_vllm_interface_is_the_one_kvtier_implements():
    """The drift check: empty with the pinned vLLM; it names the method when vLLM's change."""
    assert kv.check_vllm_interface() == []
    orig = kv._MANAGER_SIGNATURES["prepare_store"]
    kv._MANAGER_SIGNATURES["prepare_store"] = ["self", "keys", "req_context", "extra"]
    try:
        assert any("prepare_store" in d for d in kv.check_vllm_interface())
    finally:
        kv._MANAGER_SIGNATURES["prepare_store"] = orig


def test_c_keys_are_distinct_and_order_as_vllms_key_bytes():
    """The C key the manager gives each block key: distinct also for block hashes that share
    their first bytes (small integers: the manager tags them), the keys of one block ordered by
    group index, and keys of random block hashes ordered as their bytes are (vLLM's tie-break
    between equal ranks, which the C side's smaller-key rule then follows)."""
    rng = random.Random(5)
    for hashes in ([i.to_bytes(32, "big") for i in range(1500)], [rng.randbytes(32) for _ in range(1500)]):
        m = kv.KvtierOffloadingManager(5000)
        ctx = ReqContext(req_id="a")
        m.on_new_request(ctx)
        keys = [make_offload_key(h, g) for h in hashes for g in range(3)]
        assert m.prepare_store(keys, ctx).keys_to_store == keys
        cks = [unpack_keys(m._ids[k])[0] for k in keys]
        assert len(set(cks)) == len(keys)
        for i in range(0, len(keys), 3):
            assert cks[i] < cks[i + 1] < cks[i + 2]
        if hashes[0] != bytes(32):
            assert sorted(keys) == sorted(keys, key=lambda k: unpack_keys(m._ids[k])[0])
        m.check()


class _Pair:
    """One request seen by both managers: a context each, the same positions."""

    def __init__(self, rid, keys_positions):
        self.ctx = [ReqContext(req_id=rid), ReqContext(req_id=rid)]
        for c in self.ctx:
            for k, p in keys_positions:
                c.set_offload_key_position(k, p)


def _events(m):
    return [(tuple(e.keys), e.removed, e.metadata_only) for e in m.take_events()]


def _block_hashes(rng, hashes, groups):
    """One block's hash per group: random 32 bytes shared by the groups ("random"), one of
    each group's own ("per_group": keys of different hashes tie at a position, and vLLM
    orders them by their bytes), or small integers, all but the last bytes zero
    ("small": every key's plain C key is taken, the manager tags them)."""
    if hashes == "random":
        return (rng.randbytes(32),) * groups
    if hashes == "per_group":
        return tuple(rng.randbytes(32) for _ in range(groups))
    return (rng.randrange(1 << 20).to_bytes(32, "big"),) * groups


def _drive(seed, blocks, ops, groups=1, fail_rate=0.1, hashes="random", policy="lru", threshold=1, tracker=64_000,
           first_rank=0):
    rng = random.Random(seed)
    ref = CPUOffloadingManager(num_chunks=blocks, cache_policy=policy, enable_events=True, store_threshold=threshold,
                               max_tracker_size=tracker)
    ours = (kv.KvtierArcOffloadingManager if policy == "arc" else kv.KvtierOffloadingManager)(
        blocks, enable_events=True, store_threshold=threshold, max_tracker_size=tracker)
    if first_rank:  # what earlier requests used up (vLLM's ranks are Python ints; kvtier's fit 32 bits)
        ref._policy._next_rank = ours._next_rank = first_rank
    managers = (ref, ours)
    prompts = [[_block_hashes(rng, hashes, groups) for _ in range(rng.randrange(1, 12))] for _ in range(8)]
    live = []  # (pair, pending stores, pending loads)
    counts = {"hits": 0, "stores": 0, "refused": 0, "evicted": 0, "failed": 0, "resets": 0}
    for step in range(ops):
        r = rng.random()
        if r < 0.35 or not live:  # a new request: a prompt's prefix, maybe extended
            base = rng.choice(prompts)
            chain = base[:rng.randrange(1, len(base) + 1)] + [_block_hashes(rng, hashes, groups)
                                                              for _ in range(rng.randrange(0, 4))]
            if rng.random() < 0.2:
                prompts[rng.randrange(len(prompts))] = chain
            kp = [(make_offload_key(hs[g], g), (i + 1) * 16) for i, hs in enumerate(chain) for g in range(groups)]
            pair = _Pair(f"r{step}", kp)
            for m, c in zip(managers, pair.ctx):
                m.on_new_request(c)
            # the scheduler looks up the chain until the first miss, then loads the hits
            hits = []
            for k, _ in kp:
                res = [m.lookup(k, c) for m, c in zip(managers, pair.ctx)]
                assert res[0] == res[1], f"seed {seed} step {step}: lookup {res}"
                if res[0] != LookupResult.HIT:
                    break
                hits.append(k)
            loads = []
            if hits:
                for m, c in zip(managers, pair.ctx):
                    m.prepare_load(hits, c)
                loads = hits
                counts["hits"] += len(hits)
            new = [k for k, _ in kp[len(hits):]]
            live.append([pair, [], loads, new])
        elif r < 0.55:  # a store of some of a request's new blocks
            item = rng.choice(live)
            pair, pend, loads, new = item
            if not new:
                continue
            n = rng.randrange(1, len(new) + 1)
            batch, item[3] = new[:n], new[n:]
            outs = [m.prepare_store(batch, c) for m, c in zip(managers, pair.ctx)]
            if outs[0] is None or outs[1] is None:
                assert outs[0] is None and outs[1] is None, f"seed {seed} step {step}: refusal {outs}"
                counts["refused"] += 1
                continue
            assert outs[0].keys_to_store == outs[1].keys_to_store, f"seed {seed} step {step}: keys to store"
            assert outs[0].evicted_keys == outs[1].evicted_keys, f"seed {seed} step {step}: evicted"
            assert len(set(outs[1].store_spec.block_ids.tolist())) == len(outs[1].keys_to_store)
            counts["stores"] += len(outs[0].keys_to_store)
            counts["evicted"] += len(outs[0].evicted_keys)
            pend.append(outs[0].keys_to_store)
        elif r < 0.75:  # a transfer finishes: a store (maybe failed) or the loads
            item = rng.choice(live)
            pair, pend, loads, _ = item
            if pend:
                keys = pend.pop(0)
                ok = rng.random() >= fail_rate
                counts["failed"] += not ok
                for m, c in zip(managers, pair.ctx):
                    m.complete_store(keys, c, success=ok)
            elif loads:
                for m, c in zip(managers, pair.ctx):
                    m.complete_load(loads, c)
                item[2] = []
        elif r < 0.85:  # the scheduler touches a request's blocks
            pair = rng.choice(live)[0]
            keys = list(pair.ctx[0]._offload_key_positions)
            keys = keys[:rng.randrange(1, len(keys) + 1)]
            for m, c in zip(managers, pair.ctx):
                m.touch(keys, c)
        elif r < 0.997:  # a request ends, its transfers done
            item = live.pop(rng.randrange(len(live)))
            pair, pend, loads, _ = item
            for keys in pend:
                for m, c in zip(managers, pair.ctx):
                    m.complete_store(keys, c, success=True)
            if loads:
                for m, c in zip(managers, pair.ctx):
                    m.complete_load(loads, c)
            for m, c in zip(managers, pair.ctx):
                m.on_request_finished(c)
        else:  # a reset, between requests
            for item in live:
                for m, c in zip(managers, item[0].ctx):
                    m.on_request_finished(c)
            live.clear()
            for m in managers:
                m.reset_cache()
            counts["resets"] += 1
        ev = [_events(m) for m in managers]
        assert ev[0] == ev[1], f"seed {seed} step {step}: events\n{ev[0]}\n{ev[1]}"
        if step % 13 == 0:  # vLLM's metrics, as its scheduler asks for them every step
            got = [m.get_stats().data for m in managers]
            assert got[0] == got[1], f"seed {seed} step {step}: get_stats\n{got[0]}\n{got[1]}"
        if step % 97 == 0:
            ours.check()
    ours.check()
    got = [m.get_stats().data for m in managers]  # (the skips since the last call among them)
    assert got[0] == got[1], f"seed {seed}: get_stats at the end\n{got[0]}\n{got[1]}"
    counts["skipped"] = ours.stats()["stores_skipped"]
    return counts


@pytest.mark.parametrize("blocks,groups,hashes", [(1, 1, "random"), (7, 1, "random"), (40, 1, "random"),
                                                  (24, 3, "random"), (200, 2, "random"), (24, 3, "per_group"),
                                                  (40, 1, "small"), (24, 3, "small")])
def test_decisions_match_vllms_lru_manager(blocks, groups, hashes):
    seed = int(os.environ.get("KVTIER_TEST_SEED", "0")) or (blocks * 31 + groups)
    total = {}
    for s in range(seed, seed + 3):
        c = _drive(s, blocks, 1500, groups, hashes=hashes)
        total = {k: total.get(k, 0) + v for k, v in c.items()}
    print(f"vllm lru equivalence: blocks={blocks} groups={groups} hashes={hashes} seeds={seed}..{seed + 2} {total}")
    # the sequences reach every path the comparison means to cover
    assert total["hits"] and total["stores"] and total["failed"]
    if blocks <= 40:
        assert total["evicted"] and total["refused"]


def test_ranks_used_up_are_numbered_again_and_decide_the_same():
    """A request's use takes a rank a key, and vLLM's ranks never end: past
    2**32 kvtier's scores would not fit (OverflowError from every call after,
    for good). The ranks in use are numbered again, in order, and every
    decision still matches vLLM's LRU; the counter ends far below."""
    for seed in (1, 2):
        c = _drive(seed, 24, 1500, 3, first_rank=2 ** 32 - 40)
        assert c["hits"] and c["evicted"], c
    m = kv.KvtierOffloadingManager(8)
    m._next_rank = 2 ** 32 - 3
    ctx = ReqContext(req_id="a")
    keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(4)]
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    m.on_new_request(ctx)
    m.complete_store(m.prepare_store(keys, ctx).keys_to_store, ctx)
    m.on_request_finished(ctx)
    assert m._next_rank < 16
    m.check()


@pytest.mark.parametrize("blocks,groups,hashes", [(1, 1, "random"), (7, 1, "random"), (40, 1, "random"),
                                                  (24, 3, "random"), (200, 2, "random"), (24, 3, "per_group"),
                                                  (40, 1, "small")])
def test_decisions_match_vllms_arc_manager(blocks, groups, hashes):
    """The same calls to vLLM's CPUOffloadingManager(cache_policy="arc") and to
    KvtierArcOffloadingManager: every lookup, key stored, key evicted (in
    order), refusal and event equal."""
    seed = int(os.environ.get("KVTIER_TEST_SEED", "0")) or (blocks * 37 + groups)
    total = {}
    for s in range(seed, seed + 3):
        c = _drive(s, blocks, 1500, groups, hashes=hashes, policy="arc")
        total = {k: total.get(k, 0) + v for k, v in c.items()}
    print(f"vllm arc equivalence: blocks={blocks} groups={groups} hashes={hashes} seeds={seed}..{seed + 2} {total}")
    assert total["hits"] and total["stores"] and total["failed"]
    if blocks <= 40:
        assert total["evicted"] and total["refused"]


@pytest.mark.parametrize("policy,blocks,threshold,tracker", [("lru", 7, 2, 64_000), ("lru", 40, 3, 64_000),
                                                                ("lru", 24, 2, 5), ("arc", 7, 2, 64_000),
                                                                ("arc", 24, 2, 5), ("arc", 40, 3, 16)])
def test_decisions_match_vllm_with_a_store_threshold(policy, blocks, threshold, tracker):
    """vLLM's store_threshold: a block stored only once offered that many
    times, offers counted in an LRU table (a small table drops counts): the
    same calls to vLLM's manager and kvtier's, every answer equal, and the
    threshold skips stores."""
    seed = int(os.environ.get("KVTIER_TEST_SEED", "0")) or (blocks * 41 + threshold + tracker)
    total = {}
    for s in range(seed, seed + 3):
        c = _drive(s, blocks, 1500, 1, policy=policy, threshold=threshold, tracker=tracker)
        total = {k: total.get(k, 0) + v for k, v in c.items()}
    print(f"vllm {policy} store_threshold={threshold} tracker={tracker}: blocks={blocks} {total}")
    assert total["hits"] and total["stores"] and total["skipped"]


def test_a_refused_store_changes_nothing():
    m = kv.KvtierOffloadingManager(2, enable_events=True)
    ctx = ReqContext(req_id="a")
    ka, kb, kc = (make_offload_key(bytes([i]) * 32, 0) for i in range(3))
    for i, k in enumerate((ka, kb, kc)):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    m.on_new_request(ctx)
    out = m.prepare_store([ka, kb], ctx)
    assert out.keys_to_store == [ka, kb] and out.evicted_keys == []
    before = (m.stats(), dict(m._scores), m._next_rank)
    assert m.prepare_store([kc], ctx) is None  # both blocks are in flight: nothing to evict
    assert (m.stats(), dict(m._scores), m._next_rank) == (before[0] | {"store_refusals": 1}, before[1], before[2])
    m.complete_store([ka, kb], ctx)
    assert [e.keys for e in m.take_events()] == [[ka, kb]]
    m.check()


def test_bad_calls_raise_and_change_nothing():
    """A load of a block that is not offloaded, a completion of a load never made, and a position
    that does not fit a score: each an exception, the manager as it was (check() agrees)."""
    import kvtier
    m = kv.KvtierOffloadingManager(4, enable_events=True)
    ctx = ReqContext(req_id="a")
    ka, kb, kc = (make_offload_key(bytes([i]) * 32, 0) for i in range(3))
    ctx.set_offload_key_position(ka, 16)
    ctx.set_offload_key_position(kc, 2 ** 31)
    m.on_new_request(ctx)
    m.complete_store(m.prepare_store([ka], ctx).keys_to_store, ctx)
    state = lambda: (m.stats(), dict(m._scores), dict(m._look), m._next_rank)  # noqa: E731
    before = state()
    with pytest.raises(kvtier.NotFound, match="prepare_load"):
        m.prepare_load([ka, kb], ctx)
    with pytest.raises(kvtier.InvalidArgument, match="complete_load"):
        m.complete_load([kb], ctx)
    with pytest.raises(kvtier.InvalidArgument):  # present, but not loading
        m.complete_load([ka], ctx)
    with pytest.raises(OverflowError, match="position"):
        m.prepare_store([kc], ctx)
    assert state() == before
    m.check()
    other = ReqContext(req_id="z")
    kd = make_offload_key(bytes([9]) * 32, 0)
    m.on_new_request(other)
    m.complete_store(m.prepare_store([kd], other).keys_to_store, other)
    m.on_request_finished(ctx)  # a load of a key it never saw, after it finished: refused before any pin
    with pytest.raises(RuntimeError, match="has finished"):
        m.prepare_load([kd], ctx)
    assert m.stats()["pinned"] == 0
    m.check()
    arc = kv.KvtierArcOffloadingManager(2)  # ARC's pin table learnt nothing of a pin a bad context left
    arc.complete_store(arc.prepare_store([ka, kb], ctx).keys_to_store, ctx)
    with pytest.raises(AttributeError):
        arc.prepare_load([ka], None)
    assert arc.stats()["pinned"] == 0
    assert arc.prepare_store([kc], ReqContext(req_id="b")).evicted_keys  # an eviction: ka may go
    arc.check()


@pytest.mark.parametrize("threshold", [1, 2])
def test_a_position_that_does_not_fit_changes_nothing(threshold):
    """A load or store naming a key at a position past 2**31-1 raises before
    anything changes: no pin left behind (the block stays evictable), no rank
    spent, no store counted for get_stats, no offer counted."""
    import kvtier
    m = kv.KvtierOffloadingManager(2, store_threshold=threshold)
    k, new = make_offload_key(b"\x01" * 32, 0), make_offload_key(b"\x02" * 32, 0)
    a = ReqContext(req_id="a")
    a.set_offload_key_position(k, 16)
    m.on_new_request(a)
    for _ in range(threshold):
        out = m.prepare_store([k], a)
    m.complete_store(out.keys_to_store, a)
    m.on_request_finished(a)
    m.get_stats()
    b = ReqContext(req_id="b")
    m.on_new_request(b)
    b.set_offload_key_position(k, 2 ** 31)
    b.set_offload_key_position(new, 32)
    state = lambda: (m.stats(), dict(m._scores), m._next_rank, list(m._alloc_sizes),  # noqa: E731
                     dict(m._offers or {}), b.get_state(kv._Access).seen if b.get_state(kv._Access) else None)
    before = state()
    with pytest.raises(OverflowError, match="position 2147483648"):
        m.prepare_load([k], b)
    with pytest.raises(OverflowError, match="position 2147483648"):
        m.prepare_store([k, new], b)
    assert state() == before and m.stats()["pinned"] == 0
    m.check()
    c = ReqContext(req_id="c")
    m.on_new_request(c)
    more = [make_offload_key(bytes([i]) * 32, 0) for i in (3, 4)]
    for _ in range(threshold):
        out = m.prepare_store(more, c)
    assert out is not None and out.evicted_keys == [k], "the block was left evictable"
    with pytest.raises(kvtier.InvalidArgument):
        m.complete_load([k], b)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_every_call_after_shutdown_is_refused(policy):
    import kvtier
    cls = kv.KvtierOffloadingManager if policy == "lru" else kv.KvtierArcOffloadingManager
    m = cls(4)
    k = make_offload_key(b"\x01" * 32, 0)
    c = ReqContext(req_id="a")
    c.set_offload_key_position(k, 16)
    m.on_new_request(c)
    m.complete_store(m.prepare_store([k], c).keys_to_store, c)
    m.shutdown()
    calls = [("lookup", (k, c)), ("prepare_load", ([k], c)), ("touch", ([k], c)), ("complete_load", ([k], c)),
             ("prepare_store", ([k], c)), ("complete_store", ([k], c)), ("on_new_request", (c,)),
             ("on_request_finished", (c,)), ("reset_cache", ()), ("forget", ([k],)), ("get_stats", ()),
             ("stats", ()), ("check", ())]
    for name, args in calls:
        with pytest.raises(kvtier.ClosedError, match=f"{cls.__name__}.{name}: the manager is closed"):
            getattr(m, name)(*args)
    m.shutdown()  # twice: nothing more to do


def test_the_side_by_side_benchmark_runs_and_agrees():
    """A smoke run of `python -m kvtier.bench_vllm`: JSON, both managers timed, the same decisions."""
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "kvtier.bench_vllm", "--requests", "60", "--blocks", "300",
                        "--repeat", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["same_decisions"] and out["requests"] == 60 and out["ratio_kvtier_over_vllm"] > 0
    hits, stores, evictions = out["hits_stores_evictions"]["kvtier"]
    assert stores > 0 and evictions > 0
    import contextlib
    import io
    from kvtier import bench_vllm
    buf = io.StringIO()  # (in this process: a second interpreter would import vLLM again, ~10 s)
    with contextlib.redirect_stdout(buf):
        assert bench_vllm.main(["--requests", "60", "--blocks", "300", "--repeat", "1", "--policy", "arc"]) == 0
    out = json.loads(buf.getvalue())
    assert out["same_decisions"] and out["policy"] == "arc" and out["hits_stores_evictions"]["kvtier"][2] > 0


def _offloading_config(extra, blocks_per_chunk=1, worker_bytes=96 * 2 + 160):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1", "l2"), group_id=0),),
        worker_kv_bytes_per_block=worker_bytes, enable_kv_cache_events=True, extra_config=extra, engine_id="e0",
        model=OffloadingModelConfig(name="tiny", dtype="int8"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True))


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_vllm_loads_the_spec_by_name_and_blocks_go_down_and_come_back(policy):
    """vLLM's own factory loads KvtierOffloadingSpec from kv_connector_extra_config; its manager
    (of the policy asked for) and worker then store blocks of vLLM-shaped KV tensors and load them
    back into other blocks."""
    import numpy as np
    import torch
    from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,
                                         GPULoadStoreSpec)
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    page = 96 * 2 + 160
    spec = OffloadingSpecFactory.create_spec(_offloading_config(
        {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm", "host_bytes": 10 * page,
         "policy": policy}))
    assert isinstance(spec, kv.KvtierOffloadingSpec) and spec.num_chunks == 10
    nb = 16
    tensors = [torch.randint(-128, 128, (nb, p), dtype=torch.int8) for p in (96, 96, 160)]
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, t.shape[1]) for t in tensors],
                               [[CanonicalKVCacheRef(i, t.shape[1]) for i, t in enumerate(tensors)]])
    m, w = spec.get_manager(), spec.get_worker(caches)
    assert isinstance(m, kv.KvtierArcOffloadingManager) == (policy == "arc")
    ctx = ReqContext(req_id="r")
    keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(4)]
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    assert out.keys_to_store == keys
    w.submit_store(1, GPULoadStoreSpec([0, 1, 2, 3], [4], [0]), out.store_spec)
    w.wait({1})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(1, True)]
    m.complete_store(keys, ctx)
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 4
    before = [t[:4].clone() for t in tensors]
    load = m.prepare_load(keys[1:3], ctx)
    w.submit_load(2, load, GPULoadStoreSpec([9, 10], [2], [1]))
    w.wait({2})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(2, True)]
    m.complete_load(keys[1:3], ctx)
    for t, b in zip(tensors, before):
        assert np.array_equal(t[9:11].numpy(), b[1:3].numpy())
    m.check()
    w.shutdown()
    m.shutdown()


@pytest.mark.parametrize("extra,msg", [({}, "host_bytes"), ({"host_bytes": "x"}, "host_bytes"),
                                       ({"host_bytes": 4096, "policy": "lfu"}, "policy"),
                                       ({"host_bytes": 4096, "policy": "arc", "l2_free_room": 0.1}, "l2_free_room"),
                                       ({"host_bytes": 4096, "policy": "arc", "l3": "dir:/tmp/x"}, "l3"),
                                       ({"host_bytes": 4096, "l3": 5}, "l3"),
                                       ({"host_bytes": 4096, "l3": "dir:/tmp/x", "l3_write_policy": "write_back"},
                                        "l3_write_policy"),
                                       ({"host_bytes": 4096, "l3_threads": 0}, "l3_threads"),
                                       ({"host_bytes": 4096, "l2_free_room": 1.5}, "l2_free_room"),
                                       ({"host_bytes": 4096, "checksum": "maybe"}, "checksum"),
                                       ({"host_bytes": 4096, "store_threshold": "x"}, "store_threshold"),
                                       ({"host_bytes": 4096, "store_threshold": -1}, "store_threshold"),
                                       ({"host_bytes": 4096, "max_tracker_size": 0}, "max_tracker_size"),
                                       ({"host_bytes": 4096, "max_tracker_size": "many"}, "max_tracker_size"),
                                       ({"host_bytes": 4096, "policy": "arc", "eviction_policy": "lru"},
                                        "eviction_policy"),
                                       ({"host_bytes": 4096, "eviction_policy": "lfu"}, "eviction_policy: 'lfu'"),
                                       ({"host_bytes": 4096.9}, "host_bytes: expected a whole number, not 4096.9"),
                                       ({"host_bytes": float("inf")}, "host_bytes: expected a whole number"),
                                       ({"cpu_bytes_to_use": None}, "cpu_bytes_to_use: expected a whole number"),
                                       ({"host_bytes": 0}, r"host_bytes: 0 \(expected >= 1\)"),
                                       ({"host_bytes": 1e30}, r"host_bytes: \d+ chunks of \d+ bytes: at most"),
                                       ({"host_bytes": True}, "host_bytes: expected a whole number, not True"),
                                       ({"host_bytes": 4096, "threads": 1.7}, "threads: expected a whole number"),
                                       ({"host_bytes": 4096, "threads": None}, "threads: expected a whole number"),
                                       ({"host_bytes": 4096, "threads": 65}, r"threads: 65 \(expected 1..64\)"),
                                       ({"host_bytes": 4096, "l3_threads": "x"}, "l3_threads: expected a whole"),
                                       ({"host_bytes": 4096, "l3_threads": 2.9}, "l3_threads: expected a whole"),
                                       ({"host_bytes": 4096, "store_threshold": 1.5}, "store_threshold: expected"),
                                       ({"host_bytes": 4096, "max_tracker_size": 2.5}, "max_tracker_size: expected"),
                                       ({"host_bytes": 4096, "l2_free_room": "abc"}, "l2_free_room: 'abc'"),
                                       ({"host_bytes": 4096, "l2_free_room": None}, "l2_free_room: None"),
                                       ({"host_bytes": 4096, "checksum": None}, "checksum: None"),
                                       ({"host_bytes": 4096, "checksum": 2}, "checksum: 2"),
                                       ({"host_bytes": 4096, "checksum": [0]}, r"checksum: \[0\]"),
                                       ({"host_bytes": 4096, "l3_ns": None}, "l3_ns: expected a namespace"),
                                       ({"host_bytes": 4096, "thread": 8}, "unknown option 'thread': did you mean 'threads'"),
                                       ({"hostbytes": 1, "host_bytes": 4096}, "did you mean 'host_bytes'"),
                                       ({"host_bytes": 4096, "l3_thread": 8}, "did you mean 'l3_threads'"),
                                       ({"num_chunks": 8, "host_bytes": 4096}, "num_chunks and host_bytes: give one"),
                                       ({"num_chunks": 0}, r"num_chunks: 0 \(expected >= 1\)"),
                                       ({"num_chunks": 1e30}, r"num_chunks: \d+ chunks of \d+ bytes: at most"),
                                       ({"num_chunk": 8, "host_bytes": 4096}, "did you mean 'num_chunks'")])
def test_the_spec_refuses_bad_options_naming_them(extra, msg):
    with pytest.raises(ValueError, match=msg):
        kv.KvtierOffloadingSpec(_offloading_config(extra))


def test_num_chunks_gives_every_pipeline_stage_the_schedulers_count():
    """Pipeline stages that hold different KV per block (an uneven layer
    split): host_bytes gives each process its own number of chunks, and the
    scheduler hands out stage 0's, past the end of a larger stage's tier.
    num_chunks is the same count everywhere; each stage's chunks are its own
    blocks'."""
    stage = [_offloading_config({"host_bytes": 48 * 352}, worker_bytes=b) for b in (352, 704)]
    assert [kv.KvtierOffloadingSpec(c).num_chunks for c in stage] == [48, 24]
    stage = [_offloading_config({"num_chunks": "48"}, worker_bytes=b) for b in (352, 704)]
    assert [kv.KvtierOffloadingSpec(c).num_chunks for c in stage] == [48, 48]


def test_whole_numbers_may_be_written_as_json_writes_them():
    spec = kv.KvtierOffloadingSpec(_offloading_config({"host_bytes": "8192", "threads": 2.0, "l3_threads": "3",
                                                       "checksum": "false", "l2_free_room": "0.25"}))
    assert (spec.threads, spec.l3_threads, spec.checksum, spec.free_room) == (2, 3, False, 0.25)
    assert spec.num_chunks == kv.KvtierOffloadingSpec(_offloading_config({"host_bytes": 8192.0})).num_chunks > 0


def test_vllms_own_name_for_the_policy_is_read():
    """vLLM's CPU spec takes the order as "eviction_policy": kvtier's spec reads it too."""
    spec = kv.KvtierOffloadingSpec(_offloading_config({"host_bytes": 4096, "eviction_policy": "arc"}))
    assert spec.policy == "arc"
    spec = kv.KvtierOffloadingSpec(_offloading_config({"host_bytes": 4096, "eviction_policy": "arc", "policy": "arc"}))
    assert spec.policy == "arc"


_L3_PAGE = 96 * 2 + 160
_L3_KEYS = [make_offload_key(bytes([i]) * 32, 0) for i in range(1, 4)]


def _l3_instance(url):
    """A manager and a worker of kvtier's spec, 8 host pages over the L3 at url."""
    import torch
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    spec = OffloadingSpecFactory.create_spec(_offloading_config(
        {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm", "host_bytes": 8 * _L3_PAGE,
         "l3": url}))
    ts = [torch.randint(-128, 128, (16, p), dtype=torch.int8) for p in (96, 96, 160)]
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, t.shape[1]) for t in ts],
                               [[CanonicalKVCacheRef(i, t.shape[1]) for i, t in enumerate(ts)]])
    return spec.get_manager(), spec.get_worker(caches)


def _l3_ctx(rid):
    c = ReqContext(req_id=rid)
    for i, k in enumerate(_L3_KEYS):
        c.set_offload_key_position(k, 16 * (i + 1))
    return c


def _l3_settle(m, c):
    """The lookups of _L3_KEYS until the store's exists answers are in."""
    import time
    from vllm.v1.kv_offload.base import ScheduleEndContext
    for _ in range(500):
        got = [m.lookup(k, c) for k in _L3_KEYS]
        if LookupResult.RETRY not in got:
            return got
        m.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.01)
    raise AssertionError("the store never answered")


def _l3_written(url):
    """_L3_KEYS written through to the L3 at url by an instance that then goes."""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    ma, wa = _l3_instance(url)
    a = _l3_ctx("a")
    ma.on_new_request(a)
    out = ma.prepare_store(_L3_KEYS, a)
    wa.submit_store(1, GPULoadStoreSpec([0, 1, 2], [3], [0]), out.store_spec)
    wa.wait({1})
    assert [r.success for r in wa.get_finished()] == [True]
    ma.complete_store(_L3_KEYS, a)
    ma.on_request_finished(a)
    wa.shutdown()
    ma.shutdown()


def _l3_reserved(url):
    """_L3_KEYS in the L3 at url, and a new instance (manager, worker) whose
    request "x" found them there: a host page reserved for each."""
    _l3_written(url)
    m, w = _l3_instance(url)
    x = _l3_ctx("x")
    m.on_new_request(x)
    try:
        assert _l3_settle(m, x) == [LookupResult.HIT] * 3
    except BaseException:
        w.shutdown()
        m.shutdown()
        raise
    return m, w, x


def test_an_l3_page_reserved_and_not_loaded_goes_back_at_the_load(dir_store_url):
    """A key found in L3 reserves a host page that the asking request's load
    fills; vLLM looks up more than it loads (a popped chunk, a window's scan,
    a step's budget). The pages reserved and not loaded go back with the
    load: another request finds such a key (RETRY, then HIT for itself)
    rather than HIT_PENDING until the first request finishes."""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    keys = _L3_KEYS
    mb, wb, x = _l3_reserved(dir_store_url)
    try:
        wb.submit_load(2, mb.prepare_load(keys[:2], x), GPULoadStoreSpec([5, 6], [2], [0]))
        wb.wait({2})
        assert [r.success for r in wb.get_finished()] == [True]
        mb.complete_load(keys[:2], x)
        y = _l3_ctx("y")
        mb.on_new_request(y)
        assert mb.lookup(keys[2], y) != LookupResult.HIT_PENDING  # x let its third page go with its load
        assert _l3_settle(mb, y) == [LookupResult.HIT] * 3
        mb.check()
    finally:
        wb.shutdown()
        mb.shutdown()


@pytest.mark.parametrize("success", [True, False])
def test_a_completion_naming_keys_reserved_for_an_l3_load_changes_nothing(dir_store_url, success):
    """A store completion (stray, repeated, or from before a reset) naming
    keys whose host pages are only reserved for an L3 load, or being
    fetched, is no store's: it changes nothing. (Taken, a success made the
    unfetched pages hits for every request; a failure freed a page the
    worker was fetching into, and the next store was handed it.)"""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    keys = _L3_KEYS
    m, w, x = _l3_reserved(dir_store_url)
    try:
        stray = _l3_ctx("stray")
        m.on_new_request(stray)
        m.complete_store(keys, stray, success=success)
        m.check()
        other = _l3_ctx("other")
        m.on_new_request(other)
        assert [m.lookup(k, other) for k in keys] == [LookupResult.HIT_PENDING] * 3  # still x's, not hits
        load = m.prepare_load(keys, x)  # the fetch in flight
        m.complete_store(keys, stray, success=success)
        m.check()
        w.submit_load(2, load, GPULoadStoreSpec([5, 6, 7], [3], [0]))
        w.wait({2})
        assert [r.success for r in w.get_finished()] == [True]
        m.complete_load(keys, x)
        m.check()
        assert [m.lookup(k, other) for k in keys] == [LookupResult.HIT] * 3
    finally:
        w.shutdown()
        m.shutdown()


def _out_of_memory(*args, **kwargs):
    from kvtier._core import error
    from kvtier import _fields
    raise error(dict(_fields.ERRORS)["ENOMEM"], "simulated", "the keyed cache ran out of memory")


def test_the_arc_manager_takes_neither_free_room_nor_an_l3_store():
    """ARC evicts on demand only and ranks nothing for an L3's reservations:
    both are refused at construction, not taken and ignored."""
    for kw in ({"free_room": 0.5}, {"l3": object()}):
        with pytest.raises(TypeError):
            kv.KvtierArcOffloadingManager(4, **kw)


def test_an_arc_store_the_keyed_cache_refuses_for_memory_changes_nothing(monkeypatch):
    """The keyed cache's prepare_store can fail for memory: its victims stay
    where they were (in the cache, in T1/T2, out of the ghosts), the new keys'
    C keys are given back, and the same store then succeeds."""
    import kvtier
    m = kv.KvtierArcOffloadingManager(2)
    keys = [make_offload_key(bytes([65 + i]) * 32, 0) for i in range(4)]
    a = ReqContext(req_id="a")
    m.on_new_request(a)
    m.complete_store(m.prepare_store(keys[:2], a).keys_to_store, a)
    m.on_request_finished(a)
    b = ReqContext(req_id="b")
    m.on_new_request(b)
    real = m._cache.prepare_store_packed
    monkeypatch.setattr(m._cache, "prepare_store_packed", _out_of_memory)
    with pytest.raises(kvtier.OutOfMemory):
        m.prepare_store(keys[2:], b)
    m.check()
    assert [m.lookup(k, b) for k in keys] == [LookupResult.HIT] * 2 + [LookupResult.MISS] * 2
    monkeypatch.setattr(m._cache, "prepare_store_packed", real)
    out = m.prepare_store(keys[2:], b)
    assert out.evicted_keys == keys[1::-1] and out.keys_to_store == keys[2:]  # (the request ended: its head most recent)
    m.check()


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_reset_that_runs_out_of_memory_leaves_the_cache_as_it_was(monkeypatch, policy):
    import kvtier
    m = (kv.KvtierOffloadingManager if policy == "lru" else kv.KvtierArcOffloadingManager)(4)
    keys = [make_offload_key(bytes([70 + i]) * 32, 0) for i in range(2)]
    a = ReqContext(req_id="a")
    m.on_new_request(a)
    m.complete_store(m.prepare_store(keys, a).keys_to_store, a)
    monkeypatch.setattr(kv, "KeyedCache", _out_of_memory)
    with pytest.raises(kvtier.OutOfMemory):
        m.reset_cache()
    m.check()
    assert [m.lookup(k, a) for k in keys] == [LookupResult.HIT] * 2
    m.prepare_load(keys, a)  # the old cache is open, its pages there
    m.complete_load(keys, a)
