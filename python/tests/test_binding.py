"""The binding against independent models: a prefix oracle for the cache,
bytes written and read back for tiers, copies and the store, the C command
for replays; and every kind of bad input raising a clear exception."""
import gc
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kvtier
from kvtier import trace as ktrace

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "mooncake_synthetic_trace.jsonl"
KVTIER = os.environ.get("KVTIER_BIN", str(ROOT / "build" / "kvtier"))


def test_version_and_errors():
    assert kvtier.version().count(".") == 2
    assert kvtier.version_number() == int(kvtier.version().split(".")[0]) * 10000 + int(
        kvtier.version().split(".")[1]) * 100 + int(kvtier.version().split(".")[2])
    with pytest.raises(kvtier.InvalidArgument) as e:
        kvtier.Cache(l1_pages=0)
    assert e.value.name == "KVT_EINVAL" and e.value.code == -1 and "invalid argument" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, kvtier.Error)
    assert kvtier.error_class("KVT_ENOSPC") is kvtier.NoSpace
    with pytest.raises(KeyError):
        kvtier.error_class("KVT_NOSUCH")
    with pytest.raises(TypeError, match="a name such as 'KVT_EINVAL', not int"):
        kvtier.error_class(-1)
    with pytest.raises(TypeError, match="unknown option 'l1_page'"):
        kvtier.Cache(l1_page=4)
    with pytest.raises(ValueError, match="choose from lru"):
        kvtier.Cache(policy="random")
    with pytest.raises(ValueError, match=r"l1_pages: -1 is out of range"):
        kvtier.Cache(l1_pages=-1)


def test_every_c_error_has_its_class():
    """The classes are written out in _core.py; the header's list (_fields.ERRORS,
    generated from error.h) and the library's names and messages are the model."""
    from kvtier import _core, _fields
    from kvtier._lib import lib
    want = {code: name for name, code in _fields.ERRORS if code != 0}
    got = {cls.code: cls for cls in _core.ERROR_TYPES}
    assert sorted(got) == sorted(want) and len(_core.ERROR_TYPES) == len(want)
    for code, cls in got.items():
        assert cls.name == "KVT_" + want[code] == lib.kvt_err_name(code).decode()
        assert cls.__doc__ == f"{cls.name}: {lib.kvt_strerror(code).decode()}"
        assert issubclass(cls, kvtier.Error) and getattr(kvtier, cls.__name__) is cls
        e = _core.error(code, "call")
        assert type(e) is cls and e.code == code and e.name == cls.name and str(e).startswith(f"call: {cls.name}: ")
        assert kvtier.error_class(cls.name) is cls and kvtier.error_class(want[code]) is cls
    assert type(_core.error(-99, "call")) is kvtier.Error


def common_pages(a, b, pt):
    n = 0
    while (n + 1) * pt <= min(len(a), len(b)) and a[n * pt:(n + 1) * pt] == b[n * pt:(n + 1) * pt]:
        n += 1
    return n


def test_cache_hits_match_a_prefix_oracle():
    """No eviction (L1 holds everything): a request's hit pages are its
    longest whole-page common prefix with any earlier request."""
    rng = np.random.default_rng(7)
    pt = 4
    prefixes = [list(rng.integers(0, 1000, 40)) for _ in range(5)]
    seen = []
    with kvtier.Cache(l1_pages=4096, l2_pages=0, page_tokens=pt) as c:
        for i in range(200):
            p = prefixes[rng.integers(0, 5)]
            cut = int(rng.integers(0, len(p) + 1))
            toks = [int(x) for x in p[:cut]] + [int(x) for x in rng.integers(0, 1000, int(rng.integers(0, 12)))]
            want = max([common_pages(toks, s, pt) for s in seen] + [0])
            with c.admit(toks) as r:
                assert r.l1_hit_pages == want, i
                assert r.pages == len(toks) // pt
                assert len(r.l1_ids) == r.pages and len(set(r.l1_ids)) == r.pages
            seen.append(toks)
        c.check()
        st = c.stats()
        assert st["requests"] == 200 and st["l2_hit_tokens"] == 0


def test_request_lifecycle_and_use_after_close():
    c = kvtier.Cache(l1_pages=64, l2_pages=128, page_tokens=4)
    r = c.admit(np.arange(20, dtype=np.int32))
    r.commit()
    r.release()
    with pytest.raises(kvtier.InvalidArgument, match="released already"):
        r.release()
    held = c.admit(list(range(8)))
    c.close()  # releases what is still held, then frees
    assert held.released
    for call in (lambda: c.admit([1, 2, 3, 4]), c.stats, c.check, c.sync):
        with pytest.raises(kvtier.ClosedError, match="Cache is closed"):
            call()
    c.close()  # idempotent


def test_abort_takes_back_a_requests_new_pages_and_with_aborts_when_its_block_raises():
    """An aborted request's new pages hold no KV: they leave the cache (the
    next request with the same tokens hits only what the aborted one
    matched). Its with block aborts it when the block raises, releases it
    otherwise; a committed request's abort is a release."""
    toks = np.arange(48, dtype=np.int32)  # 12 pages of 4
    with kvtier.Cache(l1_pages=64, l2_pages=64, page_tokens=4) as c:
        c.admit(toks[:16]).release()
        r = c.admit(toks)
        assert (r.l1_hit_pages, r.new_pages) == (4, 8)
        r.abort()
        assert r.released and c.stats()["aborted_pages"] == 8
        for again in (r.abort, r.release):
            with pytest.raises(kvtier.InvalidArgument, match="released already"):
                again()
        with pytest.raises(RuntimeError, match="the forward pass failed"):
            with c.admit(toks) as r:
                assert r.l1_hit_pages == 4, "the aborted pages were no hit"
                raise RuntimeError("the forward pass failed")
        assert r.released and c.stats()["aborted_pages"] == 16
        with c.admit(toks) as r:
            assert r.l1_hit_pages == 4
        with c.admit(toks) as r:
            assert r.l1_hit_pages == 12, "released: its pages stay"
        r = c.admit(np.arange(100, 148, dtype=np.int32))
        r.commit()
        r.abort()  # committed: released
        with c.admit(np.arange(100, 148, dtype=np.int32)) as r:
            assert r.l1_hit_pages == 12
        assert c.stats()["aborted_pages"] == 16
        c.check()


def test_an_abort_that_another_request_depends_on_is_refused_and_changes_nothing():
    toks = np.arange(32, dtype=np.int32)
    with kvtier.Cache(l1_pages=64, l2_pages=64, page_tokens=4) as c:
        first = c.admit(toks)
        second = c.admit(toks)  # matched the first's pages before it committed
        assert second.l1_hit_pages == 8
        before = (c.stats(), c.tree_stats())
        with pytest.raises(kvtier.Busy, match="abort that one first; this one is still held"):
            first.abort()
        assert not first.released and (c.stats(), c.tree_stats()) == before
        with pytest.raises(RuntimeError, match="the forward pass failed") as raised:
            with first:  # a block that raises aborts: refused, the block's error goes on, saying so
                raise RuntimeError("the forward pass failed")
        assert any("not aborted and is still held" in n for n in raised.value.__notes__)
        assert not first.released and (c.stats(), c.tree_stats()) == before
        second.abort()  # no new pages: released
        first.abort()
        assert c.stats()["aborted_pages"] == 8 and c.tree_stats()["pages"] == 0
        c.check()


def test_a_request_or_prefetch_dropped_while_held_is_let_go_at_the_next_call(tmp_path):
    """Nothing keeps pages locked for good because its request or prefetch
    object was dropped: the cache's next call aborts the request (its KV
    cannot be known to be written) and cancels the prefetch."""
    toks = np.arange(64, dtype=np.int32)  # 16 pages of 4
    with kvtier.Cache(l1_pages=32, l2_pages=0, page_tokens=4, l1_free_room=0) as c:
        c.admit(toks)  # dropped at once, never released
        gc.collect()
        r = c.admit(toks)
        assert (r.l1_hit_pages, r.new_pages) == (0, 16), "the pages were taken back"
        assert c.stats()["l1_free"] == 16
        r.commit()
        del r  # committed, then dropped: released, its pages stay
        gc.collect()
        with c.admit(toks) as r:
            assert r.l1_hit_pages == 16
        assert c.stats()["aborted_pages"] == 16
        # dropped while a later request depends on it: let go once that one is
        first, second = c.admit(np.arange(1000, 1032, dtype=np.int32)), None
        second = c.admit(np.arange(1000, 1036, dtype=np.int32))
        del first
        gc.collect()
        assert c.stats()["aborted_pages"] == 16, "still held: the second request depends on its pages"
        second.abort()
        c.check()  # (a call: the first is let go)
        assert c.stats()["aborted_pages"] == 16 + 1 + 8
        assert c.tree_stats()["pages"] == 16
    url = f"dir:{tmp_path}/l3"
    with kvtier.Tier.host(32, 1, 64) as l2, kvtier.Store(url, tier=l2, model="m", page_tokens=16) as s:
        with kvtier.Cache(l1_pages=32, l2_pages=32, page_tokens=16, l3_write_policy="write_through") as c:
            c.attach_store(s)
            with c.admit(np.arange(256, dtype=np.int32)):
                pass
            c.sync()
        with kvtier.Cache(l1_pages=32, l2_pages=32, page_tokens=16) as c:
            c.attach_store(s)
            p = c.prefetch(np.arange(256, dtype=np.int32))
            assert p.id and c.prefetches == 1
            del p
            gc.collect()
            assert c.prefetches == 0


def test_tokens_are_int32():
    with kvtier.Cache(l1_pages=16, l2_pages=0, page_tokens=4) as c:
        with pytest.raises(TypeError, match="int32"):
            c.admit(np.arange(8, dtype=np.int64))
        with pytest.raises(TypeError, match="int32"):
            c.admit([1, 2, 1 << 40])
        with pytest.raises(ValueError, match="contiguous"):
            c.admit(np.arange(16, dtype=np.int32)[::2])


def test_tokens_are_counted_from_their_memory_not_from_what_a_subclass_says():
    """C reads as many tokens as the count says: a subclass whose __len__ or
    __array_interface__ lies must not make it read past them (it segfaulted
    page_hashes, and admit hashed memory past the array)."""
    import array

    class LyingArray(array.array):
        def __len__(self):
            return 1 << 26

    class LyingNumpy(np.ndarray):
        @property
        def __array_interface__(self):
            return dict(np.asarray(self).__array_interface__, shape=(1 << 26,))

    toks = list(range(64))
    want = kvtier.page_hashes(toks, 16)
    for lying in (LyingArray("i", toks), np.arange(64, dtype=np.int32).view(LyingNumpy)):
        assert kvtier.page_hashes(lying, 16) == want
        with kvtier.Cache(l1_pages=64, l2_pages=0, page_tokens=16) as c:
            r = c.admit(lying)
            assert r.pages == 4, r
            r.release()


def test_page_hashes_are_the_stores_keys(tmp_path):
    toks = list(range(64))
    h = kvtier.page_hashes(toks, 16)
    assert len(h) == 4 and len(set(h)) == 4
    assert kvtier.page_hashes(toks[:40], 16) == h[:2]  # chained: a prefix has the same hashes
    assert kvtier.page_hashes(toks, 16, ns=1)[0] != h[0]


def test_replay_through_the_binding_matches_the_command():
    """The same per-request calls as `kvtier replay`, the same hit counts
    exactly (L1 + L2, and with a modeled L3 and prefetches); the binding's
    cost per request next to the command's."""
    reqs = ktrace.load(str(TRACE), limit=1200)
    for extra, flags in (({}, []),
                         ({"l3_pages": 8000, "prefetch_policy": "timeout"},
                          ["--l3-pages", "8000", "--prefetch-policy", "timeout"])):
        with kvtier.Cache(l1_pages=2048, l2_pages=4096, **extra) as c:
            st = ktrace.replay(c, reqs)
        out = json.loads(subprocess.run([KVTIER, "replay", str(TRACE), "--limit", "1200", "--l1-pages", "2048",
                                         "--l2-pages", "4096", "--json"] + flags,
                                        capture_output=True, check=True, text=True).stdout)
        assert st["tokens"] == out["tokens"]
        for tier in ("l1", "l2", "l3"):
            assert st[f"{tier}_hit_tokens"] == out["hit_tokens"][tier], tier
        assert st["backups"] == out["backups"] and st["loads"] == out["loads"]
        print(f"binding {1e6 * st['wall_s'] / len(reqs):.0f} us/request, "
              f"kvtier replay {1e6 * out['wall_s'] / len(reqs):.0f} us/request")


def test_trace_errors_name_the_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"input_length": 10, "hash_ids": [1]}\n{"input_length": 10}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: missing \"hash_ids\""):
        ktrace.load(str(bad))
    with pytest.raises(kvtier.ParseError, match="no requests"):
        (tmp_path / "empty.jsonl").write_text("\n")
        ktrace.load(tmp_path / "empty.jsonl")
    with pytest.raises(OSError, match="No such file"):
        ktrace.load(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ValueError, match="NUL"):
        ktrace.load("a\0b")
    with pytest.raises(TypeError):
        ktrace.load(7)


def test_block_tokens_match_the_command():
    # splitmix64 of (id << 9 | j), masked to 31 bits: the first value of block 0 is splitmix64(0)
    z = (0x9E3779B97F4A7C15 ^ (0x9E3779B97F4A7C15 >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2**64
    z ^= z >> 31
    assert ktrace.block_tokens([0])[0] == z & 0x7FFFFFFF
    assert len(ktrace.block_tokens([3, 4], 16)) == 32
    # every token of some blocks against the definition written out in numpy
    ids = np.array([0, 1, 511, 512, 77777, 2**31, 2**32 - 1], dtype=np.uint64)
    x = (ids[:, None] << np.uint64(9)) | np.arange(512, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    want = (z & np.uint64(0x7FFFFFFF)).astype(np.int32).reshape(-1)
    assert np.array_equal(ktrace.block_tokens(ids), want)
    r = ktrace.TraceRequest(0, 1000, 0, (int(ids[2]), int(ids[3])))
    assert np.array_equal(ktrace.request_tokens(r), want[1024:2024])  # blocks 2 and 3 of ids, cut to 1000
    assert np.array_equal(ktrace.request_tokens(r._replace(hash_ids=ids[2:4])), want[1024:2024])  # ids as numpy's
    with pytest.raises(ValueError, match="does not fit"):
        ktrace.request_tokens(ktrace.TraceRequest(0, 1025, 0, (1, 2)))
    with pytest.raises(ValueError):
        ktrace.block_tokens([-1])
    for bad in (-1, 2**32):  # wrapped to the tokens of block 2**32 - 1, and of block 0
        with pytest.raises(ValueError, match="hash_ids"):
            ktrace.request_tokens(ktrace.TraceRequest(0, 100, 0, (bad,)))
    with pytest.raises(ValueError, match="input_length"):
        ktrace.request_tokens(ktrace.TraceRequest(0, -1, 0, (1,)))

    class Shrinking:  # an int that says 512 when checked and 1 when asked again
        answers = [512, 1]

        def __index__(self):
            return self.answers.pop(0) if self.answers else 1
    got = ktrace.request_tokens(ktrace.TraceRequest(0, Shrinking(), 0, (1,)))  # the checked length, read once
    assert np.array_equal(got, ktrace.block_tokens([1])[:512])


def test_host_tier_bytes_and_bad_pages():
    with kvtier.Tier.host(8, 2, 64, checksum=True) as t:
        data = bytes(range(128))
        t.write_page(3, data)
        assert t.read_page(3) == data
        assert bytes(t.view(3)) == data
        with pytest.raises(IndexError, match="out of range"):
            t.read_page(8)
        with pytest.raises(ValueError, match="a page is 128"):
            t.write_page(0, b"x")
        assert t.kind == "host" and t.page_bytes == 128
    with pytest.raises(kvtier.ClosedError):
        t.read_page(0)
    with pytest.raises(ValueError, match="layers"):
        kvtier.Tier.host(8, 0, 64)


def test_engine_tier_over_torch_tensors_is_the_tensors():
    torch = pytest.importorskip("torch")
    pages, pt, heads, dim = 6, 4, 2, 8
    k = [torch.randn(pages, pt, heads, dim) for _ in range(3)]
    v = [torch.randn(pages, pt, heads, dim // 2) for _ in range(3)]
    t = kvtier.Tier.from_tensors(k, v, dtype=torch.float32)
    assert (t.pages, t.layers, t.kind) == (pages, 3, "engine")
    assert t.layer_bytes == pt * heads * dim * 4 + pt * heads * (dim // 2) * 4
    want = b"".join(k[l][2].numpy().tobytes() + v[l][2].numpy().tobytes() for l in range(3))
    assert t.read_page(2) == want
    # writes land in the tensors
    new = np.arange(t.page_bytes // 4, dtype=np.float32).tobytes()
    t.write_page(5, new)
    got = b"".join(k[l][5].numpy().tobytes() + v[l][5].numpy().tobytes() for l in range(3))
    assert got == new
    # the tier keeps its tensors alive
    ref = k[0]
    del k, v
    gc.collect()
    assert t.read_page(2)[:16] == ref[2].numpy().tobytes()[:16]
    t.close()


def test_engine_tier_from_a_stacked_array_and_bad_tensors():
    torch = pytest.importorskip("torch")
    kv = np.zeros((2, 10, 16, 8), dtype=np.float16)  # [layers, pages, tokens, dim]: one plane (MLA-like)
    with kvtier.Tier.from_tensors(kv) as t:
        assert (t.pages, t.layers, t.layer_bytes) == (10, 2, 16 * 8 * 2)
        t.write_page(1, bytes(range(256)) * 2)
        assert kv[0, 1].tobytes() == bytes(range(256))
    with pytest.raises(TypeError, match="dtype int64, expected float32"):
        kvtier.Tier.from_tensors([torch.zeros(4, 8, dtype=torch.int64)], dtype=torch.float32)
    with pytest.raises(TypeError, match="layer 1: dtype float16, layer 0 has float32"):
        kvtier.Tier.from_tensors([torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.float16)])
    with pytest.raises(ValueError, match="not contiguous"):
        kvtier.Tier.from_tensors([torch.zeros(4, 8, 8).transpose(1, 2)])
    with pytest.raises(ValueError, match="too small for the geometry"):
        kvtier.Tier.from_tensors([torch.zeros(4, 8)], pages=5)
    with pytest.raises(ValueError, match="plane 1: 1 layers, plane 0 has 2"):
        kvtier.Tier.from_tensors([torch.zeros(4, 8)] * 2, [torch.zeros(4, 8)])
    with pytest.raises(TypeError, match="torch tensor or a numpy array"):
        kvtier.Tier.from_tensors(["nope"])


def test_a_copy_way_is_for_device_memory():
    kv = np.zeros((2, 10, 16, 8), dtype=np.float16)
    with pytest.raises(ValueError, match="copy='kernel' is for device memory"):
        kvtier.Tier.from_tensors(kv, copy="kernel")
    with pytest.raises(ValueError, match="copy='fast': expected one of auto, dma, kernel"):
        kvtier.Tier.from_tensors(kv, copy="fast")
    with kvtier.Tier.from_tensors(kv, copy="auto") as t:  # the default, valid anywhere
        assert t.pages == 10


def test_transfer_copies_bytes_and_catches_corruption():
    with kvtier.Tier.host(16, 2, 256) as a, kvtier.Tier.host(16, 2, 256, checksum=True) as b:
        with kvtier.Transfer([a, b], threads=2) as x:
            for p in range(8):
                a.write_page(p, bytes([p]) * 512)
            r = x.wait(x.submit(0, 1, [(p, 15 - p) for p in range(8)]))
            assert r.ok and r.n == 8
            assert all(b.read_page(15 - p) == bytes([p]) * 512 for p in range(8))
            b.view(15)[0] ^= 1  # corrupt a checksummed page: reading it back is refused
            r = x.wait(x.submit(1, 0, [(15, 9)]))
            assert r.status == "KVT_ECORRUPT" and r.bad_page == 15
            st = x.stats(0, 1)
            assert st["pages"] == 8 and st["bytes"] == 8 * 512
            with pytest.raises(kvtier.InvalidArgument):
                x.submit(0, 1, [(0, 99)])
            # a wait on a batch not in flight says so at once (it waited out its timeout, 60 s)
            t = x.submit(0, 1, [(1, 2)])
            assert x.wait(t, timeout=30).ok
            for gone in (t, t + 1000):  # taken already; never issued
                with pytest.raises(kvtier.InvalidArgument, match=f"ticket {gone} is not a batch in flight"):
                    x.wait(gone, timeout=30)
            t = x.submit(0, 1, [(1, 3)])
            while not x.poll(1.0):  # taken by a poll
                pass
            with pytest.raises(kvtier.InvalidArgument, match="not a batch in flight"):
                x.wait(t, timeout=30)
            with pytest.raises(kvtier.Busy, match="still used by Transfer"):
                a.close()
        with pytest.raises(ValueError, match=r"tiers\[2\]: the tier is already tiers\[0\]"):
            kvtier.Transfer([a, b, a])  # its copies between the two places would overlap themselves


def test_an_engine_tier_over_kept_memory_addresses_only_that_memory():
    """Tier.engine takes addresses; with keep, every byte they reach must be
    in keep's memory (an extent off by a stride would be read and written
    wherever it points: a segfault, or another object's bytes)."""
    import numpy as np
    from kvtier.tier import Plane
    z = np.zeros(4 * 2 * 32, dtype=np.uint8)  # 4 pages x 2 layers x 32 B, layer-first
    a = z.ctypes.data
    with kvtier.Tier.engine([Plane(32, 32, base=a, layer_stride=128)], 4, 2, keep=[z]) as t:
        t.write_page(3, b"\x07" * 64)
        assert z[96:128].tolist() == [7] * 32 and z[224:256].tolist() == [7] * 32
    for plane, why in ((Plane(64, 2 ** 40, base=a), "plane 0 layer 0"),  # the reviewer's: a page stride of 1 TiB
                       (Plane(32, 32, base=a, layer_stride=129), "plane 0 layer 1"),  # one byte past the end
                       (Plane(32, 32, layer_bases=[a, a + 1024]), "plane 0 layer 1"),
                       (Plane(32, 32, base=a - 1, layer_stride=128), "plane 0 layer 0")):
        with pytest.raises(ValueError, match=why + r": bytes .* are not in the memory of keep"):
            kvtier.Tier.engine([plane], 4, 2, keep=[z])
    import torch
    t = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(ValueError, match="plane 0 layer 1: bytes .* are not in the memory of keep"):
        kvtier.Tier.engine([Plane(32, 64, base=t.data_ptr(), layer_stride=33)], 4, 2, keep=[t[:8]])
    # a view keeps its whole storage: the planes may address all of it
    kvtier.Tier.engine([Plane(32, 64, base=t.data_ptr(), layer_stride=32)], 4, 2, keep=[t[:8]]).close()


def test_an_engine_tier_over_raw_addresses_needs_them_mapped_writable():
    """Without keep the addresses cannot be checked against an object, but
    they must be mapped writable in this process (a wild address segfaulted
    at the first copy); memory ctypes owns is taken."""
    import ctypes
    import mmap
    import numpy as np
    from kvtier.tier import Plane
    with pytest.raises(ValueError, match=r"plane 0 layer 0: bytes \[0x1000, 0x1040\) are not mapped writable"):
        kvtier.Tier.engine([Plane(64, 64, base=0x1000, layer_stride=64)], 1, 1)
    ro = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    ro_addr = np.frombuffer(ro, dtype=np.uint8).ctypes.data
    with pytest.raises(ValueError, match="are not mapped writable"):
        kvtier.Tier.engine([Plane(64, 64, base=ro_addr, layer_stride=64)], 1, 1)
    buf = ctypes.create_string_buffer(4096)
    with kvtier.Tier.engine([Plane(64, 64, base=ctypes.addressof(buf), layer_stride=64)], 1, 1) as t:
        t.write_page(0, b"\x05" * 64)
        assert buf.raw[:64] == b"\x05" * 64


def test_cache_with_bytes_loads_back_what_it_backed_up():
    """L1 arena, L2 host tier on a transfer engine: pages evicted from L1 come
    back from L2 with the bytes they had."""
    pt = 4
    with kvtier.Tier.arena(8, 1, 64) as l1, kvtier.Tier.host(64, 1, 64, checksum=True) as l2, \
            kvtier.Transfer([l1, l2]) as x, kvtier.Cache(l1_pages=8, l2_pages=64, page_tokens=pt) as c:
        c.attach(x, l1, l2)
        seqs = [list(range(1000 * i, 1000 * i + 4 * pt)) for i in range(6)]
        for s in seqs:
            with c.admit(s) as r:
                for j, pid in enumerate(r.l1_ids[r.hit_pages:], r.hit_pages):
                    l1.write_page(pid, bytes([(s[0] // 1000 * 16 + j) % 256]) * 64)
        c.sync()
        with c.admit(seqs[0]) as r:  # long evicted from L1: loaded back from L2
            assert r.l2_hit_pages == 4 and r.l1_hit_pages == 0
            for j, pid in enumerate(r.l1_ids):
                assert l1.read_page(pid) == bytes([j]) * 64
        c.check()


def test_store_dir_round_trip_and_bad_objects(tmp_path):
    url = f"dir:{tmp_path}/l3"
    with kvtier.Tier.host(8, 2, 128) as t:
        with kvtier.Store(url, tier=t, model="test-model", page_tokens=16) as s:
            assert s.backend == "dir"
            hs = kvtier.page_hashes(list(range(64)), 16)
            for i in range(4):
                t.write_page(i, bytes([i + 1]) * 256)
            assert s.put_sync([(h, i) for i, h in enumerate(hs)]).count == 4
            r = s.exists_sync(hs[:2] + [(1, 2)] + hs[2:])
            assert r.results == ("ok", "ok", "miss", "ok", "ok") and r.count == 2
            # on the caller's thread, stopping at the first miss: the same leading count
            chain = hs[:2] + [(1, 2)] + hs[2:]
            assert [s.exists_leading(chain[i:]) for i in range(5)] == [2, 1, 0, 2, 1]
            assert s.exists_leading([]) == 0
            r = s.get_sync([(h, 4 + i) for i, h in enumerate(hs)])
            assert r.results == ("ok",) * 4
            assert all(t.read_page(4 + i) == bytes([i + 1]) * 256 for i in range(4))
            # corrupt one object behind the store's back: refused, the page is not left with its bytes
            key = s.key(hs[1])
            f = pathlib.Path(tmp_path, "l3", key[:2], key)
            raw = bytearray(f.read_bytes())
            raw[len(raw) // 3] ^= 0xFF  # a payload byte
            f.write_bytes(bytes(raw))
            t.write_page(7, b"\0" * 256)
            r = s.get_sync([(hs[1], 7)])
            assert r.results == ("bad",)
            assert t.read_page(7) != bytes([2]) * 256
            assert s.stats("get")["bad_objects"] == 1
        with kvtier.Store(url, tier=t, model="other-model", page_tokens=16) as s2:  # another identity
            assert s2.exists_sync(hs).count == 0
    with pytest.raises(kvtier.InvalidArgument, match="scheme"):
        kvtier.Store("ftp://x", model="m", page_tokens=16, layers=1, layer_bytes=64)
    with pytest.raises(kvtier.InvalidArgument, match="model"):
        kvtier.Store(url, model="", page_tokens=16, layers=1, layer_bytes=64)
    # the library cuts a long URL in its message at a byte count, inside a character here
    with pytest.raises(kvtier.InvalidArgument, match="malformed"):
        kvtier.Store(f"dir:{tmp_path}/a" + "\u00e9" * 150 + ",bogus", model="m", page_tokens=16, layers=1, layer_bytes=64)


def test_a_store_log_callback_cannot_close_the_store_under_its_worker(tmp_path):
    """The log runs on a worker thread: a close from it would free the store
    that worker runs on. It is refused, as a call from a hybrid's write is;
    the store works on after it."""
    said, refused = [], []

    def log(msg):
        said.append(msg)
        for call in (lambda: s.close(), lambda: s.exists_sync(hs)):
            try:
                call()
            except kvtier.InvalidArgument as e:
                refused.append(str(e))

    with kvtier.Tier.host(4, 1, 64) as t:
        s = kvtier.Store(f"dir:{tmp_path}", tier=t, model="m", page_tokens=16, threads=1, log=log)
        with s:
            hs = kvtier.page_hashes(list(range(16)), 16)
            key = s.key(hs[0])
            os.makedirs(f"{tmp_path}/{key[:2]}", exist_ok=True)  # (made at the open)
            os.mkfifo(f"{tmp_path}/{key[:2]}/{key}")  # an object the store refuses, saying why
            assert s.get_sync([(hs[0], 0)]).results == ("bad",)
            assert any("FIFO" in m for m in said), said
            assert len(refused) == 2 and all("inside its own callback" in m for m in refused), refused
            assert not s.closed and s.exists_sync(hs).results == ("miss",)  # (not a regular file)


def test_a_store_whose_last_reference_goes_in_its_log_is_closed_off_its_worker(tmp_path):
    """The log holds the store while it runs: dropped by its owner meanwhile,
    the store was finalized on its own worker, whose close joined that very
    thread and freed the store under it (ASan: a use after free)."""
    started = threading.Event()

    def log(msg):
        started.set()
        time.sleep(0.3)

    t = kvtier.Tier.host(64, 1, 64)
    s = kvtier.Store(f"dir:{tmp_path}/l3,max=1", tier=t, model="m", page_tokens=4, threads=1, log=log)
    hs = kvtier.page_hashes(list(range(16)), 4)
    s.put([(h, i) for i, h in enumerate(hs)])  # over max=1: the worker logs
    assert started.wait(10)
    del s
    deadline = time.monotonic() + 10
    while True:  # the store closes (another thread), and its tier with it
        try:
            t.close()
            break
        except kvtier.Busy:
            assert time.monotonic() < deadline, "the store never closed"
            time.sleep(0.05)


def test_a_store_log_cannot_call_the_cache_that_drives_the_store(tmp_path):
    """The cache may be waiting on the very batch whose worker logs, holding
    its lock: a call into it from the log waited for ever. It is refused."""
    got = []

    def log(msg):
        if c is not None and not got:
            try:
                got.append(c.stats()["requests"])
            except kvtier.InvalidArgument as e:
                got.append(str(e))

    c = None
    l1, l2 = kvtier.Tier.host(64, 1, 64), kvtier.Tier.host(256, 1, 64)
    with l1, l2, kvtier.Transfer([l1, l2]) as x:
        with kvtier.Store(f"dir:{tmp_path}/l3,max=1", tier=l2, model="m", page_tokens=4, threads=1, log=log) as s:
            with kvtier.Cache(l1_pages=64, l2_pages=256, page_tokens=4, write_policy="write_through",
                              l3_write_policy="write_through") as cache:
                cache.attach(x, l1, l2)
                cache.attach_store(s)
                c = cache
                for i in range(4):
                    cache.admit(list(range(i * 1000, i * 1000 + 32))).release()
                done = threading.Event()
                threading.Thread(target=lambda: (cache.sync(), done.set()), daemon=True).start()
                assert done.wait(20), "sync waited on a log blocked on the cache"
                c = None
    assert got and "inside its own callback" in got[0], got


def test_tickets_polled_before_their_submit_recorded_them():
    """Another thread's poll may take a completion before the submit that
    queued it has recorded its ticket: the record then matches it, and the
    ticket is not in flight (its result was taken)."""
    from kvtier._core import Tickets
    from kvtier.xfer import XferResult
    tk, none = Tickets(), {}
    tk.taken([XferResult(7, 0, "KVT_OK", 0, 1, 1, 0)])
    assert tk.issued(7) == 7 and not tk.pending(7, none)
    tk.issued(8)
    assert tk.pending(8, none) and not tk.pending(7, none)
    done = {}
    tk.taken([XferResult(8, 0, "KVT_OK", 0, 1, 1, 0)], into=done)  # a wait's poll: kept for its wait
    assert not tk.pending(8, none) and tk.pending(8, done) and done[8].ticket == 8
    assert not tk._early and not tk._out


def test_store_on_a_real_redis(redis_server):
    with kvtier.Tier.host(4, 1, 512) as t, kvtier.Store(redis_server, tier=t, model="m", page_tokens=8) as s:
        hs = kvtier.page_hashes(list(range(32)), 8)
        for i in range(4):
            t.write_page(i, os.urandom(512))
        want = [t.read_page(i) for i in range(4)]
        assert s.put_sync([(h, i) for i, h in enumerate(hs)]).count == 4
        assert s.exists_sync(hs).count == 4
        assert s.exists_leading(hs) == 4  # one round trip on the caller's thread
        assert s.run("get", [(h, 3 - i) for i, h in enumerate(hs)]) == (("ok",) * 4, 4)  # on this thread
        assert [t.read_page(3 - i) for i in range(4)] == want
        assert s.run("exists", hs + kvtier.page_hashes(list(range(200, 208)), 8)) == (("ok",) * 4 + ("miss",), 4)
        with pytest.raises(ValueError, match="expected one of"):
            s.run("fetch", hs)

        class Anything:  # equal to every op: `in` would take it, and each use would read it as another op
            __eq__ = lambda self, other: True  # noqa: E731
            __hash__ = object.__hash__
        with pytest.raises(ValueError, match="expected one of"):
            s.run(Anything(), hs)
        with pytest.raises(kvtier.InvalidArgument):
            s.run("get", [(hs[0], 1), (hs[1], 1)])  # one page twice
        assert s.exists_leading([hs[0], kvtier.page_hashes(list(range(100, 108)), 8)[0], hs[1]]) == 1
        assert s.get_sync([(h, 3 - i) for i, h in enumerate(hs)]).count == 4
        assert [t.read_page(3 - i) for i in range(4)] == want
        assert s.stats("put")["round_trips"] >= 1


def test_unreachable_store_says_so():
    with pytest.raises(kvtier.IOFailure, match="127.0.0.1:1"):
        kvtier.Store("redis://127.0.0.1:1", model="m", page_tokens=16, layers=1, layer_bytes=64, timeout_ms=200)


def test_cache_over_a_store_finds_what_another_cache_put(tmp_path):
    """Two caches (two instances) on one dir store: the second one's L3 hits
    are the first one's pages, counted as foreign."""
    url = f"dir:{tmp_path}/l3"
    toks = np.arange(256, dtype=np.int32)
    got = []
    for _ in range(2):
        with kvtier.Tier.host(32, 1, 64) as l2, \
                kvtier.Store(url, tier=l2, model="m", page_tokens=16) as s, \
                kvtier.Cache(l1_pages=32, l2_pages=32, page_tokens=16, l3_write_policy="write_through",
                             prefetch_policy="wait_complete") as c:
            c.attach_store(s)
            with c.admit(toks, prefetch=c.prefetch(toks)) as r:
                got.append((r.l3_hit_pages, r.l3_foreign_pages))
            c.sync()
    assert got == [(0, 0), (16, 16)]


def test_pd_hand_off_between_threads():
    """One prefill rank hands 12 pages to a decode pool over TCP on loopback."""
    token = 0x1234
    with kvtier.Tier.host(64, 2, 256) as pool, kvtier.Tier.host(16, 2, 256) as src:
        for p in range(12):
            src.write_page(p, bytes([p + 1]) * 512)
        with kvtier.PdReceiver(pool, ranks=1, token=token) as rx:
            err = []

            def prefill():
                try:
                    with kvtier.PdSender(src, 0, 1, token, rx.data_port, rx.control_port) as tx:
                        dst = tx.begin(1, 12)
                        tx.send(1, [(p, dst[p]) for p in range(12)])
                        tx.finish()
                except Exception as e:  # pragma: no cover - reported below
                    err.append(e)

            th = threading.Thread(target=prefill)
            th.start()
            events = []
            while not any(e.type == "complete" for e in events):
                events += rx.poll(timeout=5.0)
                assert events, "no hand-off within 5 s"
            th.join(10)
            assert not err
            done = [e for e in events if e.type == "complete"][0]
            assert [pool.read_page(p) for p in done.pages] == [bytes([j + 1]) * 512 for j in range(12)]
            rx.release(done.handoff)
            st = rx.stats()
            assert st["handoffs"] == 1 and st["pages"] == 12
    with pytest.raises(kvtier.Error):
        with kvtier.Tier.host(4, 1, 64) as s:
            kvtier.PdSender(s, 0, 1, token, 1, 1, welcome_timeout_ms=300)


CP_RANK = r"""
import sys, kvtier
name, rank = sys.argv[1], int(sys.argv[2])
C, L1, L2, PT = 2, 32, 128, 16
g = kvtier.CpGroup(name, rank, C, l1_pages=L1, l2_pages=L2, page_tokens=PT, layers=1, layer_bytes=64, requests=30,
                   timeout_ms=20000)
l1 = g.open_tier("l1", L1, 1, 64)
l2 = g.open_tier("l2", L2, 1, 64, checksum=True)
g.wait_joined()
x = g.transfer([l1, l2])
c = kvtier.Cache(l1_pages=L1, l2_pages=L2, page_tokens=PT, l1_lanes=C, decision_digest=True)
g.attach(c, x, l1, l2)
bad = 0
for i in range(30):
    prefix = (i * 7) % 5
    toks = [prefix * 100000 + t for t in range(6 * PT)] + [1000000 + i * 1000 + t for t in range((i % 3) * PT)]
    r = c.admit(toks)
    g.admitted(r)
    for j, pid in enumerate(r.l1_ids):
        if kvtier.cp.lane_of(pid, C) != rank:
            continue
        page = kvtier.cp.lane_page(pid, C, L1 // C)
        want = bytes([(toks[j * PT] + j) % 251]) * 64
        if j < r.hit_pages:
            bad += l1.read_page(page) != want
        else:
            l1.write_page(page, want)
    g.filled(i)
    r.commit()
    r.release()
    g.step(i, c.digest ^ i)
assert g.check_digests(30) == 0
g.finish(str(bad).encode())
hits = c.stats()["l1_hit_tokens"] + c.stats()["l2_hit_tokens"]
c.close(); x.close(); l1.close(); l2.close()
g.close()
print(bad, hits)
"""


def test_cp_group_of_two_processes(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(CP_RANK)
    name = f"kvtier-pytest-{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    procs = [subprocess.Popen([sys.executable, str(script), name, str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e
    results = [tuple(map(int, o.split())) for o, _ in outs]
    assert all(bad == 0 for bad, _ in results)
    assert results[0][1] == results[1][1] > 0  # the same decisions on both ranks
    assert not list(pathlib.Path("/dev/shm").glob(name + "*"))


def test_a_cp_group_refuses_a_cache_of_other_lanes_and_a_commit_before_its_pages():
    """A cache whose lanes are not the group's ranks would deal the pages
    otherwise (the ranks then read each other's pages wrong): refused. A
    request committed before filled() cannot be backed up: the group stops
    at once, saying so (rank 0 waited out wait_ms on itself)."""
    from array import array
    name = f"kvtier-pytest-early-{os.getpid()}"
    g = kvtier.CpGroup(name, 0, 1, l1_pages=8, l2_pages=16, page_tokens=4, layers=1, layer_bytes=64, requests=4,
                       timeout_ms=1000, wait_ms=60000)
    l1, l2 = g.open_tier("l1", 8, 1, 64), g.open_tier("l2", 16, 1, 64)
    g.wait_joined()
    x = g.transfer([l1, l2])
    for other in (dict(l1_lanes=2), dict(l1_pages=16, l1_lanes=1)):
        with kvtier.Cache(**{"l1_pages": 8, "l2_pages": 16, "page_tokens": 4, **other}) as wrong:
            with pytest.raises(kvtier.InvalidArgument, match="lanes"):
                g.attach(wrong, x, l1, l2)
    c = kvtier.Cache(l1_pages=8, l2_pages=16, page_tokens=4, l1_lanes=1, decision_digest=True)
    g.attach(c, x, l1, l2)
    r = c.admit(list(range(8)))
    g.admitted(r)
    t0 = time.monotonic()
    r.commit()  # before g.filled(0)
    assert time.monotonic() - t0 < 30 and g.info()["stopped"]
    with pytest.raises(kvtier.IOFailure, match="committed before kvt_cp_group_filled"):
        g.step(0, c.digest)
    with pytest.raises(kvtier.IOFailure):
        g.finish(memoryview(array("I", [1, 2])))  # its 8 bytes: the group is stopped, not a wrong length
    r.release()
    for o in (c, x, l1, l2, g):
        o.close()
    assert not list(pathlib.Path("/dev/shm").glob(name + "*"))


def test_a_cp_groups_header_rewritten_after_the_join_does_not_widen_its_tables():
    """The group's L1 and L2 page counts in its shared header are another
    process's to rewrite: attach checks a cache against this rank's own
    config, by which its tables were sized, so a cache of more L2 pages
    than the group's is refused whatever the header says (taken, its
    backups wrote past the rank's tables)."""
    import mmap
    import struct
    name = f"kvtier-pytest-hdr-{os.getpid()}"
    L1, L2, BIG = 8, 12, 64
    g = kvtier.CpGroup(name, 0, 1, l1_pages=L1, l2_pages=L2, page_tokens=4, layers=1, layer_bytes=64, requests=4,
                       timeout_ms=3000, wait_ms=3000)
    opened = []
    try:
        with open(f"/dev/shm/{name}-ctl", "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
            at = next(o for o in range(0, 4096 - 16, 8) if struct.unpack_from("<QQ", m, o) == (L1, L2))
            struct.pack_into("<Q", m, at + 8, BIG)  # another process: l2_pages := 64
        l1, l2 = g.open_tier("l1", L1, 1, 64), g.open_tier("l2", BIG, 1, 64)
        opened += [l1, l2]
        g.wait_joined()
        x = g.transfer([l1, l2])
        opened.insert(0, x)
        with kvtier.Cache(l1_pages=L1, l2_pages=BIG, page_tokens=4, l1_lanes=1) as wide:
            with pytest.raises(kvtier.InvalidArgument, match=f"{BIG} L2 pages for group .* 8 and {L2} pages"):
                g.attach(wide, x, l1, l2)
    finally:
        for o in opened:
            o.close()
        g.close()
    assert not list(pathlib.Path("/dev/shm").glob(name + "*"))


def test_prometheus_collector_reports_the_stats():
    prom = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from kvtier.prometheus import KvtierCollector
    with kvtier.Cache(l1_pages=64, l2_pages=0, page_tokens=4) as c:
        for _ in range(3):
            c.admit(list(range(40))).release()
        reg = prom.CollectorRegistry()
        reg.register(KvtierCollector(cache=c, labels={"instance": "t"}))
        text = prom.generate_latest(reg).decode()
        st = c.stats()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["kvtier_cache_requests"].type == "counter"
    assert fams["kvtier_cache_requests"].samples[0].value == st["requests"] == 3
    assert fams["kvtier_cache_l1_hit_tokens"].samples[0].value == st["l1_hit_tokens"] == 80
    assert fams["kvtier_cache_l1_free"].type == "gauge"
    assert fams["kvtier_cache_requests"].samples[0].labels == {"instance": "t"}
    assert prom.generate_latest(reg) == b""  # a closed cache is skipped, not an error


def test_prometheus_collector_gives_each_transfer_pair_a_sample_of_one_family():
    """Two pairs named every xfer family twice (a TYPE line twice: not valid exposition text)."""
    prom = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from kvtier.prometheus import KvtierCollector
    a, b = kvtier.Tier.host(4, 1, 64), kvtier.Tier.host(4, 1, 64)
    with kvtier.Transfer([a, b]) as x:
        x.wait(x.submit(0, 1, [(0, 0)]))
        x.wait(x.submit(1, 0, [(1, 1), (2, 2)]))
        reg = prom.CollectorRegistry()
        reg.register(KvtierCollector(xfer=x, xfer_pairs=[(0, 1), (1, 0)]))
        text = prom.generate_latest(reg).decode()
        want = {(0, 1): x.stats(0, 1)["pages"], (1, 0): x.stats(1, 0)["pages"]}
        busy = x.stats(1, 0)["busy_ns"]
    types = [ln for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert len(types) == len(set(types))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = {(int(s.labels["src"]), int(s.labels["dst"])): s.value for s in fams["kvtier_xfer_pages"].samples}
    assert got == want == {(0, 1): 1, (1, 0): 2}
    # ns in seconds, named so, as --stats prom writes them (promtool: no abbreviated units in names)
    assert "kvtier_xfer_busy_ns" not in text and busy > 0
    secs = {s.labels["src"]: s.value for s in fams["kvtier_xfer_busy_seconds"].samples}
    assert secs["1"] == pytest.approx(busy / 1e9)
    for bad, exc in ((dict(cache=5), TypeError), (dict(xfer=x, xfer_pairs=[(0,)]), ValueError),
                     (dict(xfer=x, xfer_pairs=[(0, 5)]), ValueError),  # every scrape raised
                     (dict(xfer_pairs=[(0, 1)]), ValueError), (dict(labels={"a": 1}), TypeError),
                     (dict(labels={"": "x"}), ValueError),  # a scrape that no longer parses
                     (dict(labels={"a-b": "x"}), ValueError), (dict(labels={"__name": "x"}), ValueError),
                     (dict(xfer=x, xfer_pairs=[(0, 1)], labels={"src": "x"}), ValueError),  # overwritten
                     (dict(xfer=x, xfer_pairs=[(0, 1), [0, 1]]), ValueError)):  # a series written twice
        with pytest.raises(exc):
            KvtierCollector(**bad)
    a.close(), b.close()


def test_shm_tier_is_shared_by_name():
    name = f"/kvtier-pytest-{os.getpid()}"
    with kvtier.Tier.shm(name, 4, 1, 128) as a:
        with kvtier.Tier.shm(name, 4, 1, 128, attach=True) as b:
            a.write_page(2, bytes(range(128)))
            assert b.read_page(2) == bytes(range(128))  # one segment, two mappings
            assert a.info()["creator"] and not b.info()["creator"]
        with pytest.raises(kvtier.AlreadyExists):
            kvtier.Tier.shm(name, 4, 1, 128)  # a live process's segment is left alone
    with pytest.raises(kvtier.NotFound):
        kvtier.Tier.shm(name, 4, 1, 128, attach=True)  # unlinked by its creator


def test_a_store_error_never_shows_the_redis_password():
    """A Redis URL's password stays out of every error text (the open fails: nothing listens)."""
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(kvtier.Error) as e:
        kvtier.Store(f"redis://alice:s3cr3t-pw@127.0.0.1:{port}", timeout_ms=200, retries=0)
    assert "s3cr3t-pw" not in str(e.value) and "alice" in str(e.value), str(e.value)


def test_a_cp_attached_cache_drives_its_transfer_engine_alone():
    """CpGroup.attach, as Cache.attach: another caller's poll took the cache's
    completions (its sync then waited for ever), and a second cache attached."""
    name = f"kvtier-pytest-drive-{os.getpid()}"
    with kvtier.CpGroup(name, 0, 1, l1_pages=8, l2_pages=16, page_tokens=4, layers=1, layer_bytes=64, requests=8,
                        timeout_ms=3000, wait_ms=3000) as g:
        l1, l2 = g.open_tier("l1", 8, 1, 64), g.open_tier("l2", 16, 1, 64)
        g.wait_joined()
        x = g.transfer([l1, l2])
        c = kvtier.Cache(l1_pages=8, l2_pages=16, page_tokens=4, write_policy="write_through")
        g.attach(c, x, l1, l2)
        with pytest.raises(kvtier.InvalidArgument, match="submits to and polls this Transfer alone"):
            x.poll()
        with kvtier.Cache(l1_pages=8, l2_pages=16, page_tokens=4) as other:
            with pytest.raises(kvtier.InvalidArgument, match="driven already"):
                other.attach(x, l1, l2)
            with kvtier.Transfer([l1, l2]) as y, pytest.raises(kvtier.InvalidArgument, match="another Cache"):
                other.attach(y, l1, l2)  # the CP cache's tiers, on an engine of its own
            r = other.admit(list(range(8)))
            with pytest.raises(kvtier.InvalidArgument, match="not of the cache this group attached"):
                g.admitted(r)
            r.release()
        r = c.admit(list(range(8)))
        ids = r.l1_ids[:]
        del r.l1_ids[1:]  # C would read as many ids as the request has pages
        with pytest.raises(ValueError, match="l1_ids hold 1 ids for its 2 pages"):
            g.admitted(r)
        r.l1_ids = ids
        g.admitted(r)
        g.filled(0)
        r.release()
        c.sync()
        assert c.stats()["backups"] >= 2
        c.close(), x.close(), l1.close(), l2.close()


def test_prometheus_collector_refuses_a_prefix_that_is_no_metric_name():
    pytest.importorskip("prometheus_client")
    from kvtier.prometheus import KvtierCollector
    for bad in (None, 5, "", "9lives", "__reserved", "a-b"):
        with pytest.raises(ValueError, match="prefix: .* \\(expected a metric name"):
            KvtierCollector(prefix=bad)
    assert KvtierCollector(prefix="svc:kv_1").prefix == "svc:kv_1"


def test_prometheus_collector_reports_two_caches_in_one_family_each():
    """Two collectors in one registry wrote every family twice (a second TYPE
    line: prometheus_client's own parser and promtool refuse the page); the
    registry now refuses the second at registration, and ``add`` reports a
    second cache as more samples of the same families."""
    prom = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from kvtier.prometheus import KvtierCollector
    with kvtier.Cache(l1_pages=64, l2_pages=0, page_tokens=4) as a, \
            kvtier.Cache(l1_pages=64, l2_pages=0, page_tokens=4) as b:
        a.admit(list(range(40))).release()
        for _ in range(2):
            b.admit(list(range(8))).release()
        reg = prom.CollectorRegistry()
        col = KvtierCollector(cache=a, labels={"instance": "a", "role": "x"})
        reg.register(col)
        with pytest.raises(ValueError, match="kvtier_cache_requests"):
            reg.register(KvtierCollector(cache=b, labels={"instance": "b"}))
        col.add(cache=b, labels={"role": "x", "instance": "b"})  # the names in another order
        text = prom.generate_latest(reg).decode()
        for bad in ({"instance": "b"}, {"instance": "a", "role": "x"}, {"instance": "c", "role": "x", "z": "1"}):
            with pytest.raises(ValueError, match="KvtierCollector.add labels"):
                col.add(cache=b, labels=bad)
    types = [ln for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert len(types) == len(set(types)), "a family written twice"
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = {s.labels["instance"]: (s.value, s.labels["role"]) for s in fams["kvtier_cache_requests"].samples
           if s.name.endswith("_total")}
    assert got == {"a": (1, "x"), "b": (2, "x")}


def test_prometheus_collector_names_a_store_as_the_command_does(tmp_path):
    """The command writes a store's stats as kvtier_l3_store_<op>_* with its
    usage gauges; the collector wrote kvtier_store_<op>_*, without them."""
    prom = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from kvtier.prometheus import KvtierCollector
    t = kvtier.Tier.host(4, 1, 64)
    with kvtier.Store(f"dir:{tmp_path}", tier=t, model="m", page_tokens=16) as s:
        assert s.put_sync([(b"k" * 16, 0), (b"j" * 16, 1)]).status == "KVT_OK"
        reg = prom.CollectorRegistry()
        reg.register(KvtierCollector(store=s))
        text = prom.generate_latest(reg).decode()
        puts = s.stats("put")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert puts["calls"] >= 1
    assert fams["kvtier_l3_store_put_calls"].samples[0].value == puts["calls"]
    assert fams["kvtier_l3_store_put_stored_objects"].samples[0].value == puts["stored_objects"]
    assert not any(n.startswith("kvtier_store_") for n in fams)
    t.close()


def test_a_store_over_a_checksummed_l2_that_the_copies_leave_unsummed_is_refused(tmp_path):
    """A Transfer with checksum=False fills a checksummed L2 without its
    sums, and the store then refused every put from it (a corrupt host page
    never reaches L3), silently: attaching the two together is refused,
    whichever comes second, for the radix cache and for a hybrid's pieces."""
    l1, l2 = kvtier.Tier.host(64, 1, 64), kvtier.Tier.host(64, 1, 64, checksum=True)
    with l1, l2, kvtier.Transfer([l1, l2], checksum=False) as x, kvtier.Transfer([l1, l2]) as good:
        for store_first in (False, True):
            for xfer in (x, good):
                with kvtier.Store(f"dir:{tmp_path}/l3", tier=l2, model="m", page_tokens=4) as s, \
                        kvtier.Cache(l1_pages=64, l2_pages=64, page_tokens=4, l3_write_policy="write_through") as c:
                    steps = [lambda: c.attach(xfer, l1, l2), lambda: c.attach_store(s)]
                    if store_first:
                        steps.reverse()
                    steps[0]()
                    if xfer is x:
                        with pytest.raises(kvtier.InvalidArgument):
                            steps[1]()
                    else:
                        steps[1]()
                        c.admit(list(range(16))).release()
                        c.sync()
                        assert s.stats("put")["hits"] == 4  # every page put
    with kvtier.Hybrid("full:1:64,window:24:1:64", page_tokens=4, l1_bytes=1 << 20, l2_bytes=1 << 20,
                       l1_pages=64, l2_pages=64, l1_slots={1: 8}, l2_slots={1: 8}, moves=True,
                       async_moves=True) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], 4)
        a, b = kvtier.Tier.arena(8, 1, size), kvtier.Tier.host(8, 1, size, checksum=True)
        with a, b, kvtier.Transfer([a, b], checksum=False) as px:
            with kvtier.Store(f"dir:{tmp_path}/p", tier=b, model="p", page_tokens=4) as put, \
                    kvtier.Store(f"dir:{tmp_path}/p", tier=a, model="p", page_tokens=4) as get:
                with pytest.raises(kvtier.InvalidArgument):
                    h.attach_pieces({1: (px, a, b)}, print, {1: (put, get)})
