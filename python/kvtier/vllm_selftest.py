"""vLLM's own engine core driving kvtier's offloading spec, on a CPU:
``python -m kvtier.vllm_selftest`` (JSON; exit status 0 when every check holds).

``Engine`` is one vLLM 0.33.0 engine core without a GPU: vLLM's
``Scheduler`` (its KV cache manager, GPU prefix cache and preemption) with
its stock ``OffloadingConnector`` on both sides, as vLLM's connector unit
tests build them; the scheduler side runs the spec's manager, the worker side
the spec's worker over real KV tensors (host memory standing in for the
GPU's). A stand-in model writes, for every token it computes, KV bytes that
are a function of the token prefix, and checks before each step that every
token the scheduler counts as computed, whether vLLM's GPU prefix cache or a
load from the host tier supplied it, holds exactly those bytes.

``both`` runs a scenario through kvtier's manager and through vLLM's own
``CPUOffloadingManager`` (lru, the same capacity, the same kvtier worker) and
checks that the two runs agree step by step: which requests ran with how many
tokens already computed, every load and store job (request and GPU blocks).

The self-test runs two scenarios that way (a shared prefix loaded back from
the host tier; a host tier far smaller than the traffic) and prints what
each did. python/tests/test_vllm_scheduler.py runs these and more."""
from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import tempfile
import time
from typing import Callable, List, Optional, Set

import torch

from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig,
                         set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.forward_context import ForwardContext
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from .vllm import KvtierOffloadingManager, KvtierOffloadingSpec

__all__ = ["Engine", "VllmManagerSpec", "both", "write_model_config", "tokens", "prefix_sharing", "full_tier",
           "main"]

BLOCK = 16                      # tokens per GPU block (and per offloaded chunk)
HEADS, HEAD = 2, 16             # float32 K and V: 4 KiB pages
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
PAGE = 2 * BLOCK * HEADS * HEAD * 4
EOS = 2


class VllmManagerSpec(KvtierOffloadingSpec):
    """kvtier's spec with vLLM's own manager in the scheduler (the reference), of the spec's policy."""

    def get_manager(self):
        if self._manager is None:
            self._manager = CPUOffloadingManager(num_chunks=self.num_chunks, cache_policy=self.policy,
                                                 store_threshold=self.store_threshold,
                                                 max_tracker_size=self.max_tracker_size,
                                                 enable_events=self.kv_events_config.enable_kv_cache_events)
        return self._manager


def write_model_config(directory: str) -> str:
    """A tiny Llama's config.json in directory: vLLM's ModelConfig reads it; no weights are needed."""
    import os
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": HEADS,
                   "num_hidden_layers": len(LAYERS), "vocab_size": 1000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": EOS}, f)
    return directory


def _prefix_value(tokens: List[int], layer: int) -> float:
    """The KV value the stand-in model writes for the last of tokens (a function of the whole prefix)."""
    h = hashlib.blake2b(struct.pack(f"<{len(tokens)}i", *tokens), digest_size=4, person=bytes([layer])).digest()
    return float(int.from_bytes(h, "little") % (1 << 22))


class Engine:
    """One vLLM engine core: its scheduler, the connector's worker side over
    real tensors, and a model stand-in that writes and checks KV bytes."""

    def __init__(self, model: str, spec: str, gpu_blocks: int, host_blocks: int, max_batched: int = 256,
                 connector: str = "OffloadingConnector", extra: Optional[dict] = None,
                 window: Optional[int] = None) -> None:
        sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_batched, max_model_len=2048,
                             enable_chunked_prefill=True, is_encoder_decoder=False)
        mc = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float32", seed=0)
        cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=True)
        ours = connector == "KvtierOffloadingConnector"
        kt = KVTransferConfig(kv_connector=connector, kv_connector_module_path="kvtier.vllm" if ours else None,
                              kv_load_failure_policy="recompute", kv_role="kv_both", kv_connector_extra_config={
            "spec_name": spec,
            "spec_module_path": "kvtier.vllm" if spec == "KvtierOffloadingSpec" else __name__, "host_bytes": host_blocks * PAGE * len(LAYERS),
            **(extra or {})})
        self.vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, kv_transfer_config=kt,
                             device_config=DeviceConfig("cpu"))
        full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float32)
        if window is None:  # every layer full attention: one KV cache group
            groups = [KVCacheGroupSpec(list(LAYERS), full)]
        else:  # a hybrid model: layer 0 full attention, layer 1 sliding window, a group each
            groups = [KVCacheGroupSpec([LAYERS[0]], full), KVCacheGroupSpec([LAYERS[1]], SlidingWindowSpec(
                block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float32, sliding_window=window))]
        self.window = window
        self.group_of = [0, 0] if window is None else [0, 1]
        kcc = KVCacheConfig(num_blocks=gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
        self.vc.cache_config.num_gpu_blocks = gpu_blocks
        self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=kcc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(self.vc), block_size=BLOCK)
        if ours:
            from .vllm_connector import KvtierOffloadingConnector as cls
        else:
            cls = OffloadingConnector
        self.worker = cls(self.vc, KVConnectorRole.WORKER, kcc)
        # vLLM's attention layout, blocks first: (num_blocks, K/V, block_size, heads, head_size)
        self.kv = {n: torch.zeros(gpu_blocks, 2, BLOCK, HEADS, HEAD) for n in LAYERS}
        with set_current_vllm_config(self.vc):
            self.worker.register_kv_caches(self.kv)
        self.offload = self.worker.connector_worker.worker
        self.manager = self.sched.connector.connector_scheduler.manager
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.log: List[tuple] = []
        self.added: List[str] = []
        self.held: Set[int] = set()         # jobs whose completion the worker keeps back
        self._held_results: list = []
        self._deferred_stores: Set[int] = set()
        self._worker_get_finished = self.offload.get_finished
        self.offload.get_finished = self._finished_but_held
        self.preempted = 0
        self.loads = self.stores = 0
        self.steps = 0

    def close(self) -> None:
        self.worker.shutdown()
        self.sched.connector.shutdown()

    # ---- requests -----------------------------------------------------------------

    def add(self, rid: str, tokens: List[int], max_tokens: int) -> None:
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, EOS)
        self.added.append(rid)
        self.sched.add_request(Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp,
                                       pooling_params=None, block_hasher=self.hasher))

    def abort(self, rid: str) -> None:
        self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        self.log.append(("abort", rid))

    # ---- the model stand-in ----------------------------------------------------------

    def _slots(self, rid: str, group: int, start: int, end: int):
        blocks = self.sched.kv_cache_manager.get_block_ids(rid)[group]
        return [(blocks[p // BLOCK], p % BLOCK) for p in range(start, end)]

    def _check_computed(self, req: Request, upto: int) -> None:
        """Every token the next one attends to holds its bytes: all of them for
        full attention, the last `window` for the sliding-window layer."""
        toks = req.all_token_ids
        for li, n in enumerate(LAYERS):
            g = self.group_of[li]
            first = 0 if g == 0 else max(0, upto - self.window + 1)
            for p, (b, off) in enumerate(self._slots(req.request_id, g, first, upto), first):
                want = _prefix_value(toks[:p + 1], li)
                got = self.kv[n][b, :, off]
                assert bool((got == want).all()), (f"{req.request_id}: token {p} (block {b}, slot {off}) of {n} "
                                                   f"holds {got.flatten()[0].item()}, not {want}")

    def _compute(self, req: Request, start: int, n: int) -> None:
        toks = req.all_token_ids
        for li, name in enumerate(LAYERS):
            for i, (b, off) in enumerate(self._slots(req.request_id, self.group_of[li], start, start + n)):
                self.kv[name][b, :, off] = _prefix_value(toks[:start + i + 1], li)

    # ---- one engine step -----------------------------------------------------------------

    def _finished_but_held(self):
        """kvtier's worker's get_finished, keeping back the jobs in ``held``
        (the test's way of leaving a load in flight across steps)."""
        self._held_results += self._worker_get_finished()
        out = [r for r in self._held_results if r.job_id not in self.held]
        self._held_results = [r for r in self._held_results if r.job_id in self.held]
        return out

    def step(self) -> None:
        so = self.sched.schedule()
        self.steps += 1
        md = so.kv_connector_metadata
        if so.preempted_req_ids:
            self.preempted += len(so.preempted_req_ids)
            self.log.append(("preempted", tuple(sorted(so.preempted_req_ids))))
        for nr in so.scheduled_new_reqs:
            self.log.append(("new", nr.req_id, nr.num_computed_tokens))
        for jid, job in sorted(md.load_jobs.items()):
            self.loads += 1
            self.log.append(("load", job.req_id, tuple(int(b) for b in job.dst_spec.block_ids),
                             tuple(int(n) for n in job.dst_spec.group_sizes)))
        for jid, job in sorted(md.store_jobs.items()):
            self.stores += 1
            self.log.append(("store", job.req_id, tuple(int(b) for b in job.src_spec.block_ids),
                             tuple(int(n) for n in job.src_spec.group_sizes)))
        if md.jobs_to_flush:
            self.log.append(("flush", len(md.jobs_to_flush)))

        w = self.worker
        w.handle_preemptions(md)
        w.bind_connector_metadata(md)
        w.start_load_kv(ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={}))
        # every job submitted so far ends before this step's outputs are read, so that both runs
        # see each completion at the same step (a held load ends too; only its report waits)
        self.offload.wait(set(md.load_jobs) | self._deferred_stores)
        # the model: what is computed before the step must hold its bytes; then it computes the step's tokens
        for rid, n in so.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            start = req.num_computed_tokens - n    # the scheduler counts the step's tokens when it schedules
            self._check_computed(req, start)
            self._compute(req, start, n)
        w.wait_for_save()
        self._deferred_stores = set(md.store_jobs)  # vLLM's worker submits them at the next step's start
        results = w.get_transfer_results(so.finished_req_ids)  # as vLLM's model runner asks, in its order
        invalid = w.get_block_ids_with_load_errors()
        meta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        reqs = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(req_ids=reqs, req_id_to_index={r: i for i, r in enumerate(reqs)},
                                sampled_token_ids=[[10 + (len(self.sched.requests[r].all_token_ids) % 7)]
                                                   for r in reqs],
                                kv_connector_output=KVConnectorOutput(
                                    finished_sending=results.finished_sending,
                                    finished_recving=results.finished_recving,
                                    failed_recving=results.failed_recving, invalid_block_ids=invalid,
                                    kv_connector_worker_meta=meta))
        self.sched.update_from_output(so, out)

    def run(self, max_steps: int = 400) -> None:
        for _ in range(max_steps):
            if not self.sched.requests:
                break
            self.step()
        # the scheduler reports stores done one step after the last request ends
        for _ in range(3):
            self.step()


def both(model_dir, scenario, **kw):
    """The scenario through kvtier's manager and through vLLM's; returns both engines (closed)."""
    out = []
    for spec in ("KvtierOffloadingSpec", "VllmManagerSpec"):
        e = Engine(model_dir, spec, **kw)
        try:
            scenario(e)
            if isinstance(e.manager, KvtierOffloadingManager):
                e.manager.check()
                e.stats = e.manager.stats()
        finally:
            e.close()
        out.append(e)
    kv, ref = out
    assert isinstance(kv.manager, KvtierOffloadingManager) and isinstance(ref.manager, CPUOffloadingManager)
    for i, (a, b) in enumerate(zip(kv.log, ref.log)):
        assert a == b, f"entry {i} differs: kvtier {a}, vLLM {b}\n(kvtier {kv.log[max(0, i - 5):i + 3]})"
    assert len(kv.log) == len(ref.log)
    ran = {x[1] for x in kv.log if x[0] in ("new", "abort")}
    assert set(kv.added) <= ran, f"requests neither scheduled nor aborted: {sorted(set(kv.added) - ran)}"
    return kv, ref


def tokens(seed: int, n: int) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(100, 900, (n,), generator=g)).tolist()


SHARED = tokens(1, 160)


def prefix_sharing(e: Engine) -> None:
    """A finished request's blocks leave the GPU under other requests; a later
    request sharing its prefix loads that prefix from the host tier."""
    e.add("a", SHARED + tokens(2, 40), 4)
    e.run()
    for i in range(4):  # unrelated requests that take every GPU block in turn
        e.add(f"x{i}", tokens(10 + i, 200), 4)
        e.run()
    e.add("b", SHARED + tokens(3, 50), 4)
    e.run()


def full_tier(e: Engine) -> None:
    """Five prefixes of six blocks, reused at varying distances, through a GPU
    that holds one request and a host tier that holds about four: every store
    evicts, and what a request finds depends on which blocks survived."""
    prefixes = [tokens(40 + i, 96) for i in range(5)]
    for r, i in enumerate([0, 1, 2, 0, 3, 1, 4, 0, 2, 3, 1, 0, 4, 2]):
        e.add(f"r{r}", prefixes[i] + tokens(100 + r, 16), 2)
        e.run()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.vllm_selftest", description=__doc__.split("\n\n")[0])
    p.parse_args(argv)
    out = {"vllm": "0.33.0", "checks": []}
    ok = True
    with tempfile.TemporaryDirectory(prefix="kvtier-selftest-") as d:
        model = write_model_config(d)
        for name, scenario, kw in (("prefix_sharing", prefix_sharing, dict(gpu_blocks=24, host_blocks=64)),
                                   ("full_host_tier", full_tier, dict(gpu_blocks=10, host_blocks=30))):
            t0 = time.monotonic()
            try:
                kv, _ = both(model, scenario, **kw)
                out["checks"].append({"scenario": name, "ok": True, "steps": kv.steps, "loads": kv.loads,
                                      "stores": kv.stores, "keyed_cache": kv.stats,
                                      "seconds": round(time.monotonic() - t0, 2)})
            except AssertionError as e:
                ok = False
                out["checks"].append({"scenario": name, "ok": False, "why": str(e)[:2000]})
    out["ok"] = ok
    print(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
