"""kvtier's L3 store under vLLM's CPU tier: a secondary tier of vLLM's tiering.

vLLM 0.33.0 tiers its offloaded KV with ``TieringOffloadingSpec``: a CPU
primary tier that the GPU copies to and from, and secondary tiers below it
that only ever exchange chunks with the primary (a store cascades GPU -> CPU
-> secondary; a hit below is promoted secondary -> CPU -> GPU). A secondary
tier is loaded by name, with no patch to vLLM::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 68719476736,
        "secondary_tiers": [{"type": "KvtierStoreTier", "module_path": "kvtier.vllm_l3",
                             "url": "redis-cluster://10.0.0.5:7000,10.0.0.6:7000"}]}}'

``KvtierStoreTier`` puts each chunk the primary holds into kvtier's L3 store
(``url``: ``dir:PATH[,max=SIZE]``, ``redis://[USER[:PASSWORD]@]HOST:PORT``,
``redis-cluster://H:P[,H:P...]``, as ``kvtier replay --l3``) and brings
chunks back into the primary on a hit: every instance pointed at the same
store reuses every other's chunks. Each object carries the model's identity
and its own checksum; an object that fails its checks is a miss, never
served (the promotion fails, vLLM recomputes those tokens).

Lookups never block the scheduler: a key the tier has not seen answers
``RETRY`` and joins one ``exists`` batch per scheduler step; the answer
(``HIT`` or ``MISS``) is kept for the requests that asked until they finish.
Stores and loads are asynchronous batches on the store's threads, read
from and written into the primary's memory in place (an engine tier over
vLLM's shared offload region, no staging copy); ``get_finished_jobs``
reports each with its bytes and time.

Options (beside vLLM's ``type`` and ``module_path``): ``url`` (required),
``ns`` (a namespace inside the store, "default"), ``threads`` (2),
``timeout_ms`` (2000)."""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from typing import Any, Dict, List, Optional, Set, Tuple

try:
    from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadKey, ReqContext, RequestOffloadingContext,
                                         ScheduleEndContext)
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
except ImportError as e:  # pragma: no cover - the suite runs with vLLM installed
    raise ImportError(f"kvtier.vllm_l3 needs vLLM 0.33.0's tiering modules ({e}); "
                      "pip install --no-deps vllm==0.33.0 (see docs/vllm.md)") from e

from . import _args as _a
from .store import Store
from .tier import Tier

__all__ = ["ExistsCache", "KvtierStoreTier", "page_hash"]

_OPTIONS = ("url", "ns", "threads", "timeout_ms")


def page_hash(key: OffloadKey) -> bytes:
    """The store's 128-bit page hash of a vLLM key (its block hash and group
    index): the same key gives the same hash in every instance."""
    return hashlib.blake2b(_key_bytes(key), digest_size=16, person=b"kvtier-vllm").digest()


def _key_bytes(key: Any) -> bytes:
    """A vLLM key as bytes (its block hash and 4-byte group index); TypeError
    for anything else (bytes(5) would be five zero bytes, an alias)."""
    if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) <= 4:
        raise TypeError(f"a vLLM key is bytes (a block hash and a group index), not {type(key).__name__} {key!r:.40}")
    return bytes(key)


class ExistsCache:
    """What a store holds, asked without blocking the scheduler: ``lookup``
    answers True or False when the store has said, None while it is being
    asked; the keys asked during a step go to the store as one ``exists``
    batch at ``flush`` (the step's end). An answer is kept while a request
    that asked for it is unfinished (``finish``), so that a request sees one
    answer per key and the next request asks afresh. ``take`` consumes the
    store's results that are this cache's (the store may carry other batches)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: Dict[OffloadKey, bool] = {}        # answers, kept while a request that asked is unfinished
        self._askers: Dict[OffloadKey, int] = {}        # ... how many unfinished requests asked
        self._asked: Dict[str, Set[OffloadKey]] = {}    # request -> the keys it asked about
        self._batch: Dict[OffloadKey, None] = {}        # keys to ask about at the step's end
        self._asking: Dict[int, List[OffloadKey]] = {}  # exists ticket -> its keys
        self._in_flight: Set[OffloadKey] = set()

    def lookup(self, key: OffloadKey, req_id: str) -> Optional[bool]:
        _key_bytes(key)  # refused now, not at the batch's end with the good keys asked beside it
        asked = self._asked.setdefault(req_id, set())
        if key not in asked:
            asked.add(key)
            self._askers[key] = self._askers.get(key, 0) + 1
        known = self._known.get(key)
        if known is None and key not in self._in_flight:
            self._batch[key] = None
        return known

    def known(self, key: OffloadKey) -> Optional[bool]:
        """The answer kept for key, asking nothing."""
        return self._known.get(key)

    def in_flight(self) -> bool:
        return bool(self._asking)

    def set(self, key: OffloadKey, present: bool) -> None:
        """What this process learnt otherwise (a put landed, a get failed), kept for the requests that asked."""
        if self._askers.get(key):
            self._known[key] = present
        else:
            self._known.pop(key, None)

    def flush(self) -> None:
        if self._batch:
            keys = list(self._batch)
            self._batch.clear()
            self._asking[self._store.exists([page_hash(k) for k in keys], user=0)] = keys
            self._in_flight.update(keys)

    def take(self, r: Any) -> bool:
        keys = self._asking.pop(r.ticket, None)
        if keys is None:
            return False
        self._in_flight.difference_update(keys)
        for k, res in zip(keys, r.results):
            if self._askers.get(k):  # someone still wants the answer
                self._known[k] = res == "ok"
        return True

    def finish(self, req_id: str) -> None:
        for k in self._asked.pop(req_id, ()):
            self._askers[k] -= 1
            if not self._askers[k]:
                del self._askers[k]
                self._known.pop(k, None)

    def pending(self) -> bool:
        return bool(self._batch or self._asking)

    def clear(self) -> None:
        """Forgets every answer and request (a cache reset); batches in flight are still taken."""
        self._known.clear()
        self._askers.clear()
        self._asked.clear()
        self._batch.clear()


class KvtierStoreTier(SecondaryTierManager):
    """A vLLM secondary tier over a kvtier L3 store (see the module's doc)."""

    medium = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        unknown = sorted(set(options) - set(_OPTIONS) - {"locality"})
        if unknown:
            raise ValueError(f"{tier_type}: unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
        url = options.get("url")
        if not isinstance(url, str) or not url:
            raise ValueError(f"{tier_type}: url: a store URL is required (dir:PATH, redis://H:P, "
                             "redis-cluster://H:P[,H:P...])")
        ns = options.get("ns", "default")
        if not isinstance(ns, str) or not ns:
            raise ValueError(f"{tier_type}: ns: expected a non-empty string, not {ns!r}")
        # checked before the primary's memory is viewed: a view left exported keeps vLLM's region mapped
        threads = _a.option_count(options, "threads", 2, 1, 64, tier_type)
        timeout_ms = _a.option_count(options, "timeout_ms", 2000, 1, _a.U32_MAX, tier_type)
        import torch  # the engine tier describes the primary's memory as a tensor

        view = primary_kv_view
        if view.ndim != 2 or view.readonly:
            raise ValueError(f"{tier_type}: the primary tier's view must be a writable (chunks, bytes) "
                             f"memoryview, not {view.ndim}-d{' read-only' if view.readonly else ''}")
        self._chunks, self._row = view.shape
        rows = torch.frombuffer(view.cast("B"), dtype=torch.uint8).view(self._chunks, self._row)
        self._tier = Tier.from_tensors([rows], name="vllm-primary")
        cfg = offloading_spec.config
        identity = (f"vllm:{cfg.model.name}:{cfg.model.dtype}:{cfg.kv_cache_layout}:"
                    f"tp{cfg.parallel.tp_size}x{cfg.parallel.world_size}:{self._row}B")
        try:
            self._store = Store(url, tier=self._tier, model=identity,
                                page_tokens=cfg.cache.tokens_per_hash * cfg.cache.blocks_per_chunk,
                                layers=1, layer_bytes=self._row, dtype_bytes=1, ns=ns, threads=threads,
                                timeout_ms=timeout_ms)
        except BaseException:
            self._tier.close()
            raise
        self._exists = ExistsCache(self._store)
        self._jobs: Dict[int, Tuple[TransferJob, List[OffloadKey], bool]] = {}  # ticket -> job, keys, is load
        self._removing: Dict[int, List[OffloadKey]] = {}  # remove ticket -> its keys
        self._done: List[JobResult] = []

    # ---- lookups ----------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._poll()
        known = self._exists.lookup(key, req_context.req_id)
        if known is None:
            return LookupResult.RETRY
        return LookupResult.HIT if known else LookupResult.MISS

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._exists.flush()
        self._poll()

    # ---- stores and loads ------------------------------------------------------------

    def _chunks_of(self, job: TransferJob) -> List[int]:
        """The job's chunk ids: integers (2.9 is no chunk), each once (a chunk
        twice would put one key's bytes under another key), in the primary."""
        ids = [_a.integer(c, f"job {job.job_id}: a chunk id", 0, _a.U64_MAX) for c in job.chunk_ids]
        if len(ids) != len(job.keys) or not all(c < self._chunks for c in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"job {job.job_id}: {len(job.keys)} keys, chunks {ids} (each once; the primary has "
                             f"{self._chunks})")
        return ids

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        pages = list(zip((page_hash(k) for k in keys), self._chunks_of(job_metadata)))
        todo = [(k, p) for k, p in zip(keys, pages) if self._exists.known(k) is not True]
        if not todo:
            self._done.append(JobResult(job_metadata.job_id, True, transfer_time=0.0, transfer_bytes=0))
            return
        t = self._store.put([p for _, p in todo], user=job_metadata.job_id)
        self._jobs[t] = (job_metadata, [k for k, _ in todo], False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        pages = list(zip((page_hash(k) for k in keys), self._chunks_of(job_metadata)))
        t = self._store.get(pages, user=job_metadata.job_id)
        self._jobs[t] = (job_metadata, keys, True)

    def _poll(self, timeout: float = 0.0) -> None:
        for r in self._store.poll(timeout):
            if self._exists.take(r) or self._removing.pop(r.ticket, None) is not None:
                continue
            job, keys, is_load = self._jobs.pop(r.ticket)
            ok = [k for k, res in zip(keys, r.results) if res == "ok"]
            if is_load:
                bad = [k for k, res in zip(keys, r.results) if res == "bad"]
                if bad:  # an object that failed its checks goes, for every instance
                    self._removing[self._store.remove([page_hash(k) for k in bad])] = bad
                for k, res in zip(keys, r.results):
                    if res != "ok":  # a miss for the requests that asked (no promotion again)
                        self._exists.set(k, False)
            else:
                for k in ok:
                    self._exists.set(k, True)
            self._done.append(JobResult(job.job_id, success=len(ok) == len(keys),
                                        successful_keys=ok if is_load and len(ok) != len(keys) else None,
                                        transfer_time=r.latency_ns / 1e9, transfer_bytes=len(ok) * self._row))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._poll()
        done, self._done = self._done, []
        return done

    def has_pending_work(self) -> bool:
        return bool(self._jobs or self._exists.pending() or self._removing)

    def drain_jobs(self) -> None:
        while self._jobs or self._exists.in_flight() or self._removing:
            self._poll(timeout=0.05)

    # ---- requests ---------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._exists.finish(req_context.req_id)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return

    # ---- kvtier's own ----------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The store's counters per operation (kvtier.Store.stats)."""
        return {op: self._store.stats(op) for op in ("exists", "get", "put")}

    def shutdown(self) -> None:
        if self._store is not None:
            self.drain_jobs()
            self._store.close()
            self._tier.close()
            self._store = None
