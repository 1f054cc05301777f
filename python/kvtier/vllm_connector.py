"""kvtier under vLLM's OffloadingConnector: the connector, for transfers that fail.

``KvtierOffloadingConnector`` (``"kv_connector": "KvtierOffloadingConnector",
"kv_connector_module_path": "kvtier.vllm"``, with ``KvtierOffloadingSpec``
as the spec) is vLLM 0.33.0's ``OffloadingConnector`` plus a path for a load
kvtier's worker refuses (a host page that fails its checksum, a failed copy).
The stock connector asserts that every transfer succeeded, so such a load
would stop the worker; under this one the worker reports the job done and
names its GPU blocks, which reach vLLM's scheduler as blocks with load
errors: the scheduler recomputes those tokens (vLLM's
``kv_load_failure_policy`` decides), and the manager forgets the keys of
the refused pages, so a later request stores them afresh. A store that
fails (a failed copy) is reported done likewise, and the manager forgets its
keys once the job ends: nothing is recomputed (the GPU blocks are whole),
and a later request stores them again. Everything else is vLLM's connector.
Tested through vLLM's own scheduler in python/tests/test_vllm_scheduler.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Set

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.kv_offload.base import OffloadKey

from .vllm import method_diffs

__all__ = ["KvtierOffloadingConnector", "check_connector_interface"]

# What this module overrides of vLLM 0.33.0's OffloadingConnector, as it declares them.
_CONNECTOR_SIGNATURES = {
    "register_kv_caches": ["self", "kv_caches"],
    "get_finished": ["self", "finished_req_ids"],
    "get_transfer_results": ["self", "finished_req_ids"],
    "get_block_ids_with_load_errors": ["self"],
    "build_connector_worker_meta": ["self"],
    "update_connector_output": ["self", "connector_output"],
}


def check_connector_interface() -> List[str]:
    """The differences between vLLM's OffloadingConnector (and its worker
    metadata) and what this module builds on (empty: none)."""
    diffs = [d for d in method_diffs(OffloadingConnector, _CONNECTOR_SIGNATURES) if "is abstract" not in d]
    fields = set(getattr(OffloadingWorkerMetadata, "__dataclass_fields__", ()))
    if not {"completed_jobs", "transfer_stats"} <= fields:
        diffs.append(f"OffloadingWorkerMetadata has fields {sorted(fields)}, not completed_jobs and transfer_stats")
    return diffs


_DIFFS = check_connector_interface()
if _DIFFS:
    raise ImportError("kvtier.vllm_connector builds on vLLM 0.33.0's OffloadingConnector, and this vLLM's "
                      "differs: " + "; ".join(_DIFFS))

@dataclass
class _WorkerMeta(OffloadingWorkerMetadata):
    """vLLM's worker-to-scheduler metadata, and the jobs kvtier's worker
    failed and reported done (job id -> workers that did): loads refused,
    stores whose copies failed."""
    refused_jobs: Dict[int, int] = field(default_factory=dict)

    def aggregate(self, other):
        base = super().aggregate(other)
        refused = dict(self.refused_jobs)
        for j, n in getattr(other, "refused_jobs", {}).items():
            refused[j] = refused.get(j, 0) + n
        return _WorkerMeta(completed_jobs=base.completed_jobs, transfer_stats=base.transfer_stats,
                           refused_jobs=refused)


class KvtierOffloadingConnector(OffloadingConnector):
    """vLLM's OffloadingConnector, and a refused load reported as load errors (the module's doc)."""

    def register_kv_caches(self, kv_caches) -> None:
        many_groups = len(self._kv_cache_config.kv_cache_groups) > 1
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        if many_groups and int(extra.get("sync_load_budget_bytes", 0) or 0) > 0:  # as vLLM reads it
            # a sync load is no request's in vLLM's worker: refused, it could only be reported as
            # blocks with load errors, which vLLM's scheduler takes from a model of one group only
            raise ValueError("KvtierOffloadingConnector: sync_load_budget_bytes with several KV cache groups: a "
                             "refused sync load could not reach vLLM's scheduler (block-level load errors need "
                             "one group); leave sync loads off (0) for this model")
        super().register_kv_caches(kv_caches)
        self._bad_blocks: Set[int] = set()
        self._failed_reqs: Set[str] = set()
        self._refused: Dict[int, int] = {}
        self._many_groups = many_groups
        worker = self.connector_worker.worker
        if hasattr(worker, "report_errors"):  # kvtier's worker; another spec's keeps its own behaviour
            worker.report_errors = True

    def get_finished(self, finished_req_ids: Set[str]):
        # which request each asynchronous load is for (vLLM's worker forgets it as the load ends)
        waiting = dict(self.connector_worker._load_jobs)
        out = super().get_finished(finished_req_ids)
        worker = self.connector_worker.worker
        for job_id in getattr(worker, "take_store_errors", lambda: ())():
            self._refused[job_id] = 1
        take = getattr(worker, "take_load_errors", None)
        if take is not None:
            for job_id, blocks in take().items():
                self._refused[job_id] = 1
                req = waiting.get(job_id)
                if self._many_groups and req is not None:
                    self._failed_reqs.add(req)
                else:
                    self._bad_blocks.update(blocks)
        return out

    def get_transfer_results(self, finished_req_ids: Set[str]):
        """vLLM's results, and the asynchronous loads refused as failed
        receives: with several KV cache groups, block ids are not unique across
        groups and vLLM's scheduler takes a failed load only as a request."""
        res = super().get_transfer_results(finished_req_ids)
        if self._failed_reqs:
            res.failed_recving |= self._failed_reqs
            self._failed_reqs = set()
        return res

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self.connector_worker is None:
            return set()
        bad, self._bad_blocks = self._bad_blocks, set()
        return bad

    def build_connector_worker_meta(self):
        """Every worker's metadata is kvtier's, refusals or none: vLLM's
        aggregator folds the workers' into rank 0's, and vLLM's own
        aggregate() there would drop another rank's refused jobs."""
        meta = super().build_connector_worker_meta()
        refused = getattr(self, "_refused", None) or {}
        if meta is None and not refused:
            return None
        self._refused = {}
        base = meta if meta is not None else OffloadingWorkerMetadata()
        return _WorkerMeta(completed_jobs=base.completed_jobs, transfer_stats=base.transfer_stats,
                           refused_jobs=refused)

    def update_connector_output(self, connector_output) -> None:
        """vLLM's, then the keys of failed jobs (loads refused, stores whose
        copies failed) forgotten once the jobs have ended: with tensor
        parallelism the workers report a job in different steps, and until
        the last has, its keys are pending (a forget then would do nothing,
        and the job's end would make them hits whose pages one rank never
        filled)."""
        meta = connector_output.kv_connector_worker_meta
        sched = self.connector_scheduler
        # job id -> its keys, until the job ends (made here: this is the scheduler's side, which
        # register_kv_caches never reaches)
        refused = self.__dict__.setdefault("_refused_keys", {})
        if isinstance(meta, _WorkerMeta):
            for job_id in meta.refused_jobs:  # the scheduler's job table (job id -> its keys) ends with the job
                st = sched._jobs.get(job_id)
                if st is not None:
                    refused.setdefault(job_id, list(st.keys))
        super().update_connector_output(connector_output)
        ended = [j for j in refused if j not in sched._jobs]
        keys: List[OffloadKey] = [k for j in ended for k in refused.pop(j)]
        forget = getattr(sched.manager, "forget", None)
        if keys and forget is not None:
            forget(keys)
