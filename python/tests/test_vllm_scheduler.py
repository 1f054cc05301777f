"""vLLM's own engine core drives kvtier's offloading spec.

Each scenario runs vLLM 0.33.0's ``Scheduler`` (its KV cache manager, GPU
prefix cache and preemption) with its stock ``OffloadingConnector`` on both
sides, as vLLM's connector unit tests build them, without a GPU: the
scheduler side runs kvtier's ``KvtierOffloadingManager``, the worker side
kvtier's ``KvtierOffloadingWorker`` over real KV tensors (host memory standing
in for the GPU's). A model stand-in writes, for every token it computes, KV
bytes that are a function of the token prefix, and checks before each step
that every token the scheduler counts as computed, whether vLLM's GPU prefix
cache or a load from kvtier's host tier supplied it, holds exactly those bytes.

The same scenario runs a second time with vLLM's own ``CPUOffloadingManager``
(lru, the same capacity) in the scheduler, and the two runs must agree step by
step: which requests ran with how many tokens already computed, every load
and store job (request and GPU blocks). So kvtier makes vLLM's decisions
exactly, through vLLM's own scheduler.

A failed transfer: vLLM 0.33.0's connector worker asserts that every
transfer succeeded (``offloading/worker.py``, ``get_finished``), so under its
stock connector a failed load or store stops it; under kvtier's connector a
refused load is recomputed and a failed store forgotten (the manager's
handling of a failed store is compared with vLLM's in test_vllm.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from kvtier.vllm_selftest import (BLOCK, HEAD, HEADS, LAYERS, SHARED, Engine, both, full_tier, prefix_sharing, tokens,
                                  write_model_config)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model_config(str(tmp_path_factory.mktemp("tiny-llama")))


def test_prefix_sharing_loads_from_the_host_tier(model_dir):
    """A finished request's blocks leave the GPU under other requests; a later
    request sharing its prefix loads that prefix from kvtier's host tier."""
    kv, _ = both(model_dir, prefix_sharing, gpu_blocks=24, host_blocks=64)
    news = {x[1]: x[2] for x in kv.log if x[0] == "new"}
    assert news["b"] >= 160 and kv.loads >= 1, kv.log
    assert kv.stats["loads"] >= 1


def test_a_hybrid_model_with_a_sliding_window_group(model_dir):
    """Two KV cache groups, full attention and a 32-token sliding window: vLLM
    keys the blocks of each group apart (the group index in the key), loads
    only the window's blocks of the window group, and kvtier's manager and
    worker make vLLM's decisions and move the right bytes for both."""
    def scenario(e: Engine) -> None:
        prompt = SHARED + tokens(2, 32)  # a's prompt ends on a chunk boundary: its window's chunks are stored
        e.add("a", prompt, 4)
        e.run()
        for i in range(4):
            e.add(f"x{i}", tokens(10 + i, 200), 4)
            e.run()
        e.add("b", prompt + tokens(3, 50), 4)
        e.run()

    kv, _ = both(model_dir, scenario, gpu_blocks=30, host_blocks=96, window=32)
    loads = [x for x in kv.log if x[0] == "load"]
    assert loads and all(len(x[3]) == 2 for x in loads), kv.log
    assert any(x[3][1] < x[3][0] for x in loads), "the window group loads fewer blocks than the full one"
    news = {x[1]: x[2] for x in kv.log if x[0] == "new"}
    assert news["b"] >= len(SHARED), kv.log


def test_preemption(model_dir):
    """Long decodes on a small GPU: vLLM preempts, flushes the stores in
    flight, and the preempted requests come back with what was offloaded."""
    def scenario(e: Engine):
        for i in range(3):
            e.add(f"p{i}", tokens(20 + i, 120), 90)
        e.run()

    kv, _ = both(model_dir, scenario, gpu_blocks=26, host_blocks=64)
    assert kv.preempted >= 1, kv.log


def test_abort_during_a_load(model_dir):
    """A request is aborted while its load from the host tier is in flight:
    its blocks stay pinned until the load ends, and the host tier stays whole."""
    shared = tokens(4, 128)

    def scenario(e: Engine):
        e.add("a", shared + tokens(5, 20), 2)
        e.run()
        for i in range(3):
            e.add(f"x{i}", tokens(30 + i, 200), 2)
            e.run()
        e.held = set(range(10 ** 6))          # keep every load's completion back
        e.add("b", shared + tokens(6, 30), 4)
        e.step()
        assert any(x[0] == "load" and x[1] == "b" for x in e.log), e.log
        e.abort("b")
        e.step()
        e.held = set()
        e.run()
        e.add("c", shared + tokens(7, 30), 2)   # what b was loading is still there
        e.run()

    kv, _ = both(model_dir, scenario, gpu_blocks=24, host_blocks=64)
    news = {x[1]: x[2] for x in kv.log if x[0] == "new"}
    assert news["c"] >= 128, kv.log
    st = kv.stats
    assert st["pinned"] == 0 and st["pending"] == 0, st


def test_a_full_host_tier_evicts_as_vllm_does(model_dir):
    kv, _ = both(model_dir, full_tier, gpu_blocks=10, host_blocks=30)
    assert kv.stats["evictions"] > 0 and kv.loads >= 5, (kv.stats, kv.log)


def test_under_arc_a_full_host_tier_evicts_as_vllms_arc_does(model_dir):
    """The spec's "policy": "arc": kvtier's ARC manager and vLLM's ARC manager,
    each in vLLM's scheduler, agree step by step (prefix sharing and a full tier),
    and on the full tier ARC decides otherwise than LRU (the scenario tells them apart)."""
    kv, _ = both(model_dir, full_tier, gpu_blocks=10, host_blocks=30, extra={"policy": "arc"})
    assert kv.stats["evictions"] > 0 and kv.loads >= 5, (kv.stats, kv.log)
    lru, _ = both(model_dir, full_tier, gpu_blocks=10, host_blocks=30)
    assert kv.log != lru.log
    kv, _ = both(model_dir, prefix_sharing, gpu_blocks=24, host_blocks=64, extra={"policy": "arc"})
    assert kv.loads >= 1, kv.log


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_store_threshold_stores_a_block_only_when_offered_again(model_dir, policy):
    """vLLM's store_threshold 2 on both sides: the first offer of a block is
    skipped, the next stores it; kvtier's run and vLLM's agree step by step."""
    kv, _ = both(model_dir, full_tier, gpu_blocks=10, host_blocks=30,
                 extra={"policy": policy, "store_threshold": 2})
    assert kv.stats["stores_skipped"] > 0 and kv.stats["stores_prepared"] > 0, kv.stats


def test_the_full_tier_scenario_tells_eviction_orders_apart(model_dir, monkeypatch):
    """The scenario above can fail: vLLM's own LRU with either half of its
    order changed (older requests first, or a request's head before its tail)
    makes other decisions than vLLM's LRU, which kvtier reproduces."""
    from vllm.v1.kv_offload.cpu.policies import lru

    def run():
        e = Engine(model_dir, "VllmManagerSpec", gpu_blocks=10, host_blocks=30)
        try:
            full_tier(e)
        finally:
            e.close()
        return e.log

    ref = run()
    rank = lru.LRUCachePolicy._get_request_rank
    with monkeypatch.context() as m:
        m.setattr(lru.LRUCachePolicy, "_get_request_rank", lambda self, ctx: -rank(self, ctx))
        assert run() != ref
    order = lru.order_request_keys
    with monkeypatch.context() as m:
        m.setattr(lru, "order_request_keys", lambda groups, ctx: list(reversed(order(groups, ctx))))
        assert run() != ref


def test_a_load_of_the_wrong_page_is_caught(model_dir, monkeypatch):
    """The stand-in model's byte check can fail: a worker that loads each
    block from the next host page instead is caught at the first load."""
    from kvtier import vllm_worker
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    load = vllm_worker.KvtierOffloadingWorker.submit_load

    def off_by_one(self, job_id, src, dst, expedited=False):
        pages = [(int(p) + 1) % 64 for p in src.block_ids]
        return load(self, job_id, CPULoadStoreSpec(pages), dst, expedited)

    monkeypatch.setattr(vllm_worker.KvtierOffloadingWorker, "submit_load", off_by_one)
    e = Engine(model_dir, "KvtierOffloadingSpec", gpu_blocks=24, host_blocks=64)
    try:
        with pytest.raises(AssertionError, match="holds"):
            prefix_sharing(e)
    finally:
        e.close()


def corrupt_every_page(e: Engine) -> int:
    """Flips a byte of every page the worker's host tier holds (as a bad DIMM or a stray write would)."""
    host, pages = e.offload.host, e.manager.stats()["pages"]
    n = 0
    for p in range(pages):
        b = bytearray(host.read_page(p))
        b[len(b) // 2] ^= 0x5A
        host.write_page(p, bytes(b))
        n += 1
    return n


def run_checked(model_dir, scenario, **kw):
    """The scenario on one engine with kvtier's spec: the engine (closed) and its manager's stats, checked."""
    e = Engine(model_dir, "KvtierOffloadingSpec", **kw)
    try:
        scenario(e)
        st = e.manager.stats()
        e.manager.check()
    finally:
        e.close()
    return e, st


def corrupted_prefix(e: Engine) -> None:
    prompt = SHARED + tokens(2, 32)  # on a chunk boundary, so that a hybrid model's window chunks are stored too
    e.add("a", prompt, 4)
    e.run()
    for i in range(4):
        e.add(f"x{i}", tokens(10 + i, 200), 4)
        e.run()
    corrupt_every_page(e)
    e.add("b", prompt + tokens(3, 50), 4)  # its load from the host tier finds every page bad
    e.run()
    for i in range(4, 8):
        e.add(f"x{i}", tokens(10 + i, 200), 4)
        e.run()
    e.add("c", prompt + tokens(4, 50), 4)  # b's recompute stored the prefix afresh: c loads good pages
    e.run()


def test_a_corrupt_host_page_is_recomputed_under_kvtiers_connector(model_dir):
    """KvtierOffloadingConnector: the refused load reaches vLLM's scheduler as
    blocks with load errors; it recomputes them (the stand-in model checks the
    bytes of every computed token, so a served bad page fails the test), the
    manager forgets the bad pages' keys, and the next request loads the
    prefix that the recompute stored again."""
    e, st = run_checked(model_dir, corrupted_prefix, gpu_blocks=24, host_blocks=64,
                        connector="KvtierOffloadingConnector")
    loads = [x for x in e.log if x[0] == "load"]
    assert [x[1] for x in loads] == ["b", "c"], e.log
    assert st["removed"] >= len(SHARED) // BLOCK, st  # b's refused prefix, forgotten
    news = {x[1]: x[2] for x in e.log if x[0] == "new"}
    assert news["c"] >= len(SHARED), e.log


def test_a_refusal_survives_vllms_aggregation_of_tensor_parallel_workers(model_dir):
    """With tensor parallelism vLLM folds every worker's metadata into rank
    0's (KVOutputAggregator); vLLM's own aggregate() there kept no refusal of
    another rank, and the manager never forgot the bad pages. Every worker's
    metadata is kvtier's: the real connector's, from a run with a refused
    load, folded by vLLM's aggregator with a rank that refused nothing first."""
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from kvtier.vllm_connector import _WorkerMeta
    metas = []
    e = Engine(model_dir, "KvtierOffloadingSpec", gpu_blocks=24, host_blocks=64, connector="KvtierOffloadingConnector")
    build = e.worker.build_connector_worker_meta
    e.worker.build_connector_worker_meta = lambda: metas.append(build()) or metas[-1]
    try:
        corrupted_prefix(e)
    finally:
        e.close()
    sent = [m for m in metas if m is not None]
    assert sent and all(isinstance(m, _WorkerMeta) for m in sent), {type(m).__name__ for m in sent}
    refused = [m for m in sent if m.refused_jobs]
    clean = [m for m in sent if not m.refused_jobs]
    assert refused and clean

    def out(m):
        return ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[],
                                 kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=m))

    agg = KVOutputAggregator(2).aggregate([out(clean[0]), out(refused[0])])
    assert agg.kv_connector_output.kv_connector_worker_meta.refused_jobs == refused[0].refused_jobs


def lagging_second_rank(e: Engine) -> None:
    """Makes e's scheduler wait for two workers (vLLM's pending counts, as
    under tensor parallelism) and adds a second one that reports what the
    real worker reported (finished receives and sends, completed jobs) a
    step later, refusing nothing; vLLM's own aggregator folds the two into
    each step's output, as its executor does."""
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.outputs import KVConnectorOutput
    from kvtier.vllm_connector import _WorkerMeta
    cs = e.sched.connector.connector_scheduler
    cs.config = cs.config._replace(num_workers=2)  # a NamedTuple
    update, agg = e.sched.update_from_output, KVOutputAggregator(2)
    late = KVConnectorOutput()

    def two_ranks(so, out):
        nonlocal late
        mine = out.kv_connector_output
        theirs = copy.copy(out)
        theirs.kv_connector_output = late
        meta = getattr(mine, "kv_connector_worker_meta", None)
        late = KVConnectorOutput(finished_sending=mine.finished_sending, finished_recving=mine.finished_recving,
                                 kv_connector_worker_meta=_WorkerMeta(
                                     completed_jobs=dict(getattr(meta, "completed_jobs", {}) or {})))
        return update(so, agg.aggregate([out, theirs]))
    e.sched.update_from_output = two_ranks


def test_a_refusal_reported_a_step_before_another_ranks_completion(model_dir):
    """With tensor parallelism the workers may report a job in different
    steps: one rank's refusal arrived while the job still waited for another
    rank, its keys pending, and the forget did nothing; the job's end then
    made the refused pages hits (one rank never filled them). The keys are
    forgotten when the job ends: b's recompute stores the prefix afresh and
    c loads it, as with one worker."""
    def scenario(e: Engine) -> None:
        lagging_second_rank(e)
        corrupted_prefix(e)
    e, st = run_checked(model_dir, scenario, gpu_blocks=24, host_blocks=64, connector="KvtierOffloadingConnector")
    assert st["removed"] >= len(SHARED) // BLOCK, st  # b's refused prefix, forgotten
    news = {x[1]: x[2] for x in e.log if x[0] == "new"}
    assert news["c"] >= len(SHARED), e.log


def failed_store(e: Engine) -> None:
    """a's first store fails (kvtier's transfer engine fails the first copy of
    each class: its fault injection); then b with a's prefix, c with it too."""
    from xfer_faults import set_faults
    prompt = SHARED + tokens(2, 32)
    for c in e.offload._classes:
        set_faults(c.xfer, fail_nth=1)
    e.add("a", prompt, 4)
    e.run()
    for c in e.offload._classes:
        set_faults(c.xfer)
    for i in range(4):
        e.add(f"x{i}", tokens(10 + i, 200), 4)
        e.run()
    e.add("b", prompt + tokens(3, 50), 4)
    e.run()
    for i in range(4, 8):
        e.add(f"x{i}", tokens(10 + i, 200), 4)
        e.run()
    e.add("c", prompt + tokens(4, 50), 4)
    e.run()


def test_a_failed_store_is_forgotten_under_kvtiers_connector(model_dir):
    """A store whose copies fail would stop vLLM's worker, which asserts that
    every transfer succeeded (the next test). Under KvtierOffloadingConnector
    it is reported done and the manager forgets its keys when the job ends:
    b, with a's prefix, loads nothing of it and stores it afresh; c loads
    b's, byte for byte (the stand-in model checks every computed token)."""
    e, st = run_checked(model_dir, failed_store, gpu_blocks=24, host_blocks=64, connector="KvtierOffloadingConnector")
    assert [x[1] for x in e.log if x[0] == "load"] == ["c"], e.log
    assert st["removed"] >= 1, st
    news = {x[1]: x[2] for x in e.log if x[0] == "new"}
    assert news["b"] == 0 and news["c"] >= len(SHARED), e.log


def test_a_corrupt_host_page_of_a_hybrid_model_fails_the_receive(model_dir):
    """With two KV cache groups vLLM's scheduler takes a failed load only as a
    failed receive of the request (block ids repeat across groups): the
    connector reports it so, and the request is recomputed all the same."""
    e, st = run_checked(model_dir, corrupted_prefix, gpu_blocks=40, host_blocks=96,
                        connector="KvtierOffloadingConnector", window=32)
    assert [x[1] for x in e.log if x[0] == "load"][:1] == ["b"], e.log
    assert st["removed"] >= 1, st
    news = {x[1]: x[2] for x in e.log if x[0] == "new"}
    assert "b" in news and "c" in news, e.log


def test_sync_loads_of_a_hybrid_model_are_refused_at_start(model_dir):
    """A refused sync load (vLLM's sync_load_budget_bytes) is no request's, so
    with several KV cache groups it would reach vLLM's scheduler as blocks
    with load errors, which stops it (RuntimeError): the connector refuses
    the combination when the KV caches are registered, naming the option."""
    with pytest.raises(ValueError, match="sync_load_budget_bytes with several KV cache groups"):
        Engine(model_dir, "KvtierOffloadingSpec", gpu_blocks=40, host_blocks=96,
               connector="KvtierOffloadingConnector", window=32, extra={"sync_load_budget_bytes": 1 << 30})


@pytest.mark.parametrize("scenario", [corrupted_prefix, failed_store], ids=["corrupt-page", "failed-store"])
def test_under_vllms_stock_connector_a_failed_transfer_stops_the_worker(model_dir, scenario):
    """vLLM 0.33.0's own connector has no path for a failed load or store: it
    asserts. (kvtier's worker reports the failure rather than serving the bad
    page.)"""
    e = Engine(model_dir, "KvtierOffloadingSpec", gpu_blocks=24, host_blocks=64)
    try:
        with pytest.raises(AssertionError):
            scenario(e)
    finally:
        e.close()


def test_two_instances_share_blocks_through_an_l3_redis(model_dir, redis_server, redis_server_handle):
    """Instance a writes its blocks through to a real Redis (the spec's l3);
    instance b, whose host tier has never seen them, finds them there (RETRY
    while it asks), loads them through its host tier, and its stand-in model
    finds the exact bytes a computed. A corrupt object in Redis is then a
    load error, recomputed, and removed from the store."""
    import uuid

    from conftest import redis_command

    extra = {"l3": redis_server, "l3_ns": f"test-{uuid.uuid4().hex[:8]}"}
    kw = dict(gpu_blocks=24, host_blocks=64, connector="KvtierOffloadingConnector", extra=extra)
    a = Engine(model_dir, "KvtierOffloadingSpec", **kw)
    try:
        a.add("a", SHARED + tokens(2, 40), 4)
        a.run()
        put = dict(a.offload.l3_counts)
    finally:
        a.close()
    assert put["pages_put"] >= len(SHARED) // BLOCK and put["puts_failed"] == 0, put

    b = Engine(model_dir, "KvtierOffloadingSpec", **kw)
    try:
        b.add("b", SHARED + tokens(3, 50), 4)
        b.run()
        got = dict(b.offload.l3_counts)
        b.manager.check()
    finally:
        b.close()
    news = {x[1]: x[2] for x in b.log if x[0] == "new"}
    assert news["b"] >= len(SHARED) and [x[1] for x in b.log if x[0] == "load"] == ["b"], b.log
    assert got["pages_fetched"] >= len(SHARED) // BLOCK and got["fetches_failed"] == 0, got

    port = redis_server_handle.port  # every object in the server, corrupted (this test's are among them)
    names = [n for n in redis_command(port, b"KEYS", b"kvt:*").split(b"\r\n") if n.startswith(b"kvt:")]
    assert len(names) >= len(SHARED) // BLOCK
    for n in names:
        redis_command(port, b"SETRANGE", n, b"100", b"garbage")
    c = Engine(model_dir, "KvtierOffloadingSpec", **kw)
    try:
        c.add("c", SHARED + tokens(4, 50), 4)  # its fetch finds them bad: recomputed, removed, stored again
        c.run()
        failed, gets, rm = dict(c.offload.l3_counts), c.offload._l3.stats("get"), c.offload._l3.stats("remove")
        c.manager.check()
    finally:
        c.close()
    assert failed["fetches_failed"] >= 1 and gets["bad_objects"] >= 1 and rm["hits"] >= 1, (failed, gets, rm, c.log)
    d = Engine(model_dir, "KvtierOffloadingSpec", **kw)
    try:
        d.add("d", SHARED + tokens(5, 50), 4)  # c's recompute wrote the prefix through again
        d.run()
        again = dict(d.offload.l3_counts)
    finally:
        d.close()
    assert again["pages_fetched"] >= len(SHARED) // BLOCK and again["fetches_failed"] == 0, (again, d.log)


def test_the_spec_refuses_vllms_canonical_layout(model_dir):
    with pytest.raises(ValueError, match="canonical_layout"):
        sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=2048,
                             enable_chunked_prefill=True, is_encoder_decoder=False)
        mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0)
        cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=True)
        kt = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config={
            "spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm", "host_bytes": 1 << 20,
            "canonical_layout": True})
        vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, kv_transfer_config=kt,
                        device_config=DeviceConfig("cpu"))
        kcc = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(list(LAYERS), FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                                             dtype=torch.float32))])
        vc.cache_config.num_gpu_blocks = 16
        Scheduler(vllm_config=vc, kv_cache_config=kcc, log_stats=True,
                  structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
