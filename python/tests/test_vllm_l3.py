"""kvtier's L3 store as a secondary tier of vLLM's own tiering.

vLLM 0.33.0's ``TieringOffloadingSpec`` is built by vLLM's factory from
``kv_connector_extra_config`` naming ``KvtierStoreTier`` (no patch, no
registration); its ``TieringOffloadingManager`` (CPU primary tier, shared
offload region) drives the tier: cascades of stored chunks down to a real
Redis, lookups that answer RETRY while the store is asked, promotions back
into the primary. What the worker would copy to and from the GPU is written
and read here straight in the primary's memory."""
from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pytest

from conftest import redis_command
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                       OffloadingModelConfig, OffloadingParallelConfig)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from kvtier.vllm_l3 import KvtierStoreTier, page_hash

ROW = 4096          # one chunk's bytes (vLLM aligns a chunk to the system page)
END = ScheduleEndContext((), ())


def instance(url: str, chunks: int = 8, **tier):
    """One vLLM engine's offloading manager: a CPU primary of `chunks` chunks over kvtier's store at url."""
    engine = f"kvtier-test-{uuid.uuid4().hex[:12]}"
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=ROW, enable_kv_cache_events=False, engine_id=engine,
        extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": chunks * ROW,
                      "tier_poll_interval_s": 0,
                      "secondary_tiers": [{"type": "KvtierStoreTier", "module_path": "kvtier.vllm_l3", "url": url,
                                           **tier}]},
        model=OffloadingModelConfig(name="tiny", dtype="int8"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True))
    m = OffloadingSpecFactory.create_spec(cfg).get_manager()
    assert isinstance(m, TieringOffloadingManager) and isinstance(m.secondary_tiers[0], KvtierStoreTier)
    return m


def rows(m) -> np.ndarray:
    """The primary tier's memory, a row per chunk (what vLLM's worker copies GPU blocks into)."""
    return np.asarray(m.primary_tier.get_kv_memoryview())


def payload(i: int) -> bytes:
    return (i.to_bytes(4, "little") + os.urandom(60)) * (ROW // 64)


def settle(m, limit=5.0):
    """Scheduler steps until the manager has nothing in flight."""
    end = time.monotonic() + limit
    while m.has_pending_work() and time.monotonic() < end:
        m.on_schedule_end(END)
        time.sleep(0.005)
    assert not m.has_pending_work(), "the manager still has work in flight"


def store(m, rid: str, keys, data):
    """A request whose blocks the GPU worker copies into the primary tier: they cascade to L3."""
    ctx = ReqContext(req_id=rid)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    assert list(out.keys_to_store) == list(keys)
    view = rows(m)
    for c, b in zip(out.store_spec.block_ids, data):
        view[int(c)] = np.frombuffer(b, np.uint8)
    m.complete_store(keys, ctx)
    m.on_request_finished(ctx)
    settle(m)


def lookup(m, ctx, key, limit=5.0):
    """lookup until the answer is final, as vLLM's scheduler retries it; the answers seen."""
    seen = []
    end = time.monotonic() + limit
    while time.monotonic() < end:
        r = m.lookup(key, ctx)
        seen.append(r)
        if r in (LookupResult.HIT, LookupResult.MISS):
            return seen
        m.on_schedule_end(END)
        time.sleep(0.005)
    raise AssertionError(f"no final answer for a lookup: {seen[:5]}...")


def keys_of(tag: bytes, n: int):
    return [make_offload_key(tag + bytes([i]) * 31, 0) for i in range(n)]


def test_a_second_instance_loads_the_first_ones_blocks(redis_server):
    a, b = instance(redis_server), instance(redis_server)
    try:
        keys = keys_of(b"A", 4)
        data = [payload(i) for i in range(4)]
        store(a, "a0", keys, data)
        assert a.secondary_tiers[0].stats()["put"]["hits"] >= 4

        ctx = ReqContext(req_id="b0")
        b.on_new_request(ctx)
        for i, k in enumerate(keys):
            seen = lookup(b, ctx, k)
            assert seen[0] == LookupResult.RETRY, "a key not yet asked about answers RETRY, never blocks"
            if seen[-1] != LookupResult.HIT:  # the promotion is in flight: HIT_PENDING, then HIT
                assert LookupResult.HIT_PENDING in seen or seen[-1] == LookupResult.MISS, seen
            assert seen[-1] == LookupResult.HIT, (i, seen)
        spec = b.prepare_load(keys, ctx)
        view = rows(b)
        assert [view[int(c)].tobytes() for c in spec.block_ids] == data
        b.complete_load(keys, ctx)
        b.on_request_finished(ctx)

        ctx = ReqContext(req_id="b1")  # a key no instance stored is a miss
        b.on_new_request(ctx)
        assert lookup(b, ctx, keys_of(b"Z", 1)[0])[-1] == LookupResult.MISS
        b.on_request_finished(ctx)
        settle(b)
    finally:
        a.shutdown()
        b.shutdown()


def test_a_corrupt_object_is_a_miss_and_goes(redis_server, redis_server_handle):
    a, b = instance(redis_server), instance(redis_server)
    try:
        keys = keys_of(b"C", 2)
        data = [payload(10 + i) for i in range(2)]
        store(a, "a0", keys, data)
        tier = a.secondary_tiers[0]
        name = b"kvt:" + tier._store.key(page_hash(keys[1])).encode()  # the Redis key of its object
        assert redis_command(redis_server_handle.port, b"EXISTS", name) == b":1\r\n"
        redis_command(redis_server_handle.port, b"SETRANGE", name, b"200", b"not the bytes it had")

        ctx = ReqContext(req_id="b0")
        b.on_new_request(ctx)
        assert lookup(b, ctx, keys[0])[-1] == LookupResult.HIT
        assert lookup(b, ctx, keys[1])[-1] == LookupResult.MISS   # the promotion failed its checks
        spec = b.prepare_load(keys[:1], ctx)
        assert rows(b)[int(spec.block_ids[0])].tobytes() == data[0]
        b.complete_load(keys[:1], ctx)
        b.on_request_finished(ctx)
        settle(b)
        assert b.secondary_tiers[0].stats()["get"]["bad_objects"] >= 1
        assert redis_command(redis_server_handle.port, b"EXISTS", name) == b":0\r\n"  # removed for every instance
    finally:
        a.shutdown()
        b.shutdown()


def test_a_store_job_and_a_lookup_are_checked(dir_store_url):
    """A chunk named twice would put one key's bytes under another key (and a
    second instance would be served them), a fraction was cut to a chunk; a
    key that is not vLLM's bytes was asked of the store only at the step's
    end, failing the good keys asked beside it (and 5 was five zero bytes)."""
    import numpy as np
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from kvtier.vllm_l3 import page_hash
    m = instance(dir_store_url)
    try:
        t = m.secondary_tiers[0]
        k1, k2 = keys_of(b"j", 2)
        for chunks, exc in ((np.array([3, 3]), ValueError), (np.array([2.9, 3.7]), TypeError)):
            job = TransferJob(job_id=1, keys=[k1, k2], chunk_ids=chunks, is_promotion=False,
                              req_context=ReqContext(req_id="r"))
            with pytest.raises(exc, match="chunk"):
                t.submit_store(job)
        for bad in ("abc", 5, b"\1" * 4):
            with pytest.raises(TypeError, match="a vLLM key is bytes"):
                t.lookup(bad, ReqContext(req_id="r"))
        with pytest.raises(TypeError):
            page_hash(5)
    finally:
        m.shutdown()


def test_bad_options_are_refused(redis_server):
    with pytest.raises(ValueError, match="url"):
        instance("")
    with pytest.raises(ValueError, match="unknown option.*colour"):
        instance(redis_server, colour="blue")
    with pytest.raises(Exception, match="nope"):
        instance("nope://x")
    # each refused naming it, not cut to a whole number or turned into a string
    for bad, msg in (({"threads": "abc"}, "threads: expected a whole number"), ({"threads": 2.9}, "threads"),
                     ({"threads": True}, "threads"), ({"threads": 65}, r"threads: 65 \(expected 1..64\)"),
                     ({"timeout_ms": 1.5}, "timeout_ms"), ({"timeout_ms": -1}, "timeout_ms"),
                     ({"ns": None}, "ns: expected a non-empty string"), ({"ns": ""}, "ns"), ({"ns": 12}, "ns")):
        with pytest.raises(ValueError, match=msg):
            instance(redis_server, **bad)
