"""kvtier.vllm_worker against two oracles: a plain numpy model of what vLLM
0.33.0's offloading semantics say moves (per KV cache group, block i of the
group to sub-block (block_indices % blocks_per_chunk) + i of its chunks, the
first page_size_bytes of each of the group's refs), and vLLM's own
CPUOffloadingWorker run on the same jobs. vLLM's worker asserts CUDA tensors
and copies with CUDA streams, events and a custom op; here its tensors say
they are CUDA (a Tensor subclass), its streams and events are no-ops and its
copy op is a memmove of the (src, dst, size) list vLLM builds, so every
address is vLLM's own arithmetic. Host bytes and GPU bytes are compared three
ways after every phase."""
import contextlib
import ctypes
import logging
import os
import random

import numpy as np
import pytest

pytest.importorskip("vllm.v1.kv_offload.base")
import torch  # noqa: E402
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,  # noqa: E402
                                     CanonicalPageMapping, GPULoadStoreSpec)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

import kvtier.vllm_worker as vw  # noqa: E402
from kvtier.vllm_worker import KvtierOffloadingWorker  # noqa: E402

NB, NC = 40, 24                        # GPU blocks, host chunks
PAGES = [96, 96, 160, 64]              # canonical tensors' padded page sizes
GROUPS = [[(0, 96), (1, 96), (2, 128)],  # (tensor, unpadded bytes) per ref
          [(0, 80), (1, 80), (3, 64)],   # overlays group 0's tensors with other sizes
          [(2, 160)]]


def caches(seed, cls=None):
    """CanonicalKVCaches over one backing allocation (as vLLM's), random bytes;
    tensor 1 is float16 shaped [blocks, 2, 24] (the worker views it as bytes)."""
    g = torch.Generator().manual_seed(seed)
    backing = torch.randint(-128, 128, (NB * sum(PAGES),), dtype=torch.int8, generator=g)
    if cls is not None:
        backing = backing.as_subclass(cls)
    tensors, off = [], 0
    for t, P in enumerate(PAGES):
        x = backing[off:off + NB * P].view(NB, P)
        if t == 1:
            x = x.view(torch.float16).view(NB, 2, P // 4)
        tensors.append(CanonicalKVCacheTensor(x, P))
        off += NB * P
    refs = [[CanonicalKVCacheRef(t, s) for t, s in grp] for grp in GROUPS]
    return CanonicalKVCaches(tensors, refs), backing


def gpu_bytes(kv):
    return [np.array(ct.tensor.view(torch.int8).reshape(NB, -1).numpy(), copy=True) for ct in kv.tensors]


class Model:
    """What vLLM's semantics say the bytes are: per tensor a GPU array
    [blocks, P] and a host array [chunks, bpc * P], as vLLM's CPU tensors."""

    def __init__(self, gpu, bpc):
        self.gpu, self.bpc = [g.copy() for g in gpu], bpc
        self.host = [np.zeros((NC, bpc * P), np.int8) for P in PAGES]

    def apply(self, job, load):
        blocks, chunks, sizes, starts = job
        b = c = 0
        for g, (n, start) in enumerate(zip(sizes, starts)):
            if n == 0:
                continue
            skip = start % self.bpc
            mine = chunks[c:c + -(-(skip + n) // self.bpc)]
            for i in range(n):
                chunk, j = mine[(skip + i) // self.bpc], (skip + i) % self.bpc
                for t, s in GROUPS[g]:
                    P = PAGES[t]
                    if load:
                        self.gpu[t][blocks[b + i], :s] = self.host[t][chunk, j * P:j * P + s]
                    else:
                        self.host[t][chunk, j * P:j * P + s] = self.gpu[t][blocks[b + i], :s]
            b, c = b + n, c + len(mine)

    def size(self, job):
        return sum(n * sum(s for _, s in GROUPS[g]) for g, n in enumerate(job[2]))


def host_bytes(w):
    """Our host tier, rearranged as vLLM's per-tensor CPU arrays."""
    out = [np.zeros((NC, w.blocks_per_chunk * P), np.int8) for P in PAGES]
    for c in range(NC):
        page = np.frombuffer(w.host.read_page(c), np.int8)
        for t, P in enumerate(PAGES):
            for j in range(w.blocks_per_chunk):
                o = w.host_offset(j, t)
                out[t][c, j * P:(j + 1) * P] = page[o:o + P]
    return out


def specs(job):
    blocks, chunks, sizes, starts = job
    return GPULoadStoreSpec(blocks, sizes, starts), CPULoadStoreSpec(chunks)


def drain(w, ids):
    """get_finished until every id is reported; each exactly once."""
    got = {}
    for _ in range(2000):
        for r in w.get_finished():
            assert r.job_id not in got, f"job {r.job_id} reported twice"
            got[r.job_id] = r
        if set(got) >= set(ids):
            break
        w.wait(set(ids))
    assert set(got) == set(ids)
    return got


# ---- vLLM's own worker on CPU tensors -------------------------------------------------

class _FakeCuda(torch.Tensor):
    @property
    def is_cuda(self):
        return True


class _Event:
    def __init__(self, *a, **k):
        pass

    def record(self, *a):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0


class _Stream:
    def wait_stream(self, s):
        pass

    def wait_event(self, e):
        pass


class _Platform:
    Stream = _Stream

    def current_stream(self):
        return _Stream()

    def stream(self, s):
        return contextlib.nullcontext()

    def is_xpu(self):
        return False

    def is_rocm(self):
        return False


class _Ops:
    @staticmethod
    def swap_blocks_batch(src, dst, sizes, is_src_access_order_any=False):
        for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist()):
            ctypes.memmove(d, s, n)


@pytest.fixture
def vllm_worker(monkeypatch):
    """A factory of vLLM's CPUOffloadingWorker that runs on CPU tensors."""
    from vllm.v1.kv_offload.cpu import gpu_worker as gw
    monkeypatch.setattr(gw, "PIN_MEMORY", False)
    monkeypatch.setattr(gw, "current_platform", _Platform())
    monkeypatch.setattr(gw, "ops", _Ops())
    monkeypatch.setattr(torch, "Event", _Event)
    made = []

    def make(kv, bpc):
        w = gw.CPUOffloadingWorker(kv, blocks_per_chunk=bpc, num_cpu_chunks=NC)
        made.append(w)
        return w
    yield make
    for w in made:
        w.shutdown()


# ---- the scenario ---------------------------------------------------------------------

def scenario(rng, bpc, job_id):
    """Store jobs (several in flight at once) over every chunk, then load
    jobs (some expedited) of sub-ranges of what was stored, into other
    blocks. Yields (phase, jobs), jobs [(job_id, (blocks, chunks, sizes,
    starts), expedited)]."""
    free_chunks = list(range(NC))
    rng.shuffle(free_chunks)
    free_blocks = list(range(NB))
    rng.shuffle(free_blocks)
    segments, stores = [], []
    while True:  # stores until the chunks run out
        seg = {}
        for g in rng.sample(range(len(GROUPS)), rng.randint(1, len(GROUPS))):
            start, n = rng.randrange(2 * bpc), rng.randint(1, 2 * bpc + 1)
            need = -(-(start % bpc + n) // bpc)
            if need > len(free_chunks) or n > len(free_blocks):
                continue
            seg[g] = (start, n, [free_chunks.pop() for _ in range(need)], [free_blocks.pop() for _ in range(n)])
        if not seg:
            break
        stores.append((job_id, build(seg), False))
        segments.append(seg)
        job_id += 1
        free_blocks = list(range(NB))  # a block may be stored by several jobs, not twice by one
        rng.shuffle(free_blocks)
    yield "store", stores
    loads, dst = [], list(range(NB))
    rng.shuffle(dst)
    for seg in segments:
        sub = {}
        for g, (start, n, chunks, _) in seg.items():
            a = rng.randrange(start, start + n)  # load [a, b) of [start, start + n)
            b = rng.randint(a + 1, start + n)
            first, last = a // bpc - start // bpc, (b - 1) // bpc - start // bpc
            if b - a > len(dst):
                continue
            sub[g] = (a, b - a, chunks[first:last + 1], [dst.pop() for _ in range(b - a)])
        if sub:
            loads.append((job_id, build(sub), rng.random() < 0.4))
            job_id += 1
    yield "load", loads


def build(seg):
    blocks, chunks, sizes, starts = [], [], [], []
    for g in range(len(GROUPS)):
        start, n, ch, bl = seg.get(g, (0, 0, [], []))
        blocks += bl
        chunks += ch
        sizes.append(n)
        starts.append(start)
    return blocks, chunks, sizes, starts


# ---- tests ------------------------------------------------------------------------------

def test_worker_interface_is_the_one_kvtier_implements():
    assert vw.check_worker_interface() == []
    orig = vw._WORKER_SIGNATURES["submit_load"]
    vw._WORKER_SIGNATURES["submit_load"] = ["self", "job_id", "src_spec", "dst_spec"]
    try:
        assert any("submit_load" in d for d in vw.check_worker_interface())
    finally:
        vw._WORKER_SIGNATURES["submit_load"] = orig


@pytest.mark.parametrize("bpc", [1, 3])
def test_copies_match_the_model_and_vllms_worker(bpc, vllm_worker):
    seed = int(os.environ.get("KVTIER_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    kv, _ = caches(seed)
    vkv, _ = caches(seed, _FakeCuda)
    model = Model(gpu_bytes(kv), bpc)
    ours = KvtierOffloadingWorker(kv, NC, bpc, threads=1)
    theirs = vllm_worker(vkv, bpc)
    assert ours.chunk_bytes == bpc * sum(PAGES)
    phases = [p for r in range(3) for p in scenario(rng, bpc, 1000 * (r + 1))]  # chunks rewritten each round
    try:
        for phase, jobs in phases:
            assert jobs, f"seed {seed}: an empty {phase} phase"
            for job_id, job, fast in jobs:
                gpu, host = specs(job)
                if phase == "store":
                    assert ours.submit_store(job_id, gpu, host) and theirs.submit_store(job_id, *specs(job))
                else:
                    assert ours.submit_load(job_id, host, gpu, expedited=fast)
                    assert theirs.submit_load(job_id, specs(job)[1], specs(job)[0], expedited=fast)
                model.apply(job, phase == "load")
            got = drain(ours, [j for j, _, _ in jobs])
            want = {r.job_id: r for r in theirs.get_finished()}
            for job_id, job, _ in jobs:
                assert got[job_id].success, f"seed {seed}: {phase} job {job_id}"
                assert got[job_id].transfer_size == model.size(job) == want[job_id].transfer_size
                assert got[job_id].transfer_time >= 0
            assert ours.get_finished() == []
            mine, vllm_cpu = host_bytes(ours), theirs._store_handler.dst_tensors
            for t in range(len(PAGES)):
                assert np.array_equal(mine[t], model.host[t]), f"seed {seed}: {phase}: host bytes of tensor {t}"
                assert np.array_equal(vllm_cpu[t].numpy(), model.host[t]), f"seed {seed}: vLLM's host bytes {t}"
            for t, (a, b) in enumerate(zip(gpu_bytes(kv), gpu_bytes(vkv))):
                assert np.array_equal(a, model.gpu[t]), f"seed {seed}: {phase}: GPU bytes of tensor {t}"
                assert np.array_equal(b, model.gpu[t]), f"seed {seed}: {phase}: vLLM's GPU bytes of tensor {t}"
    finally:
        ours.shutdown()


def small(bpc=2, checksum=True):
    kv, backing = caches(7)
    return KvtierOffloadingWorker(kv, NC, bpc, checksum=checksum), kv, backing


def test_wait_get_finished_and_shutdown():
    w, kv, _ = small()
    ids = list(range(1, 9))
    for i in ids:  # chunk i, blocks 2i and 2i+1, group 0
        w.submit_store(i, GPULoadStoreSpec([2 * i, 2 * i + 1], [2, 0, 0], [0, 0, 0]), CPULoadStoreSpec([i]))
    w.wait(set(ids))
    w.wait({12345})  # not in flight: returns
    got = w.get_finished()
    assert sorted(r.job_id for r in got) == ids and all(r.success for r in got)
    assert w.get_finished() == []
    tiers = [w.host] + [getattr(c, n) for c in w._classes for n in ("gpu", "gpu_fast", "host", "xfer")]
    w.submit_load(60, CPULoadStoreSpec([3]), GPULoadStoreSpec([0, 1], [2, 0, 0], [0, 0, 0]))
    w.shutdown()  # lets job 60 finish first
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(60, True)]
    assert all(t.closed for t in tiers)
    w.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        w.submit_store(70, GPULoadStoreSpec([0], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([0]))
    a = gpu_bytes(kv)
    assert np.array_equal(a[0][0], a[0][6]) and np.array_equal(a[2][1, :128], a[2][7, :128])


def spec_with(**fields):
    """A one-block GPU spec with fields set past vLLM's constructor (which would refuse them itself)."""
    g = GPULoadStoreSpec([0], [1, 0, 0], [0, 0, 0])
    for k, v in fields.items():
        setattr(g, k, v)
    return g


def test_malformed_specs_raise_and_queue_nothing():
    w, _, _ = small()
    try:
        bad = [
            (GPULoadStoreSpec([0, 1], [2, 0, 0], [0, 0, 0]), CPULoadStoreSpec([0, 1]), ValueError),  # a chunk too many
            (GPULoadStoreSpec([0, 1, 2], [3, 0, 0], [1, 0, 0]), CPULoadStoreSpec([0]), ValueError),   # one too few
            (GPULoadStoreSpec([NB], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([0]), IndexError),
            (GPULoadStoreSpec([0], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([NC]), IndexError),
            (GPULoadStoreSpec([0], [1, 0], [0, 0]), CPULoadStoreSpec([0]), ValueError),              # 2 of 3 groups
            (GPULoadStoreSpec([0, 1], [2, 0, 0], [0, 0, 0]), CPULoadStoreSpec([0, 0]), ValueError),  # a chunk twice
            (spec_with(block_ids=np.array([0.0])), CPULoadStoreSpec([0]), TypeError),               # float ids
            (spec_with(group_sizes=[1.5, 0, 0]), CPULoadStoreSpec([0]), TypeError),                # a size of 1.5
            (spec_with(block_indices=[-1, 0, 0]), CPULoadStoreSpec([0]), ValueError),              # an index of -1
        ]
        for i, (gpu, host, exc) in enumerate(bad):
            with pytest.raises(exc):
                w.submit_store(i, gpu, host)
        for job_id in ("x", None, True, 2.0):  # vLLM's job ids are ints: another would never be finished
            with pytest.raises(TypeError, match="job id"):
                w.submit_store(job_id, GPULoadStoreSpec([0], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([0]))
        with pytest.raises(TypeError):
            w.submit_load(9, GPULoadStoreSpec([0], [1, 0, 0], [0, 0, 0]), GPULoadStoreSpec([0], [1, 0, 0], [0, 0, 0]))
        w.wait(set(range(10)))
        assert w.get_finished() == []
    finally:
        w.shutdown()
    # vLLM's register_kv_caches gives refs a canonical page mapping; pages keep the direct layout
    # all the same (the spec refuses vLLM's canonical_layout), as vLLM's CPU worker does by default
    kv, _ = caches(1)
    kv.group_data_refs[0][0].mapping = CanonicalPageMapping(96, 96, (), 1, 0, True)
    KvtierOffloadingWorker(kv, NC, 1).shutdown()


def test_a_corrupt_host_page_fails_its_load_and_copies_nothing():
    w, kv, _ = small(bpc=2)
    try:
        w.submit_store(1, GPULoadStoreSpec([4, 5, 6, 7], [4, 0, 0], [0, 0, 0]), CPULoadStoreSpec([2, 3]))
        assert drain(w, [1])[1].success
        before = gpu_bytes(kv)
        with w.host.view(3) as v:
            v[w.host_offset(1, 1) + 5] ^= 0x10  # tensor 1, sub-block 1 of chunk 3: block 7's bytes
        w.submit_load(2, CPULoadStoreSpec([2, 3]), GPULoadStoreSpec([20, 21, 22, 23], [4, 0, 0], [0, 0, 0]))
        w.submit_load(3, CPULoadStoreSpec([2]), GPULoadStoreSpec([30, 31], [2, 0, 0], [0, 0, 0]), expedited=True)
        got = drain(w, [2, 3])
        assert not got[2].success and got[3].success
        after = gpu_bytes(kv)
        for t in range(len(PAGES)):
            assert np.array_equal(after[t][20:24], before[t][20:24]), "a refused load wrote into vLLM's blocks"
        assert np.array_equal(after[0][30:32], before[0][4:6])
    finally:
        w.shutdown()


def test_without_checksums_a_corrupt_page_loads_as_it_is():
    w, kv, _ = small(bpc=1, checksum=False)
    try:
        w.submit_store(1, GPULoadStoreSpec([4], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([2]))
        drain(w, [1])
        with w.host.view(2) as v:
            v[w.host_offset(0, 0)] ^= 1
        w.submit_load(2, CPULoadStoreSpec([2]), GPULoadStoreSpec([9], [1, 0, 0], [0, 0, 0]))
        assert drain(w, [2])[2].success
        a = gpu_bytes(kv)[0]
        assert a[9, 0] == a[4, 0] ^ 1 and np.array_equal(a[9, 1:], a[4, 1:])
    finally:
        w.shutdown()


def test_a_failed_copy_reports_failure():
    """kvtier's transfer engine fails the first copy after the call (KVT_EIO, its fault injection)."""
    from xfer_faults import set_faults
    w, _, _ = small(bpc=1)
    try:
        for c in w._classes:
            set_faults(c.xfer, fail_nth=1)
        w.submit_store(1, GPULoadStoreSpec([1, 2, 3], [2, 0, 1], [0, 0, 0]), CPULoadStoreSpec([0, 1, 2]))
        assert not drain(w, [1])[1].success
        for c in w._classes:
            set_faults(c.xfer)
        w.submit_store(2, GPULoadStoreSpec([1, 2, 3], [2, 0, 1], [0, 0, 0]), CPULoadStoreSpec([0, 1, 2]))
        assert drain(w, [2])[2].success
        # a copy held up 0.3 s: its job stays in flight meanwhile, and its id cannot be reused
        set_faults(w._classes[0].xfer, delay_nth=1, delay_ns=300_000_000)
        w.submit_store(3, GPULoadStoreSpec([5], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([4]))
        with pytest.raises(ValueError, match="already in flight"):
            w.submit_store(3, GPULoadStoreSpec([6], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([5]))
        assert w.get_finished() == []
        w.wait({3})
        assert [(r.job_id, r.success) for r in w.get_finished()] == [(3, True)]
    finally:
        w.shutdown()


def test_the_copy_list_goes_to_c_whole():
    """The worker hands Transfer.submit [n, 2] numpy arrays: converted whole, as the pair list would be."""
    from kvtier.xfer import copies_arg
    a = np.stack([np.arange(50), np.arange(50)[::-1] + 2 ** 32 - 50])
    for arr in (a.T, np.ascontiguousarray(a.T), a.T.astype(np.uint64)):
        got, n = copies_arg(arr)
        want, m = copies_arg(arr.tolist())
        assert n == m == 50
        assert [(c.src_page, c.dst_page) for c in got[:n]] == [(c.src_page, c.dst_page) for c in want[:m]]
    with pytest.raises(ValueError, match=r"copy 1: pages \(2, -1\) out of range"):
        copies_arg(np.array([[0, 1], [2, -1]], np.int32))
    with pytest.raises(ValueError, match="copy 0: pages"):
        copies_arg(np.array([[2 ** 32, 0]]))
    assert copies_arg(np.zeros((0, 2), np.int64))[1] == 0


def test_memory_freed_under_the_worker_fails_the_job():
    """vLLM frees its KV memory (sleep mode resizes storages to 0): the job fails, nothing is copied."""
    w, _, backing = small(bpc=1)
    try:
        backing.untyped_storage().resize_(0)
        w.submit_store(1, GPULoadStoreSpec([1], [1, 0, 0], [0, 0, 0]), CPULoadStoreSpec([0]))
        r = drain(w, [1])[1]
        assert not r.success and r.transfer_size == 96 + 96 + 128
    finally:
        w.shutdown()


def test_bench_worker_runs_every_layout(capsys):
    """The worker benchmark's smallest run: every layout's shape as the
    docstring describes it, the bytes it moves, and blocks that come back as
    they were stored (the bench checks that itself)."""
    import json

    from kvtier import bench_vllm_worker as bench
    assert bench.main(["--mb", "2", "--reps", "1", "--layers", "4", "--block-bytes", "16384"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {r["layout"]: (r["tensors"], r["groups"], r["blocks"], r["bytes"]) for r in out["results"]}
    assert got == {"per_layer": (4, 1, 32, 2 << 20), "kv_split": (8, 1, 32, 2 << 20), "packed": (1, 1, 32, 2 << 20),
                   "groups": (4, 2, 32, 2 << 20)}
    for r in out["results"]:
        assert set(r["ratio"]) == {"store_wall", "store_copy", "load_wall", "load_copy"}
        assert all(v["min"] > 0 for v in r["gbps"].values())


def test_bench_worker_check_fails_a_worker_that_moves_nothing(monkeypatch):
    """The benchmark's own check of the bytes can fail: a worker that reports
    every job done and copies nothing (as fast as can be) is caught."""
    from collections import namedtuple

    from kvtier import bench_vllm_worker as bench
    done = namedtuple("done", "job_id success transfer_size transfer_time")

    class Idle:
        def __init__(self, *args, **kwargs):
            self.jobs = []

        def submit_store(self, job_id, src, dst):
            self.jobs.append(job_id)
            return True
        submit_load = submit_store

        def wait(self, jobs):
            pass

        def get_finished(self):
            out, self.jobs = [done(j, True, 1, 1e-6) for j in self.jobs], []
            return out

        def shutdown(self):
            pass
    monkeypatch.setattr(bench, "KvtierOffloadingWorker", Idle)
    with pytest.raises(RuntimeError, match="differ from those stored"):
        bench.main(["--mb", "2", "--reps", "1", "--layers", "4", "--block-bytes", "16384", "--layouts", "packed"])


def test_write_through_to_a_dir_l3_and_fetch_into_another_worker(dir_store_url):
    """The L3 path of the worker: a store job naming page hashes (KvtierStoreSpec)
    writes its chunks through to the store before it reports; another worker,
    with another host tier, fetches them (KvtierLoadSpec) on its way to its
    GPU blocks, byte for byte; an object that fails its checks fails the load,
    copies nothing and is removed."""
    from kvtier.store import Store
    from kvtier.vllm import KvtierLoadSpec, KvtierStoreSpec

    def opener(tier):
        return Store(dir_store_url, tier=tier, model="test-vllm-worker", page_tokens=32, layers=1,
                     layer_bytes=2 * sum(PAGES), dtype_bytes=1)

    hashes = [bytes([i]) * 16 for i in range(1, 4)]
    kv_a, _ = caches(11)
    a = KvtierOffloadingWorker(kv_a, NC, 2, l3=opener)
    try:
        a.submit_store(1, GPULoadStoreSpec(list(range(6)), [6, 0, 0], [0, 0, 0]), KvtierStoreSpec([5, 6, 7], hashes))
        assert drain(a, [1])[1].success
        assert a.l3_counts == {"pages_fetched": 0, "fetches_failed": 0, "pages_put": 3, "puts_failed": 0}
        sent = gpu_bytes(kv_a)
    finally:
        a.shutdown()
    kv_b, _ = caches(12)
    b = KvtierOffloadingWorker(kv_b, NC, 2, l3=opener)
    try:
        before = gpu_bytes(kv_b)
        b.submit_load(2, KvtierLoadSpec([9, 3], [(0, hashes[0])]),  # chunk 3 never filled
                      GPULoadStoreSpec([20, 21, 24, 25], [4, 0, 0], [0, 0, 0]))
        assert not drain(b, [2])[2].success  # chunk 3 holds no sum of a store: refused whole
        assert [np.array_equal(x, y) for x, y in zip(gpu_bytes(kv_b), before)] == [True] * len(PAGES)
        b.submit_load(3, KvtierLoadSpec([9, 3, 4], [(0, hashes[0]), (1, hashes[1]), (2, hashes[2])]),
                      GPULoadStoreSpec([20, 21, 22, 23, 24, 25], [6, 0, 0], [0, 0, 0]))
        assert drain(b, [3])[3].success
        got = gpu_bytes(kv_b)
        for t, P in enumerate(PAGES):  # group 0's refs move their first s bytes of each block
            s = dict(GROUPS[0]).get(t)
            if s is not None:
                assert np.array_equal(got[t][20:26, :s], sent[t][0:6, :s]), t
        # a corrupt object: the load fails and copies nothing; the object goes
        path = dir_store_url[4:]
        names = [os.path.join(dp, f) for dp, _, fs in os.walk(path) for f in fs]
        victim = max(names, key=os.path.getmtime)
        with open(victim, "r+b") as f:
            f.seek(200)
            f.write(b"garbage")
        before = gpu_bytes(kv_b)
        b.submit_load(4, KvtierLoadSpec([10, 11, 12], [(0, hashes[0]), (1, hashes[1]), (2, hashes[2])]),
                      GPULoadStoreSpec([30, 31, 32, 33, 34, 35], [6, 0, 0], [0, 0, 0]))
        assert not drain(b, [4])[4].success
        assert [np.array_equal(x, y) for x, y in zip(gpu_bytes(kv_b), before)] == [True] * len(PAGES)
        assert b.l3_counts["fetches_failed"] == 1 and b.l3_counts["pages_fetched"] == 4
        b.wait(set())
    finally:
        b.shutdown()
    left = [os.path.join(dp, f) for dp, _, fs in os.walk(path) for f in fs]
    assert victim not in left and len(left) == 2, left


def test_a_failed_fetch_leaves_no_load_from_its_page_and_says_why(dir_store_url, caplog):
    """A host page an L3 get did not fill holds what it held before (another
    key's bytes, under a sum that was right for them): no later load from it
    passes, whatever the scheduler believes (with tensor parallelism another
    rank's fetch of the key may have succeeded). The failed load's message
    names the L3 get, not the checksum that follows from it. A fetch hash
    that is not a page hash is refused at submit."""
    from kvtier.store import Store
    from kvtier.vllm import KvtierLoadSpec, KvtierStoreSpec

    def opener(tier):
        return Store(dir_store_url, tier=tier, model="test-vllm-worker", page_tokens=32, layers=1,
                     layer_bytes=2 * sum(PAGES), dtype_bytes=1)

    kv, _ = caches(21)
    w = KvtierOffloadingWorker(kv, NC, 2, l3=opener)
    try:
        w.submit_store(1, GPULoadStoreSpec([0, 1], [2, 0, 0], [0, 0, 0]), KvtierStoreSpec([5], [b"\x01" * 16]))
        assert drain(w, [1])[1].success
        w.submit_load(2, KvtierLoadSpec([5], []), GPULoadStoreSpec([10, 11], [2, 0, 0], [0, 0, 0]))
        assert drain(w, [2])[2].success  # chunk 5 holds the stored key, its sum right
        with caplog.at_level(logging.WARNING, logger="kvtier.vllm_worker"):
            w.submit_load(3, KvtierLoadSpec([5], [(0, b"\x02" * 16)]),  # never stored: the get misses
                          GPULoadStoreSpec([12, 13], [2, 0, 0], [0, 0, 0]))
            assert not drain(w, [3])[3].success
        said = [r.getMessage() for r in caplog.records if "load job 3" in r.getMessage()]
        assert said and "L3 get" in said[0] and "checksum" not in said[0], said
        w.submit_load(4, KvtierLoadSpec([5], []), GPULoadStoreSpec([14, 15], [2, 0, 0], [0, 0, 0]))
        assert not drain(w, [4])[4].success, "a load from a page the failed get left was served"
        for bad in (b"\x02" * 5, "xyz"):
            with pytest.raises((TypeError, ValueError), match="page hash"):
                w.submit_load(5, KvtierLoadSpec([5], [(0, bad)]), GPULoadStoreSpec([16, 17], [2, 0, 0], [0, 0, 0]))
            with pytest.raises((TypeError, ValueError), match="page hash"):
                w.submit_store(6, GPULoadStoreSpec([0, 1], [2, 0, 0], [0, 0, 0]), KvtierStoreSpec([6], [bad]))
        w.wait(set())
    finally:
        w.shutdown()
