"""kvtier.sglang.KvtierStorage, called the way SGLang's HiCache controller
calls a storage backend, over a dir store and a real Redis server: round
trips, corrupt and foreign objects, outages, threads, re-registration.

The host pools are SGLang 0.5.23's own (MHATokenToKVPoolHost and
MLATokenToKVPoolHost, built on the CPU by sglang_cpu.host_pool). Doubles,
written from SGLang's documented behaviour, stand in only where SGLang's
code cannot serve here: a "scattered" pool whose pages lie in page-table
order (no SGLang pool does that; it forces kvtier's staging path), and a
small controller loop (register, chained SHA-256 keys, batch_exists over
128 keys, batch_set_v1, batch_get_v1) that lets these tests aim at Redis,
faults and threads; SGLang's real HiCacheController drives the backend in
test_sglang_real.py, which also says why device <-> host copies (sgl_kernel,
CUDA/HIP only) are not run. Every check compares against the pool's own
tensors read by plain torch indexing (the model), never against the
backend's output."""
from __future__ import annotations

import hashlib
import importlib
import os
import random
import types
import uuid
from typing import List, Tuple

import pytest
import torch

from kvtier import sglang as ks

BATCH = 128  # SGLang's STORAGE_BATCH_SIZE


# ---- the host pool model (and the scattered double) ------------------------------


class FakeHostPool:
    """A HiCache host pool: `pages` pages of `page_size` tokens, host memory.

    MHA (kind "mha"): kv_buffer shaped by layout, K at [0], V at [1]:
      layer_first        [2, layers, tokens, heads, dim]
      page_first         [2, tokens, layers, heads, dim]
      page_first_direct  [2, pages, layers, page_size, heads, dim]
    MLA (kind "mla"): one latent buffer:
      layer_first        [layers, tokens, 1, dim]
      page_first         [tokens, layers, 1, dim]
      page_first_direct  [pages, layers, page_size, 1, dim]
    get_page_buffer_meta(indices): for each page (every page_size-th index)
    the pointers SGLang documents: MHA layer_first K,V per layer (page_size
    tokens each), MHA page_first* one K and one V block of the whole page,
    MLA layer_first one per layer, MLA page_first one block."""

    def __init__(self, kind: str, layout: str, pages: int = 48, page_size: int = 4, layers: int = 3,
                 heads: int = 2, dim: int = 8, dtype=torch.float16):
        self.kind, self.layout, self.page_size, self.page_num = kind, layout, page_size, pages
        self.size, self.dtype = pages * page_size, dtype
        self.layer_num, self.head_num, self.head_dim = layers, heads, dim
        T, L, H, D, P = self.size, layers, heads, dim, page_size
        dims = {("mha", "layer_first"): (2, L, T, H, D), ("mha", "page_first"): (2, T, L, H, D),
                ("mha", "page_first_direct"): (2, pages, L, P, H, D),
                ("mla", "layer_first"): (L, T, 1, D), ("mla", "page_first"): (T, L, 1, D),
                ("mla", "page_first_direct"): (pages, L, P, 1, D)}[(kind, layout)]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.itemsize = self.kv_buffer.element_size()
        self._free = list(range(pages))

    # SGLang's allocator hands out whole pages, as token indices
    def alloc(self, tokens: int) -> torch.Tensor:
        n = -(-tokens // self.page_size)
        if n > len(self._free):
            return None
        got, self._free = self._free[:n], self._free[n:]
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size) for p in got]).to(torch.int64)

    def free(self, indices: torch.Tensor) -> None:
        self._free += [i // self.page_size for i in indices.tolist()[::self.page_size]]

    def get_page_buffer_meta(self, indices):
        P, L = self.page_size, self.layer_num
        tok = (self.head_num * self.head_dim if self.kind == "mha" else self.head_dim) * self.itemsize
        base = self.kv_buffer.data_ptr()
        half = self.size * L * tok  # bytes of the K half (MHA)
        idx = indices.tolist()
        assert len(idx) % P == 0
        ptrs = []
        for first in idx[::P]:
            if self.layout == "layer_first":
                for layer in range(L):
                    p = base + (layer * self.size + first) * tok
                    ptrs += [p, p + half] if self.kind == "mha" else [p]
                elem = P * tok
            else:  # the page's block starts at its first token's row
                p = base + first * L * tok
                ptrs += [p, p + half] if self.kind == "mha" else [p]
                elem = L * P * tok
        return ptrs, [elem] * len(ptrs)

    # the model: a page's slices by plain indexing
    def _slices(self, first: int):
        P, t = self.page_size, first
        if self.kind == "mla":
            if self.layout == "layer_first":
                return [self.kv_buffer[:, t:t + P]]
            return [self.kv_buffer[t:t + P]] if self.layout == "page_first" else [self.kv_buffer[t // P]]
        if self.layout == "layer_first":
            return [self.kv_buffer[0, :, t:t + P], self.kv_buffer[1, :, t:t + P]]
        if self.layout == "page_first":
            return [self.kv_buffer[0, t:t + P], self.kv_buffer[1, t:t + P]]
        return [self.kv_buffer[0, t // P], self.kv_buffer[1, t // P]]

    def page_content(self, first: int) -> bytes:
        return b"".join(s.contiguous().numpy().tobytes() for s in self._slices(first))

    def fill_page(self, first: int, rng: torch.Generator) -> None:
        for s in self._slices(first):
            s.copy_(torch.randn(s.shape, generator=rng).to(self.dtype))

    def set_page_value(self, first: int, value: float) -> None:
        for s in self._slices(first):
            s.fill_(value)

    # SGLang's generic (flat page) path
    def get_data_page(self, index, flat=True):
        parts = [s.flatten() for s in self._slices(int(index))]
        return torch.cat(parts) if flat else parts

    def get_dummy_flat_data_page(self):
        return torch.zeros(sum(s.numel() for s in self._slices(0)), dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        off = 0
        for s in self._slices(int(index)):
            s.copy_(data_page[off:off + s.numel()].reshape(s.shape))
            off += s.numel()


class ScatteredHostPool(FakeHostPool):
    """MHA page_first, but pages lie in a shuffled order in memory (a page
    table): no stride describes them, so the backend must stage."""

    def __init__(self, **kw):
        super().__init__("mha", "page_first", **kw)
        self.slot = list(range(self.page_num))
        random.Random(7).shuffle(self.slot)
        self.layout = "scattered"

    def _phys(self, first: int) -> int:
        return self.slot[first // self.page_size] * self.page_size + first % self.page_size

    def get_page_buffer_meta(self, indices):
        phys = torch.tensor([self._phys(i) for i in indices.tolist()], dtype=torch.int64)
        self.layout = "page_first"
        try:
            return super().get_page_buffer_meta(phys)
        finally:
            self.layout = "scattered"

    def _slices(self, first: int):
        P, t = self.page_size, self._phys(first)
        return [self.kv_buffer[0, t:t + P], self.kv_buffer[1, t:t + P]]


POOLS = [("mha", "layer_first"), ("mha", "page_first"), ("mha", "page_first_direct"),
         ("mla", "layer_first"), ("mla", "page_first"), ("mla", "page_first_direct"), ("mha", "scattered")]


def make_pool(kind: str, layout: str, pages: int = 48, page_size: int = 4, **kw):
    """SGLang's own host pool (MHATokenToKVPoolHost, MLATokenToKVPoolHost:
    pages + 1 pages, SGLang keeps one more than twice the device's), given
    the double's model methods (page_content, fill_page, set_page_value:
    plain indexing of its kv_buffer, whose shapes are the double's); the
    scattered pool is a double, since no SGLang pool lays pages out that way."""
    if layout == "scattered":
        return ScatteredHostPool(pages=pages, page_size=page_size, **kw)
    import sglang_cpu
    dtype = kw.pop("dtype", torch.float16)
    _, pool = sglang_cpu.host_pool(kind, layout, pages * page_size // 2, page_size, dtype=dtype, **kw)
    pool.kind = kind
    for name in ("_slices", "page_content", "fill_page", "set_page_value"):
        setattr(pool, name, types.MethodType(getattr(FakeHostPool, name), pool))
    return pool


# ---- the controller double -------------------------------------------------------


def page_keys(tokens: List[int], page_size: int, prior: str = None) -> List[str]:
    """SGLang's page keys: chained SHA-256 hex over each full page's tokens."""
    out = []
    for i in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.sha256()
        if prior is not None:
            h.update(bytes.fromhex(prior))
        for t in tokens[i:i + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        out.append(prior)
    return out


class FakeController:
    """What HiCacheController does with a storage backend (v1 interface)."""

    def __init__(self, backend, pool):
        self.backend, self.pool, self.ps = backend, pool, pool.page_size
        backend.register_mem_pool_host(pool)

    def backup(self, keys: List[str], host_indices: torch.Tensor) -> int:
        """Pages stored, batch by batch, stopping at a batch that failed."""
        done = 0
        for i in range(0, len(keys), BATCH):
            batch = keys[i:i + BATCH]
            if not all(self.backend.batch_set_v1(batch, host_indices[i * self.ps:(i + len(batch)) * self.ps])):
                break
            done += len(batch)
        return done

    def query(self, keys: List[str]) -> int:
        """The stored prefix, asked 128 keys at a time."""
        hit = 0
        for i in range(0, len(keys), BATCH):
            batch = keys[i:i + BATCH]
            n = self.backend.batch_exists(batch, None)
            assert isinstance(n, int) and 0 <= n <= len(batch)
            hit += n
            if n < len(batch):
                break
        return hit

    def prefetch(self, keys: List[str]) -> Tuple[int, torch.Tensor]:
        """(pages loaded, their host indices): query, allocate, batch_get_v1."""
        hit = self.query(keys)
        host = self.pool.alloc(hit * self.ps) if hit else torch.empty(0, dtype=torch.int64)
        loaded = 0
        for i in range(0, hit, BATCH):
            batch = keys[i:min(i + BATCH, hit)]
            res = self.backend.batch_get_v1(batch, host[i * self.ps:(i + len(batch)) * self.ps], None)
            assert len(res) == len(batch)
            n = res.index(False) if False in res else len(res)
            loaded += n
            if n < len(batch):
                break
        return loaded, host


# ---- fixtures --------------------------------------------------------------------


@pytest.fixture(params=["dir", "redis"])
def store_url(request, dir_store_url):
    return dir_store_url if request.param == "dir" else request.getfixturevalue("redis_server")


def config(url: str, **over) -> dict:
    """An SGLang HiCacheStorageConfig's fields, extra_config as the dynamic loader sees it."""
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
             "interface_v1": 1, "l3": url, "namespace": f"test-{uuid.uuid4().hex[:12]}"}
    extra.update(over.pop("extra", {}))
    cfg = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
               enable_storage_metrics=False, is_page_first_layout=True, model_name="test/llama-tiny",
               extra_config=extra)
    cfg.update(over)
    return cfg


def stored_pages(pool: FakeHostPool, n: int, seed: int) -> Tuple[List[str], torch.Tensor, List[bytes]]:
    """n pages of random KV in fresh host pages: keys, indices, contents."""
    rng = torch.Generator().manual_seed(seed)
    tokens = [random.Random(seed).randrange(1 << 31) for _ in range(n * pool.page_size)]
    keys = page_keys(tokens, pool.page_size)
    host = pool.alloc(n * pool.page_size)
    for first in host.tolist()[::pool.page_size]:
        pool.fill_page(first, rng)
    return keys, host, [pool.page_content(f) for f in host.tolist()[::pool.page_size]]


def store_file(url: str, hexkey: str) -> str:
    root = url[len("dir:"):].split(",")[0]
    return os.path.join(root, hexkey[0:2], hexkey)


# ---- the controller's round trip ---------------------------------------------------------


@pytest.mark.parametrize("kind,layout", POOLS, ids=[f"{k}-{l}" for k, l in POOLS])
def test_controller_round_trip(store_url, kind, layout):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    pool = make_pool(kind, layout, pages=2 * 150 + 30)
    with ks.KvtierStorage(config(store_url, is_mla_model=kind == "mla"), {}) as backend:
        ctl = FakeController(backend, pool)
        assert backend.zero_copy == (layout != "scattered")
        keys, host, content = stored_pages(pool, 150, seed)  # three batches: 128 + 22
        assert ctl.query(keys) == 0
        assert ctl.backup(keys, host) == 150
        # the chain continues past what was stored: the hit stops there
        more = page_keys(list(range(40 * pool.page_size)), pool.page_size, prior=keys[-1])
        assert ctl.query(keys + more) == 150
        loaded, dst = ctl.prefetch(keys + more)
        assert loaded == 150
        assert set(dst.tolist()).isdisjoint(host.tolist())
        got = [pool.page_content(f) for f in dst.tolist()[::pool.page_size]]
        assert got == content


@pytest.mark.parametrize("kind,layout", POOLS[:6], ids=[f"{k}-{l}" for k, l in POOLS[:6]])
def test_engine_tier_is_the_pool(dir_store_url, kind, layout):
    """The tier's addresses of every page are the pointers the pool reports."""
    pool = make_pool(kind, layout)
    with ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pool}) as backend:
        assert backend.zero_copy and backend.pages == pool.page_num
        for page in range(pool.page_num):
            ptrs, sizes = pool.get_page_buffer_meta(torch.arange(page * pool.page_size, (page + 1) * pool.page_size))
            assert backend.page_addresses(page) == ptrs
        assert backend.page_bytes == sum(sizes) == len(pool.page_content(0))


def test_scattered_pool_stages(dir_store_url):
    pool = make_pool("mha", "scattered")
    with ks.KvtierStorage(config(dir_store_url), {}) as backend:
        backend.register_mem_pool_host(pool)
        assert not backend.zero_copy and "strides" in backend.staging_reason
        with pytest.raises(ValueError, match="no engine tier"):
            backend.page_addresses(0)


def test_unaligned_indices_stage_with_the_same_objects(dir_store_url):
    """A batch not on page boundaries goes through staging and reads the
    objects the zero-copy path wrote (same format, same identity)."""
    pool = make_pool("mha", "page_first", pages=16)
    with ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 3, 11)
        assert backend.batch_set_v1(keys, host) == [True] * 3
        dst = torch.arange(10 * pool.page_size + 1, 13 * pool.page_size + 1)  # one token into page 10
        assert backend.batch_get_v1(keys, dst) == [True] * 3
        got = [pool.page_content(f) for f in dst.tolist()[::pool.page_size]]
        assert got == content
        # and staged puts are read back by the zero-copy path
        keys2 = page_keys(list(range(2 * pool.page_size)), pool.page_size, prior="ab")
        assert backend.batch_set_v1(keys2, dst[:2 * pool.page_size]) == [True, True]
        dst2 = pool.alloc(2 * pool.page_size)
        assert backend.batch_get_v1(keys2, dst2) == [True, True]
        assert pool.page_content(int(dst2[0])) == content[0]


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_unaligned_indices_into_whole_page_layouts_are_refused(dir_store_url, kind):
    """page_first_direct holds whole pages: an index one token into page 10
    wrote a whole page from there (pages 10 and 11 wrong, and True said):
    refused, both pages as they were."""
    pool = make_pool(kind, "page_first_direct", pages=16)
    with ks.KvtierStorage(config(dir_store_url, is_mla_model=kind == "mla"), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 1, 11)
        assert backend.batch_set_v1(keys, host) == [True]
        before = [pool.page_content(p * pool.page_size) for p in (10, 11)]
        dst = torch.arange(10 * pool.page_size + 1, 11 * pool.page_size + 1)
        for call in (backend.batch_get_v1, backend.batch_set_v1):
            with pytest.raises(ValueError, match=r"host_indices\[0\] = 41: not the first token of a page"):
                call(keys, dst)
        assert [pool.page_content(p * pool.page_size) for p in (10, 11)] == before


# ---- batch_exists against a set ---------------------------------------------------------------


def test_batch_exists_counts_the_leading_keys(store_url):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    pool = make_pool("mha", "page_first", pages=40)
    with ks.KvtierStorage(config(store_url), {"mem_pool_host": pool}) as backend:
        universe = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(60)]
        stored = set()
        host = pool.alloc(pool.page_size)
        for round_ in range(20):
            new = [k for k in rng.sample(universe, 3) if k not in stored]
            if new:
                assert backend.batch_set_v1(new, torch.cat([host] * len(new))) == [True] * len(new)
                stored.update(new)
            chain = rng.sample(universe, rng.randrange(1, 30))
            if round_ % 4 == 0:
                chain = sorted(stored)[:5] + chain
            want = next((i for i, k in enumerate(chain) if k not in stored), len(chain))
            assert backend.batch_exists(chain) == want
            assert backend.exists(chain[0]) == (chain[0] in stored)
        assert backend.batch_exists([]) == 0


# ---- integrity ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", [81, -72, -1], ids=["payload", "header", "last-byte"])  # (the header: the last 80 bytes)
def test_corrupted_dir_object_is_a_miss(dir_store_url, where):
    pool = make_pool("mha", "layer_first", pages=8)
    with ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 1, 5)
        assert backend.batch_set_v1(keys, host) == [True]
        path = store_file(dir_store_url, backend.store_key(keys[0]))
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            data[where] ^= 0x40
            f.seek(0)
            f.write(data)
        assert backend.batch_exists(keys) == 1  # present, but never served
        dst = pool.alloc(pool.page_size)
        pool.set_page_value(int(dst[0]), 3.0)
        before = pool.page_content(int(dst[0]))
        assert backend.batch_get_v1(keys, dst) == [False]
        after = pool.page_content(int(dst[0]))
        assert after in (before, bytes(len(before)))  # left as it was, or zeroed; nothing of the object
        assert after != content[0]
        st = backend.stats()["zc-read"]["get"]
        assert st["bad_objects"] == 1 and st["hits"] == 0


def test_truncated_and_foreign_objects_are_misses(dir_store_url):
    pool = make_pool("mla", "page_first", pages=8)
    with ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 2, 6)
        assert backend.batch_set_v1(keys, host) == [True, True]
        a, b = (store_file(dir_store_url, backend.store_key(k)) for k in keys)
        with open(a, "rb") as f:
            obj = f.read()
        with open(b, "wb") as f:  # page 1's file holds page 0's object: another key's
            f.write(obj)
        with open(a, "r+b") as f:
            f.truncate(len(obj) - 1)
        dst = pool.alloc(2 * pool.page_size)
        assert backend.batch_get_v1(keys, dst) == [False, False]


def test_garbage_in_redis_is_a_miss(redis_server, redis_server_handle):
    pool = make_pool("mha", "page_first", pages=8)
    with ks.KvtierStorage(config(redis_server), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 2, 8)
        assert backend.batch_set_v1(keys, host) == [True, True]
        rkey = b"kvt:" + backend.store_key(keys[1]).encode()
        assert redis_server_handle.command(b"SET", rkey, b"KVT3" + bytes(300)).startswith(b"+OK")
        dst = pool.alloc(2 * pool.page_size)
        pool.set_page_value(int(dst[4]), -1.0)
        before = pool.page_content(int(dst[4]))
        assert backend.batch_get_v1(keys, dst) == [True, False]
        assert pool.page_content(int(dst[0])) == content[0]
        assert pool.page_content(int(dst[4])) == before


# ---- identity ------------------------------------------------------------------------------


def test_identity_keeps_models_and_shards_apart(dir_store_url):
    ns = {"namespace": "shared"}
    pool = make_pool("mha", "page_first", pages=8)
    keys, host, content = stored_pages(pool, 1, 9)
    with ks.KvtierStorage(config(dir_store_url, extra=ns, tp_rank=0, tp_size=2), {"mem_pool_host": pool}) as w:
        assert w.batch_set_v1(keys, host) == [True]
    for over, seen in (({"tp_rank": 0, "tp_size": 2}, 1), ({"tp_rank": 1, "tp_size": 2}, 0),
                       ({"tp_rank": 0, "tp_size": 2, "model_name": "other"}, 0), ({"tp_rank": 0, "tp_size": 1}, 0),
                       ({"tp_rank": 0, "tp_size": 2, "extra": {"namespace": "elsewhere"}}, 0),
                       ({"tp_rank": 0, "tp_size": 2, "extra": {"interface_v1": 0, "namespace": "shared"}}, 0)):
        e = dict(ns)
        e.update(over.pop("extra", {}))
        with ks.KvtierStorage(config(dir_store_url, extra=e, **over), {"mem_pool_host": pool}) as r:
            assert r.batch_exists(keys) == seen, over
    # another layout of the same geometry is another identity; so is another dtype of the same size
    # (bf16 bytes read as fp16 are other numbers: only the dtype's name tells the two apart)
    for other in (make_pool("mha", "page_first_direct", pages=8), make_pool("mha", "page_first", pages=8,
                                                                           dtype=torch.bfloat16)):
        with ks.KvtierStorage(config(dir_store_url, extra=ns, tp_rank=0, tp_size=2), {"mem_pool_host": other}) as r:
            assert r.batch_exists(keys) == 0
            assert r.batch_get_v1(keys, other.alloc(other.page_size)) == [False]


def test_mla_ranks_share_objects(store_url):
    pool = make_pool("mla", "layer_first", pages=8)
    keys, host, content = stored_pages(pool, 2, 10)
    ns = {"namespace": f"mla-{uuid.uuid4().hex[:8]}"}
    with ks.KvtierStorage(config(store_url, extra=ns, is_mla_model=True, tp_rank=0, tp_size=4), {}) as w:
        w.register_mem_pool_host(pool)
        assert w.batch_set_v1(keys, host) == [True, True]
    other = make_pool("mla", "layer_first", pages=8)
    with ks.KvtierStorage(config(store_url, extra=ns, is_mla_model=True, tp_rank=3, tp_size=4), {}) as r:
        r.register_mem_pool_host(other)
        dst = other.alloc(2 * other.page_size)
        assert r.batch_get_v1(keys, dst) == [True, True]
        assert [other.page_content(int(dst[0])), other.page_content(int(dst[4]))] == content


# ---- SGLang's generic (tensor) path ---------------------------------------------------------


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_tensor_path(store_url, layout):
    pool = make_pool("mha", layout, pages=12)
    with ks.KvtierStorage(config(store_url, extra={"interface_v1": 0}), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 3, 12)
        ps = pool.page_size
        data = [pool.get_data_page(host[i * ps]) for i in range(3)]
        assert backend.batch_set(keys, data) is True
        assert backend.batch_exists(keys + ["nope"]) == 3 and backend.exists(keys[1])
        got = backend.batch_get(keys + ["nope"], [pool.get_dummy_flat_data_page() for _ in range(4)])
        assert got[3] is None
        dst = pool.alloc(3 * ps)
        for i in range(3):
            pool.set_from_flat_data_page(dst[i * ps], got[i])
        assert [pool.page_content(f) for f in dst.tolist()[::ps]] == content
        one = backend.get(keys[2])  # a new tensor of the pool's dtype
        assert one.dtype == pool.dtype and torch.equal(one, data[2])
        assert backend.set("single", data[0]) and torch.equal(backend.get("single"), data[0])
        assert backend.get("absent") is None


# ---- failures ----------------------------------------------------------------------------


def test_store_down_gives_misses_not_exceptions(redis_factory):
    srv = redis_factory()
    pool = make_pool("mha", "page_first", pages=8)
    cfg = config(srv.url, extra={"timeout_ms": 200, "retries": 1})
    with ks.KvtierStorage(cfg, {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 2, 13)
        assert backend.batch_set_v1(keys, host) == [True, True]
        srv.stop()
        assert backend.batch_exists(keys) == 0
        assert backend.exists(keys[0]) is False
        dst = pool.alloc(2 * pool.page_size)
        pool.set_page_value(int(dst[0]), 2.0)
        before = pool.page_content(int(dst[0]))
        assert backend.batch_get_v1(keys, dst) == [False, False]
        assert pool.page_content(int(dst[0])) == before
        assert backend.batch_set_v1(keys, host) == [False, False]
        assert backend.batch_get(keys[:1]) == [None]
        assert backend.batch_set(keys[:1], [pool.get_data_page(host[0])]) is False
        with pytest.raises(ConnectionError, match="register_mem_pool_host: cannot open the L3 store"):
            backend.register_mem_pool_host(make_pool("mha", "page_first", pages=8))  # as at construction
        assert backend.mem_pool_host is pool


def test_bad_configuration_raises_at_construction(dir_store_url):
    with pytest.raises(ValueError, match='"l3"'):
        ks.KvtierStorage(config(dir_store_url, extra={"l3": None}), {})
    with pytest.raises(ValueError, match="unknown scheme|KVT_EINVAL"):
        ks.KvtierStorage(config("nfs://somewhere"), {})
    with pytest.raises(ValueError, match="HOST:PORT|KVT_EINVAL"):
        ks.KvtierStorage(config("redis://127.0.0.1:notaport"), {})
    with pytest.raises(ConnectionError, match="unreachable|KVT_EIO"):
        ks.KvtierStorage(config("redis://127.0.0.1:1", extra={"timeout_ms": 300}), {})
    with pytest.raises(ValueError, match="model"):
        ks.KvtierStorage(config(dir_store_url, model_name=None), {})
    with pytest.raises(ValueError, match="threads"):
        ks.KvtierStorage(config(dir_store_url, extra={"threads": 0}), {})
    with pytest.raises(ValueError, match="tp rank"):
        ks.KvtierStorage(config(dir_store_url, tp_rank=2, tp_size=2), {})
    with pytest.raises(TypeError, match="extra_config"):
        ks.KvtierStorage({"model_name": "m", "extra_config": "l3=dir:/tmp"}, {})
    with pytest.raises(TypeError, match="kwargs is a list"):
        ks.KvtierStorage(config(dir_store_url), [1])


def test_bad_arguments_raise(dir_store_url):
    pool = make_pool("mha", "page_first", pages=8)
    with ks.KvtierStorage(config(dir_store_url), {}) as backend:
        with pytest.raises(RuntimeError, match="register_mem_pool_host"):
            backend.batch_get_v1(["a"], torch.arange(4))
        with pytest.raises(RuntimeError, match="register_mem_pool_host"):
            backend.batch_set_v1(["a"], torch.arange(4))
        assert backend.batch_exists(["a"]) == 0  # before a pool: the objects of the tensor calls
        with pytest.raises(TypeError, match="HostKVCache"):
            backend.register_mem_pool_host(object())
        backend.register_mem_pool_host(pool)
        ps = pool.page_size
        with pytest.raises(TypeError, match="list of str"):
            backend.batch_exists("abc")
        with pytest.raises(TypeError, match=r"keys\[1\]"):
            backend.batch_exists(["a", 7])
        with pytest.raises(ValueError, match="token indices"):
            backend.batch_set_v1(["a", "b"], torch.arange(ps))
        with pytest.raises(IndexError, match="not a page"):
            backend.batch_get_v1(["a"], torch.arange(pool.size, pool.size + ps))
        with pytest.raises(ValueError, match="overlap"):
            backend.batch_get_v1(["a", "b"], torch.cat([torch.arange(ps)] * 2))
        with pytest.raises(ValueError, match="overlap"):  # unaligned: tokens [1, 1 + ps) and [2, 2 + ps)
            backend.batch_get_v1(["a", "b"], torch.cat([torch.arange(1, 1 + ps), torch.arange(2, 2 + ps)]))
        with pytest.raises(ValueError, match="bytes"):
            backend.set("a", torch.zeros(3))
        with pytest.raises(ValueError, match="contiguous"):
            backend.set("a", pool.get_dummy_flat_data_page().repeat(2)[::2])
        with pytest.raises(ValueError, match="values"):
            backend.batch_set(["a", "b"], [pool.get_dummy_flat_data_page()])
        assert backend.batch_get_v1([], torch.arange(0)) == [] and backend.batch_set_v1([], []) == []
    backend.close()  # twice is fine
    with pytest.raises(RuntimeError):
        backend.batch_exists(["a"])
    with ks.KvtierStorage(config(dir_store_url), {}) as pool_less:  # a tensor whose storage shrank under it
        t = torch.ones(1 << 16, dtype=torch.uint8)
        t.untyped_storage().resize_(16)
        with pytest.raises(ValueError, match="not in its memory"):
            pool_less.set("shrunk", t)  # read 64 KiB past a 16-byte allocation into the store
        with pytest.raises(ValueError, match="not in its memory"):
            pool_less.batch_get(["shrunk"], [t])  # written past it


def test_dynamic_loader_builds_it(dir_store_url):
    """What SGLang's factory does for --hicache-storage-backend dynamic."""
    cfg = config(dir_store_url)
    extra = cfg["extra_config"]
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    assert issubclass(cls, ks.HiCacheStorage)
    backend = cls(cfg, {})  # storage_config, kwargs: positional, as the factory calls it
    try:
        backend.register_mem_pool_host(make_pool("mha", "page_first"))
        assert backend.mem_pool_host is not None and backend.backend == "dir"
        for name in ("get", "set", "exists", "batch_get", "batch_set", "batch_exists",
                     "batch_get_v1", "batch_set_v1", "register_mem_pool_host", "clear", "get_stats"):
            assert callable(getattr(backend, name))
    finally:
        backend.close()


def test_keys_map_to_page_hashes():
    h = ks.key_hash("00ff" * 16)
    assert h == hashlib.blake2b(("00ff" * 16).encode(), digest_size=16).digest() and len(h) == 16
    assert ks.key_hash("a") != ks.key_hash("b")
    with pytest.raises(TypeError):
        ks.key_hash(b"bytes")


def test_controller_threads_at_once(store_url):
    """SGLang's prefetch, prefetch-IO and backup threads call together."""
    import threading
    pool = make_pool("mha", "layer_first", pages=200)
    with ks.KvtierStorage(config(store_url), {"mem_pool_host": pool}) as backend:
        keys, host, content = stored_pages(pool, 40, 21)
        assert backend.batch_set_v1(keys, host) == [True] * 40
        errors = []

        def loop(fn):
            try:
                for _ in range(30):
                    fn()
            except BaseException as e:  # reported below
                errors.append(e)

        def exists():
            assert backend.batch_exists(keys) == 40

        def get():
            dst = pool.alloc(8 * pool.page_size)
            try:
                assert backend.batch_get_v1(keys[:8], dst) == [True] * 8
                assert [pool.page_content(f) for f in dst.tolist()[::pool.page_size]] == content[:8]
            finally:
                pool.free(dst)

        def put():
            assert all(backend.batch_set_v1(keys[8:], host[8 * pool.page_size:]))

        threads = [threading.Thread(target=loop, args=(f,)) for f in (exists, get, put, get)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def test_subclasses_sglang_when_importable(tmp_path):
    """With sglang importable, the class is a subclass of SGLang's own
    HiCacheStorage (the factory checks it). A stand-in module, in a child."""
    import subprocess
    import sys
    import textwrap
    mod = tmp_path / "sglang" / "srt" / "mem_cache"
    mod.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", mod):
        (d / "__init__.py").write_text("")
    (mod / "hicache_storage.py").write_text(textwrap.dedent("""
        from abc import ABC, abstractmethod
        class HiCacheStorage(ABC):
            def register_mem_pool_host(self, mem_pool_host):
                self.mem_pool_host = mem_pool_host
            @abstractmethod
            def get(self, key, target_location=None, target_sizes=None): ...
            @abstractmethod
            def exists(self, key): ...
    """))
    code = ("import kvtier.sglang as k, sglang.srt.mem_cache.hicache_storage as h; "
            "assert k.HAVE_SGLANG and issubclass(k.KvtierStorage, h.HiCacheStorage); print('ok')")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(ks.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), pkg]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


# ---- re-registration and configuration ------------------------------------------------


def test_re_registering_the_pool_while_threads_do_io(dir_store_url):
    """register_mem_pool_host again (a new pool of the same geometry, then the
    old one, 30 times) while three threads back up, load and query: every
    call completes on one pool or the other, none fails, and the final pool
    round-trips byte for byte."""
    import threading
    pools = [make_pool("mha", "page_first", pages=32) for _ in range(2)]
    keys, host, content = stored_pages(pools[0], 6, 31)
    assert stored_pages(pools[1], 6, 31)[0] == keys  # the same pages in both pools
    dst = pools[0].alloc(2 * pools[0].page_size)
    assert torch.equal(pools[1].alloc(2 * pools[1].page_size), dst)
    with ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pools[0]}) as backend:
        assert backend.batch_set_v1(keys, host) == [True] * 6
        stop, errors, calls = threading.Event(), [], [0]

        def loop(fn):
            while not stop.is_set():
                try:
                    fn()
                    calls[0] += 1
                except BaseException as e:  # reported below
                    errors.append(e)
                    return

        def put():
            assert backend.batch_set_v1(keys, host) == [True] * 6

        def get():
            assert backend.batch_get_v1(keys[:2], dst) == [True, True]

        def exists():
            assert backend.batch_exists(keys) == 6

        threads = [threading.Thread(target=loop, args=(f,)) for f in (put, get, exists)]
        for t in threads:
            t.start()
        try:
            for i in range(30):
                backend.register_mem_pool_host(pools[(i + 1) % 2])
                assert backend.mem_pool_host is pools[(i + 1) % 2] and backend.zero_copy
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert errors == [], errors[:3]
        assert calls[0] > 0
        final = pools[0]  # the 30th registration (i = 29) put pool 0 back
        assert backend.mem_pool_host is final
        new = final.alloc(6 * final.page_size)
        assert backend.batch_get_v1(keys, new) == [True] * 6
        assert [final.page_content(f) for f in new.tolist()[::final.page_size]] == content


def test_boolean_options_are_parsed_strictly(dir_store_url):
    def v1(value):
        with ks.KvtierStorage(config(dir_store_url, extra={"interface_v1": value}), {}) as b:
            return b.interface_v1

    for yes in (True, 1, "true", "Yes", "ON", "1"):
        assert v1(yes) is True, yes
    for no in (False, 0, None):
        assert v1(no) is False, no
    for bad in ("false", "0", "Off", "no"):  # SGLang reads bool(value): a string is on, whatever it says
        with pytest.raises(ValueError, match=r"interface_v1.*SGLang reads it as bool\(\)"):
            v1(bad)
    for bad in ("maybe", "", 2, 0.5):
        with pytest.raises(ValueError, match=r"interface_v1' = .*expected true/false"):
            v1(bad)
    with ks.KvtierStorage(config(dir_store_url, is_mla_model="False"), {}) as b:
        assert b.is_mla is False
    with pytest.raises(ValueError, match=r"is_mla_model = 'sure'"):
        ks.KvtierStorage(config(dir_store_url, is_mla_model="sure"), {})


def test_unknown_extra_config_keys_are_named_in_a_warning(dir_store_url, caplog):
    import logging
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        ks.KvtierStorage(config(dir_store_url, extra={"thread": 4, "prefetch_threshold": 256,
                                                      "tp_lcm_size": 8}), {}).close()
    warned = [r.getMessage() for r in caplog.records if r.name == "kvtier.sglang"]
    assert len(warned) == 1 and "'thread'" in warned[0] and "threads" in warned[0], warned  # SGLang's keys pass


def test_every_bad_value_names_its_field(dir_store_url):
    cases = [(dict(tp_rank="x"), ValueError, r"tp_rank = 'x'"),
             (dict(tp_size=[2]), TypeError, r"tp_size = \[2\]"),
             (dict(attn_cp_rank=-1), ValueError, r"attn_cp rank -1 of 1"),
             (dict(pp_size=0), ValueError, r"pp rank 0 of 0"),
             (dict(model_name=5), TypeError, r"model_name"),
             (dict(extra={"namespace": 5}), ValueError, r"'namespace' = 5"),
             (dict(extra={"namespace": "a\x00b"}), ValueError, r"'namespace'"),
             (dict(extra={"l3": dir_store_url + "\x00x"}), ValueError, r'"l3"'),
             (dict(extra={"model": "m\x00"}), ValueError, r"'model'"),
             (dict(extra={"retries": "8"}), ValueError, r"'retries' = '8'"),
             (dict(extra={"threads": True}), ValueError, r"'threads' = True")]
    for over, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            ks.KvtierStorage(config(dir_store_url, **over), {})


def test_a_closed_backend_says_it_is_closed(dir_store_url):
    pool = make_pool("mha", "page_first", pages=8)
    backend = ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pool})
    backend.close()
    for call in (lambda: backend.batch_exists(["a"]), lambda: backend.batch_get_v1(["a"], torch.arange(4)),
                 lambda: backend.set("a", torch.zeros(8)), lambda: backend.register_mem_pool_host(pool)):
        with pytest.raises(RuntimeError, match="KvtierStorage is closed"):
            call()


def test_a_hybrid_models_other_pools_and_clear_are_refused(dir_store_url):
    """SGLang's hybrid controller registers every host pool of its group
    through register_mem_host_pool_v2: the KV pool is taken, another (a
    Mamba, SWA or indexer pool) refused with a message, so that SGLang's
    attach fails instead of every v2 call raising NotImplementedError later.
    clear() raises (SGLang's clear then reports a failure): the store is
    shared, and it still holds every page after a clear that said nothing."""
    pool, other = make_pool("mha", "page_first", pages=8), make_pool("mha", "page_first", pages=8)
    with ks.KvtierStorage(config(dir_store_url), {}) as backend:
        with pytest.raises(ValueError, match="not the KV pool"):
            backend.register_mem_host_pool_v2(pool, "kv")  # nothing registered yet
        backend.register_mem_pool_host(pool)
        backend.register_mem_host_pool_v2(pool, "kv")
        with pytest.raises(ValueError, match=r"host pool 'mamba' .*not the KV pool .*Mamba, SWA, indexer"):
            backend.register_mem_host_pool_v2(other, "mamba")
        keys, host, _ = stored_pages(pool, 2, 5)
        assert backend.batch_set_v1(keys, host) == [True, True]
        with pytest.raises(RuntimeError, match="shared by every instance"):
            backend.clear()
        assert backend.batch_exists(keys) == 2


def test_a_pool_with_fewer_pages_than_its_size_is_refused_at_registration(dir_store_url):
    pool = make_pool("mha", "page_first", pages=16)
    pages = pool.size // pool.page_size
    pool.page_num = 8  # size says `pages` pages
    with ks.KvtierStorage(config(dir_store_url), {}) as backend:
        with pytest.raises(ValueError, match=rf"page_num 8 .*size {pool.size} // page_size 4 = {pages}"):
            backend.register_mem_pool_host(pool)
        with pytest.raises(RuntimeError, match="register_mem_pool_host first"):
            backend.batch_get_v1(["a"], torch.arange(4))  # nothing registered
        good = make_pool("mha", "page_first", pages=16)
        backend.register_mem_pool_host(good)
        with pytest.raises(ValueError, match="page_num"):
            backend.register_mem_pool_host(pool)
        assert backend.mem_pool_host is good  # a failed registration changes nothing
        keys, host, content = stored_pages(good, 2, 3)
        assert backend.batch_set_v1(keys, host) == [True, True]


def test_the_pools_addresses_are_checked_against_its_tensors(dir_store_url):
    """Every address the pool gives lies in its host tensors, which stay
    alive while registered: a pool that claims more pages than its buffer
    holds, gives an address outside it, or lets go of its buffer is refused,
    never read or written through (heap overflow, use after free, SIGSEGV)."""
    with ks.KvtierStorage(config(dir_store_url), {}) as backend:
        big = FakeHostPool("mha", "page_first", pages=8)
        big.size, big.page_num = 2 * big.size, 16  # says 16 pages, holds 8
        with pytest.raises(ValueError, match="not all in its host tensors"):
            backend.register_mem_pool_host(big)
        with pytest.raises(ValueError, match="holds no host tensor"):
            backend.register_mem_pool_host(types.SimpleNamespace(
                page_size=4, size=32, dtype=torch.float16, get_page_buffer_meta=big.get_page_buffer_meta))
        assert backend.mem_pool_host is None  # refusals change nothing

        wild = ScatteredHostPool(pages=8)  # staging: the addresses are asked per call
        backend.register_mem_pool_host(wild)
        keys, host, _ = stored_pages(wild, 2, 3)
        assert backend.batch_set_v1(keys, host) == [True, True]
        real = wild.get_page_buffer_meta
        for bad in ((1 << 64) - 1, wild.kv_buffer.data_ptr() + wild.kv_buffer.nbytes - 8):
            wild.get_page_buffer_meta = lambda idx, bad=bad: ([bad] + real(idx)[0][1:], real(idx)[1])
            with pytest.raises(ValueError, match="not in the pool's host tensors"):
                backend.batch_get_v1(keys, host)
            with pytest.raises(ValueError, match="not in the pool's host tensors"):
                backend.batch_set_v1(keys, host)
        del wild.get_page_buffer_meta
        assert backend.batch_get_v1(keys, host) == [True, True]

        for pool in (make_pool("mha", "page_first", pages=8), ScatteredHostPool(pages=8)):
            backend.register_mem_pool_host(pool)
            keys, host, _ = stored_pages(pool, 2, 3)
            assert backend.batch_set_v1(keys, host) == [True, True]
            pool.kv_buffer = None  # HostKVCache.destroy(): its memory would be freed under the engine tier
            with pytest.raises(RuntimeError, match="kv_buffer was replaced or destroyed"):
                backend.batch_get_v1(keys, host)
            with pytest.raises(RuntimeError, match="kv_buffer was replaced or destroyed"):
                backend.batch_set_v1(keys, host)

        shrunk = ScatteredHostPool(pages=8)  # no numpy view of it yet: its storage can still be resized
        backend.register_mem_pool_host(shrunk)
        host = shrunk.alloc(2 * shrunk.page_size)
        shrunk.kv_buffer.untyped_storage().resize_(0)
        with pytest.raises(ValueError, match="resized or freed"):
            backend.batch_set_v1(keys, host)


def test_a_staged_batch_with_a_bad_page_in_a_later_chunk_stores_nothing(dir_store_url, monkeypatch):
    """A batch larger than the staging tier runs in chunks: a page whose
    buffers the pool gives outside its tensors, in the last chunk, is
    refused before the first chunk is put (the chunks before it were
    stored, then the call raised)."""
    from kvtier import _sglang_pool
    monkeypatch.setattr(_sglang_pool, "STORAGE_BATCH_SIZE", 2)  # a staging tier of 2 pages: 3 chunks of 5
    with ks.KvtierStorage(config(dir_store_url), {}) as backend:
        pool = ScatteredHostPool(pages=8)
        backend.register_mem_pool_host(pool)
        keys, host, _ = stored_pages(pool, 5, 11)
        real, bad_page = pool.get_page_buffer_meta, host[4 * pool.page_size].item()
        pool.get_page_buffer_meta = lambda idx: (
            ([(1 << 64) - 1] + real(idx)[0][1:], real(idx)[1]) if idx[0].item() == bad_page else real(idx))
        with pytest.raises(ValueError, match="not in the pool's host tensors"):
            backend.batch_set_v1(keys, host)
        assert backend.batch_exists(keys) == 0, "a refused batch stored pages"
        del pool.get_page_buffer_meta
        assert backend.batch_set_v1(keys, host) == [True] * 5
        assert backend.batch_exists(keys) == 5


def test_a_pool_calling_back_into_the_backend_is_refused_not_deadlocked(dir_store_url):
    """A pool whose get_page_buffer_meta closes or re-registers the backend
    would wait for its own call to end: refused."""
    import threading
    pool = ScatteredHostPool(pages=8)
    backend = ks.KvtierStorage(config(dir_store_url), {"mem_pool_host": pool})
    keys, host, _ = stored_pages(pool, 2, 3)
    assert backend.batch_set_v1(keys, host) == [True, True]
    real, seen = pool.get_page_buffer_meta, []

    def calls_back(idx, then, meta=real):
        try:
            then()
        except RuntimeError as e:
            seen.append(str(e))
        return meta(idx)

    def run():
        for then in (backend.close, lambda: backend.register_mem_pool_host(ScatteredHostPool(pages=8))):
            pool.get_page_buffer_meta = lambda idx, then=then: calls_back(idx, then)
            assert backend.batch_get_v1(keys, host) == [True, True]
        del pool.get_page_buffer_meta
        registering = ScatteredHostPool(pages=8)  # during registration too
        registering.get_page_buffer_meta = lambda idx: calls_back(
            idx, backend.close, types.MethodType(ScatteredHostPool.get_page_buffer_meta, registering))
        backend.register_mem_pool_host(registering)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a call back into the backend deadlocked"
    assert len(seen) >= 3 and all("inside another KvtierStorage call" in m for m in seen), seen
    assert backend.mem_pool_host is not None and backend.batch_get_v1(keys, host) == [True, True]
    backend.close()
