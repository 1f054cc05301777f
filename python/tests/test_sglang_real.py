"""kvtier.sglang.KvtierStorage driven by SGLang 0.5.23's own code on CPU,
with SGLang's own file backend (HiCacheFile) beside it as the oracle.

SGLang's classes, imported and run, none copied: the HiCacheStorage ABC
(KvtierStorage subclasses it), the device pools MHATokenToKVPool and
MLATokenToKVPool on the CPU, the host pools MHATokenToKVPoolHost and
MLATokenToKVPoolHost over unpinned memory in the layouts layer_first,
page_first and page_first_direct, StorageBackendFactory's "dynamic" loader
fed by the extra config SGLang parses from --hicache-storage-backend-extra-config,
and HiCacheController's storage path: its backup thread (batch_set_v1, or
batch_set on the generic path), its prefetch thread (batch_exists over
SGLang's chained page keys, HiCacheStorageExtraInfo with prefix keys) and
its prefetch-IO thread (batch_get_v1 / batch_get), on a one-rank gloo group.
Every check runs the same operations through HiCacheFile and compares
pages byte for byte and counts.

What SGLang's real code cannot do here: moving pages between the device
pool and the host pool imports sgl_kernel (CUDA/HIP only), so the tests fill
host pages directly and drive only host pool <-> storage; test_sglang.py's
doubles stay for the rest of what it checks (a scattered "page table" pool,
corrupt objects, Redis, re-registration under load).

torchvision: see sglang_cpu.py (a stand-in answers SGLang's own imports of it)."""
from __future__ import annotations

import inspect
import os
import tempfile
import threading
import uuid

import pytest
import torch
import torch.distributed as dist
from sglang_cpu import (HiCacheController, HybridCacheController, PagedTokenToKVPoolAllocator, StorageBackendFactory,
                        get_parallel, get_storage_hash_str, host_pool, hs)

from kvtier import sglang as ks

PS = 4  # tokens per page
LAYOUTS = ("layer_first", "page_first", "page_first_direct")
DTYPE = torch.bfloat16
# the doc's own extra config (docs/sglang.md), its store a dir per test
DOC_EXTRA = ('{"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage", '
             '"interface_v1": 1, "l3": "%s"}')


@pytest.fixture(scope="module", autouse=True)
def one_rank_gloo():
    """The one-rank gloo group the controller's tp_group is (its storage sync groups are built only past one rank)."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    fd, path = tempfile.mkstemp(prefix="kvtier-gloo-")
    os.close(fd)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
    os.unlink(path)


@pytest.fixture
def store_dir(tmp_path):
    d = tmp_path / "kvtier"
    d.mkdir()
    return str(d)


def config(extra, model="test/model", tp=(0, 1), cp=(0, 1), pp=(0, 1), mla=False, dcp=(0, 1), page=None):
    return hs.HiCacheStorageConfig(tp_rank=tp[0], tp_size=tp[1], pp_rank=pp[0], pp_size=pp[1],
                                   attn_cp_rank=cp[0], attn_cp_size=cp[1], is_mla_model=mla,
                                   enable_storage_metrics=False, is_page_first_layout=True, model_name=model,
                                   extra_config=dict(extra), dcp_rank=dcp[0], dcp_size=dcp[1],
                                   logical_page_size=page)


def pair(tmp_path, **kw):
    """HiCacheFile and KvtierStorage, each over its own directory, for the same identity."""
    f = tmp_path / f"file-{uuid.uuid4().hex[:8]}"
    d = tmp_path / f"kvt-{uuid.uuid4().hex[:8]}"
    f.mkdir(exist_ok=True)
    d.mkdir(exist_ok=True)
    return (hs.HiCacheFile(config({"file_storage_path": str(f)}, **kw)),
            ks.KvtierStorage(config({"l3": f"dir:{d}"}, **kw)))


def same(a, b):
    return a is not None and b is not None and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                                           b.contiguous().view(-1).view(torch.uint8))


def random_bytes(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size(),),
                         dtype=torch.uint8, generator=g).view(dtype).view(shape)


# ---- the ABC and the loader ---------------------------------------------------------


def test_kvtier_subclasses_sglangs_real_abc():
    assert ks.HAVE_SGLANG and ks.HiCacheStorage is hs.HiCacheStorage
    assert issubclass(ks.KvtierStorage, hs.HiCacheStorage)
    assert not ks.KvtierStorage.__abstractmethods__


def test_dynamic_loader_builds_it_from_the_command_line_config(store_dir):
    """The JSON of --hicache-storage-backend-extra-config, parsed by SGLang, through StorageBackendFactory."""
    extra = HybridCacheController.parse_storage_backend_extra_config(DOC_EXTRA % f"dir:{store_dir}")[0]
    backend = StorageBackendFactory.create_backend("dynamic", config(extra), None)
    try:
        assert type(backend) is ks.KvtierStorage and backend.interface_v1
        assert backend.url == f"dir:{store_dir}"
    finally:
        backend.close()


def test_the_docs_launch_flags_parse_and_load_kvtier(tmp_path):
    """docs/sglang.md's launch command, parsed by SGLang's own ServerArgs
    CLI; its extra config, parsed as the scheduler does, loads kvtier
    through the factory (the store URL pointed at a local dir)."""
    import argparse
    import re
    import shlex

    from sglang.srt.server_args import ServerArgs

    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "sglang.md")).read()
    cmd = next(b for b in re.findall(r"```sh\n(.*?)```", doc, re.S) if "sglang.launch_server" in b)
    argv = shlex.split(cmd.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    extra = HybridCacheController.parse_storage_backend_extra_config(args.hicache_storage_backend_extra_config)[0]
    assert extra["module_path"] == "kvtier.sglang" and extra["class_name"] == "KvtierStorage"
    store = tmp_path / "store"
    store.mkdir()
    extra["l3"] = f"dir:{store}"
    backend = StorageBackendFactory.create_backend("dynamic", config(extra, model=args.served_model_name), None)
    with backend:
        assert type(backend) is ks.KvtierStorage and backend.interface_v1 and backend.model == args.served_model_name


# ---- the generic calls, no host pool: HiCacheFile's behaviour --------------------------


def test_generic_calls_without_a_pool_match_hicachefile(tmp_path):
    f, k = pair(tmp_path)
    checks = 0

    def both(call, *args, cmp=lambda a, b: a == b):
        nonlocal checks
        a, b = getattr(f, call)(*args), getattr(k, call)(*args)
        assert cmp(a, b), (call, a, b)
        checks += 1
        return b

    vals = {f"k{i}": random_bytes((3 + i, 5), (torch.float16, torch.float32, torch.int64)[i % 3], i) for i in range(6)}
    keys = list(vals)
    try:
        both("exists", "k0")
        both("batch_exists", keys)
        assert both("get", "k0", torch.empty_like(vals["k0"])) is None
        assert both("set", "k0", vals["k0"]) is True
        both("exists", "k0")
        both("batch_exists", keys)
        got = both("get", "k0", torch.empty_like(vals["k0"]), cmp=same)
        assert same(got, vals["k0"])
        assert both("batch_set", keys[1:4], [vals[x] for x in keys[1:4]]) is True
        assert both("batch_exists", keys) == 4
        assert both("batch_exists", keys[2:] + keys[:2]) == 2
        res = both("batch_get", keys[:5], [torch.empty_like(vals[x]) for x in keys[:5]],
                   cmp=lambda a, b: [x is None for x in a] == [x is None for x in b]
                   and all(x is None or same(x, y) for x, y in zip(a, b)))
        assert [x is not None for x in res] == [True] * 4 + [False]
        assert all(same(x, vals[y]) for x, y in zip(res[:4], keys))
        # a key overwritten keeps answering; another backend instance (a restart) finds them all
        assert both("set", "k1", vals["k1"]) is True
        assert both("batch_set", keys[4:], [vals[x] for x in keys[4:]]) is True
        assert both("batch_exists", keys, hs.HiCacheStorageExtraInfo(prefix_keys=[])) == 6
        for x in keys:
            both("get", x, torch.empty_like(vals[x]), cmp=same)
        for x in keys + ["missing"]:
            both("exists", x)
        both("batch_get", keys + ["missing"], [torch.empty_like(vals[x]) for x in keys] + [torch.empty(4)],
             cmp=lambda a, b: [x is None for x in a] == [x is None for x in b] == [False] * 6 + [True])
        f2 = hs.HiCacheFile(config({"file_storage_path": f.file_path}))
        k2 = ks.KvtierStorage(config({"l3": k.url}))
        with k2:
            assert f2.batch_exists(keys) == k2.batch_exists(keys) == 6
            assert same(k2.get("k5", torch.empty_like(vals["k5"])), vals["k5"])
            checks += 2
        # kvtier, unlike HiCacheFile, also returns an object with no target: its recorded bytes
        assert same(k.get("k3"), vals["k3"])
        # a key set again with another size answers with its last value, whole, or not at all: a target of
        # the old size is a miss (kvtier served the old bytes, kept under the old size's lane). (HiCacheFile's
        # set skips a key it has, its keys being content hashes: it keeps the first value.)
        small = random_bytes((2, 3), torch.float32, 9)
        assert k.set("k2", small) is True
        assert k.get("k2", torch.empty_like(vals["k2"])) is None
        assert same(k.get("k2", torch.empty_like(small)), small) and same(k.get("k2"), small)
    finally:
        k.close()
    print(f"generic calls: {checks} checks equal to HiCacheFile's")
    assert checks >= 30


def test_generic_calls_without_a_pool_refuse_bad_tensors_and_change_nothing(store_dir):
    with ks.KvtierStorage(config({"l3": f"dir:{store_dir}"})) as k:
        good = torch.arange(8, dtype=torch.int32)
        bad = [(torch.arange(16, dtype=torch.int32)[::2], "contiguous"), (torch.empty(0), "empty"),
               ("not a tensor", "values\\[1\\]")]
        for value, why in bad:
            with pytest.raises((TypeError, ValueError), match=why):
                k.batch_set(["a", "b"], [good, value])
            assert k.batch_exists(["a", "b"]) == 0  # the good one beside it was not stored either
        with pytest.raises(ValueError, match="2 keys and 1 values"):
            k.batch_set(["a", "b"], [good])
        with pytest.raises(TypeError, match="keys"):
            k.set(b"a", good)
        assert k.set("a", good) and k.batch_exists(["a", "b"]) == 1
        with pytest.raises(ValueError, match="contiguous"):
            k.get("a", torch.empty(16, dtype=torch.int32)[::2])
        with pytest.raises(ValueError, match="1 keys and 2 target"):
            k.batch_get(["a"], [torch.empty(8, dtype=torch.int32)] * 2)
        with pytest.raises(RuntimeError, match="register_mem_pool_host"):
            k.batch_get_v1(["a"], torch.arange(4))
        assert same(k.get("a", torch.empty(8, dtype=torch.int32)), good)
    with pytest.raises(RuntimeError, match="closed"):
        k.exists("a")


def test_generic_calls_of_many_sizes_from_threads_at_once(store_dir):
    """More tensor sizes than stay open, from four threads: lanes retire and
    reopen under the callers, and every object still comes back whole."""
    sizes = [8 * (i + 1) for i in range(24)]
    errors = []
    with ks.KvtierStorage(config({"l3": f"dir:{store_dir}"})) as k:
        def worker(t):
            try:
                for rnd in range(3):
                    for i, n in enumerate(sizes[t::2] if t % 2 else sizes):
                        key = f"t{t}-r{rnd}-{n}"
                        v = random_bytes((n,), torch.uint8, hash(key) & 0xffff)
                        assert k.set(key, v), key
                        assert same(k.get(key, torch.empty(n, dtype=torch.uint8)), v), key
                        assert same(k.get(key), v), key
            except BaseException as e:  # reported below, with the thread's name
                errors.append((t, repr(e)))
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors, errors


# ---- identity: what SGLang's own storage-identity tests expect ----------------------------


IDENTITIES = {
    "tp0of2": dict(tp=(0, 2)), "tp1of2": dict(tp=(1, 2)), "tp0of1": dict(),
    "mla-tp0of2": dict(tp=(0, 2), mla=True), "mla-tp1of2": dict(tp=(1, 2), mla=True),
    "cp0of2": dict(cp=(0, 2)), "cp1of2": dict(cp=(1, 2)),
    "mla-cp0of2": dict(cp=(0, 2), mla=True), "mla-cp1of2": dict(cp=(1, 2), mla=True),
    "pp1of2": dict(pp=(1, 2)), "other-model": dict(model="other/model"),
    "mla-dcp0of2-tp0": dict(tp=(0, 4), mla=True, dcp=(0, 2), page=8),
    "mla-dcp0of2-tp2": dict(tp=(2, 4), mla=True, dcp=(0, 2), page=8),
    "mla-dcp1of2-tp1": dict(tp=(1, 4), mla=True, dcp=(1, 2), page=8),
    "mla-dcp0of2-tp0of2": dict(tp=(0, 2), mla=True, dcp=(0, 2), page=8),
    "mla-dcp0of2-page16": dict(tp=(0, 4), mla=True, dcp=(0, 2), page=16),
}


def test_identities_keep_objects_apart_as_hicachefile_does(tmp_path):
    """Every writer identity sets its own key; every reader identity asks for
    every key: who sees whose object must be the same for both backends."""
    fdir, kdir = tmp_path / "file", tmp_path / "kvt"
    fdir.mkdir()
    kdir.mkdir()
    backends = {}
    for name, kw in IDENTITIES.items():
        backends[name] = (hs.HiCacheFile(config({"file_storage_path": str(fdir)}, **kw)),
                          ks.KvtierStorage(config({"l3": f"dir:{kdir}"}, **kw)))
    try:
        value = torch.arange(16, dtype=torch.int32)
        for name, (f, k) in backends.items():
            assert f.set(f"page-{name}", value) and k.set(f"page-{name}", value)
        seen = {"file": set(), "kvtier": set()}
        for reader, (f, k) in backends.items():
            for writer in IDENTITIES:
                if f.exists(f"page-{writer}"):
                    seen["file"].add((reader, writer))
                if k.exists(f"page-{writer}"):
                    seen["kvtier"].add((reader, writer))
        assert seen["kvtier"] == seen["file"], (seen["kvtier"] ^ seen["file"])
        shared = {(r, w) for r, w in seen["file"] if r != w}
        # what the matrix holds, stated: MLA ranks share, TP/CP/DCP shards do not
        assert ("mla-tp1of2", "mla-tp0of2") in shared and ("mla-dcp0of2-tp2", "mla-dcp0of2-tp0") in shared
        assert ("tp1of2", "tp0of2") not in shared and ("mla-cp1of2", "mla-cp0of2") not in shared
        assert ("mla-dcp1of2-tp1", "mla-dcp0of2-tp0") not in shared
        print(f"identity: {len(IDENTITIES) ** 2} reader x writer pairs equal, {len(shared)} shared across identities")
    finally:
        for _, k in backends.values():
            k.close()


def test_dcp_without_mla_is_refused(store_dir):
    with pytest.raises(ValueError, match="dcp"):
        ks.KvtierStorage({"model_name": "m", "dcp_rank": 0, "dcp_size": 2, "tp_size": 2,
                          "logical_page_size": 8, "extra_config": {"l3": f"dir:{store_dir}"}})


# ---- SGLang's host pools ------------------------------------------------------------------


def pools(kind, layout, tokens=256, seed=0):
    """SGLang's device pool on the CPU and its host pool over unpinned memory, pages filled at random."""
    dev, host = host_pool(kind, layout, tokens, PS, dtype=DTYPE)
    host.kv_buffer.copy_(random_bytes(host.kv_buffer.shape, DTYPE, seed))
    return dev, host


def chain(tokens, salt=""):
    return get_storage_hash_str(tokens, None if not salt else salt, page_size=PS)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_host_pool_pages_match_hicachefile(tmp_path, kind, layout):
    """kvtier's batch_set_v1/batch_get_v1 and its flat-page calls against
    HiCacheFile's own page path (get_data_page -> set, get ->
    set_from_flat_data_page): the same pages land in the same host pages."""
    _, src = pools(kind, layout, seed=1)
    _, by_file = pools(kind, layout, seed=2)
    _, by_v1 = pools(kind, layout, seed=2)
    _, by_flat = pools(kind, layout, seed=2)
    f, k = pair(tmp_path, mla=kind == "mla")
    kflat = ks.KvtierStorage(config({"l3": k.url}, mla=kind == "mla"))
    n = 40  # pages; the source pages are every other page, the destination ones shifted
    keys = chain(list(range(n * PS)))
    src_idx = torch.cat([torch.arange(p * PS, (p + 1) * PS) for p in range(0, 2 * n, 2)])
    dst_idx = torch.cat([torch.arange(p * PS, (p + 1) * PS) for p in range(5, 5 + n)])
    stored = n - 7  # the chain's tail is never stored
    try:
        k.register_mem_pool_host(src)
        kflat.register_mem_pool_host(src)
        assert k.zero_copy, k.staging_reason
        # store
        for i in range(stored):
            assert f.set(keys[i], src.get_data_page(src_idx[i * PS].item(), flat=True))
        assert k.batch_set_v1(keys[:stored], src_idx[:stored * PS], hs.HiCacheStorageExtraInfo(prefix_keys=[])) \
            == [True] * stored
        flat = [src.get_data_page(src_idx[i * PS].item(), flat=True) for i in range(stored)]
        assert kflat.batch_set(keys[:stored], flat) is True
        assert f.batch_set([], []) is kflat.batch_set([], []) is True
        # exists: the same leading counts
        for probe in (keys, keys[:stored], keys[3:], keys[stored:]):
            assert f.batch_exists(probe) == k.batch_exists(probe)
        assert k.batch_exists(keys) == stored
        # load into other host pages
        file_hits = []
        for i in range(n):
            page = f.get(keys[i], by_file.get_dummy_flat_data_page())
            file_hits.append(page is not None)
            if page is not None:
                by_file.set_from_flat_data_page(dst_idx[i * PS].item(), page)
        k.register_mem_pool_host(by_v1)
        assert k.batch_get_v1(keys, dst_idx) == file_hits
        kflat.register_mem_pool_host(by_flat)
        got = kflat.batch_get(keys, [by_flat.get_dummy_flat_data_page() for _ in keys])
        assert [g is not None for g in got] == file_hits
        for i, g in enumerate(got):
            if g is not None:
                by_flat.set_from_flat_data_page(dst_idx[i * PS].item(), g)
        assert same(by_v1.kv_buffer, by_file.kv_buffer)
        assert same(by_flat.kv_buffer, by_file.kv_buffer)
        # and the model: each loaded page is its source page, the rest untouched
        for i in range(n):
            want = src if i < stored else pools(kind, layout, seed=2)[1]
            s = src_idx[i * PS].item() if i < stored else dst_idx[i * PS].item()
            assert same(by_v1.get_data_page(dst_idx[i * PS].item(), flat=True), want.get_data_page(s, flat=True))
    finally:
        k.close()
        kflat.close()


# ---- HiCacheController's storage path -------------------------------------------------------


def controller(kind, layout, backend, extra, seed):
    dev, host = pools(kind, layout, tokens=1024, seed=seed)  # host: 512 pages, room for two copies of 140
    alloc = PagedTokenToKVPoolAllocator(dev.size, PS, DTYPE, "cpu", dev, False)
    with get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
        c = HiCacheController(alloc, host, PS, dist.group.WORLD, threading.Event(), write_policy="write_through",
                              storage_backend=backend, model_name="test/model",
                              storage_backend_extra_config=extra)
    return c, host


def spy(c, names):
    """Records each call the controller's threads make to the backend (keys and extra_info)."""
    calls = []
    for name in names:
        real = getattr(c.storage_backend, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            bound = inspect.signature(_real).bind(*args, **kwargs).arguments
            calls.append((_name, list(args[0]), bound.get("extra_info")))
            return _real(*args, **kwargs)
        setattr(c.storage_backend, name, wrapped)
    return calls


def run_storage_path(c, host, tokens, stored_pages):
    """Backup the first stored_pages pages, then prefetch the whole sequence
    into other pages of the pool. The backed-up pages come from the pool's
    allocator, as the controller's own do: taken as the first pages without
    it, the prefetch was handed those same pages and wrote each onto itself,
    so that a get moving no bytes passed."""
    src = host.alloc(stored_pages * PS)
    op = c.write_storage(src, tokens[:stored_pages * PS], hash_value=chain(tokens[:stored_pages * PS]),
                         prefix_keys=[])
    assert c.ack_backup_queue.get(timeout=30).id == op
    pre = c.prefetch("req", tokens, None, prefix_keys=[])
    hit = c.prefetch_hit_queue.get(timeout=30)
    assert hit is pre
    hit.host_indices = host.alloc(hit.storage_hit_count) if hit.storage_hit_count else torch.empty(0)
    if hit.storage_hit_count:
        c.prefetch_buffer.put(hit)
    acks = []
    while hit.storage_hit_count:
        a = c.ack_prefetch_queue.get(timeout=30)
        acks.append(a.completed_tokens)
        if a.completed_req:
            break
    return hit.storage_hit_count, acks, hit.host_indices, src


@pytest.mark.parametrize("kind,layout,v1", [("mha", "page_first", 1), ("mha", "layer_first", 0),
                                             ("mla", "page_first_direct", 1), ("mla", "layer_first", 0)])
def test_controller_storage_path_matches_hicachefile(tmp_path, kind, layout, v1):
    """SGLang's controller with backend "file" and with kvtier loaded by
    "dynamic" from the doc's config: the same hit count, the same acks,
    the same pages prefetched into the host pool."""
    tokens = list(range(1000, 1000 + 150 * PS))  # 150 pages: two storage batches (128 + 22)
    stored = 140
    fdir = tmp_path / "file"
    fdir.mkdir()
    extra = HybridCacheController.parse_storage_backend_extra_config(DOC_EXTRA % f"dir:{tmp_path}")[0]
    extra["interface_v1"] = v1
    cf, hf = controller(kind, layout, "file", {"file_storage_path": str(fdir)}, seed=3)
    ck, hk = controller(kind, layout, "dynamic", extra, seed=3)
    try:
        assert isinstance(ck.storage_backend, ks.KvtierStorage) and ck.storage_backend.mem_pool_host is hk
        assert (ck.page_get_func == ck._page_get_zero_copy) == bool(v1)
        calls = spy(ck, ["batch_exists", "batch_get_v1", "batch_set_v1", "batch_get", "batch_set"])
        rf = run_storage_path(cf, hf, tokens, stored)
        rk = run_storage_path(ck, hk, tokens, stored)
        assert rk[0] == rf[0] == stored * PS
        assert rk[1] == rf[1] and rk[1][-2] == stored * PS
        assert torch.equal(rk[2], rf[2]) and torch.equal(rk[3], rf[3])
        assert not set(rk[2].tolist()) & set(rk[3].tolist()), "the prefetch lands in other pages"
        assert same(hk.kv_buffer, hf.kv_buffer)
        for i in range(stored):  # the model: the prefetched page is the backed-up one
            got, want = (hk.get_data_page(r[i * PS].item(), flat=True) for r in (rk[2], rk[3]))
            assert same(got, want)
        assert not same(hk.get_data_page(rk[2][0].item(), flat=True), hk.get_data_page(rk[2][PS].item(), flat=True))
        keys = chain(tokens)
        exists = [c for c in calls if c[0] == "batch_exists"]
        assert [c[1] for c in exists] == [keys[:128], keys[128:]]
        assert all(isinstance(c[2], hs.HiCacheStorageExtraInfo) for c in exists)
        assert exists[1][2].prefix_keys == keys[:128]
        moved = {"set": "batch_set_v1" if v1 else "batch_set", "get": "batch_get_v1" if v1 else "batch_get"}
        assert sum((c[1] for c in calls if c[0] == moved["set"]), []) == keys[:stored]
        assert sum((c[1] for c in calls if c[0] == moved["get"]), []) == keys[:stored]
        if v1:
            assert all(isinstance(c[2], hs.HiCacheStorageExtraInfo) for c in calls if c[0] in moved.values())
    finally:
        cf.detach_storage_backend()
        ck.detach_storage_backend()
