"""Memory a tier points into stays valid while anything can reach it: a
view keeps its tier from closing, an engine tier refuses memory it must not
write (Python objects, read-only buffers) and notices memory resized or
freed under it. Each check compares with bytes the test wrote itself."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import kvtier
from kvtier.tier import Plane

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run_code(code: str, timeout: int = 60) -> subprocess.CompletedProcess:
    """code in a Python of its own (what it does may crash it), with this package."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)

# ---- views -------------------------------------------------------------------


def test_a_tier_refuses_to_close_while_a_view_lives():
    t = kvtier.Tier.host(4, 1, 64)
    t.write_page(0, bytes(range(64)))
    v = t.view(0)
    with pytest.raises(kvtier.Busy, match="view"):
        t.close()
    assert not t.closed and bytes(v[:4]) == bytes(range(4))  # still the tier's memory
    part = v[8:12]  # a slice holds the memory too
    v.release()
    with pytest.raises(kvtier.Busy, match="1 view"):
        t.close()
    assert bytes(part) == bytes(range(8, 12))
    del part
    t.close()
    assert t.closed


def test_views_in_with_blocks_and_checksums():
    with kvtier.Tier.host(4, 1, 64, checksum=True) as t:
        with t.view(2) as v:
            v[0] = 7
        assert t.read_page(2)[0] == 7
        sums = t.checksums()
        assert len(sums) == 4
        with pytest.raises(kvtier.Busy, match="checksums"):
            t.close()
        sums.release()
        t.view(1)[3] = 9  # a temporary view is gone at once
    assert t.closed


def test_a_view_keeps_its_tier_alive():
    """The tier object dropped while its view lives (in a child: a view of
    freed memory would crash the interpreter)."""
    code = ("import gc, kvtier\n"
            "v = kvtier.Tier.host(2, 1, 1 << 20).view(1)\n"  # 1 MiB pages: freed memory is unmapped
            "gc.collect()\n"
            "v[:3] = b'abc'\n"
            "assert bytes(v[:3]) == b'abc'\n"
            "print('ok')\n")
    p = run_code(code)
    assert p.returncode == 0 and p.stdout == "ok\n", f"exit {p.returncode}: {p.stderr[-2000:]}"


# ---- from_tensors: what it must refuse -----------------------------------------


def test_from_tensors_refuses_python_objects():
    with pytest.raises(TypeError, match="plane 0: dtype object holds Python objects"):
        kvtier.Tier.from_tensors(np.empty((2, 4, 8), dtype=object))
    with pytest.raises(TypeError, match="plane 1 layer 0: dtype .* holds Python objects"):
        kvtier.Tier.from_tensors([np.zeros((4, 8))], [np.zeros((4, 2), dtype=[("a", "<f8"), ("b", "O")])])


def test_from_tensors_refuses_planes_or_layers_that_share_memory():
    """The same tensor as K and V, or overlapping views, would make one
    page's K and V one set of bytes (a load of V overwrote K): refused,
    naming the two. Interleaved planes whose pages share no byte, as K and V
    of a [blocks, 2, ...] tensor, are taken, and each keeps its own bytes."""
    kv = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ValueError, match="plane 1 layer 0 shares memory with plane 0 layer 0"):
        kvtier.Tier.from_tensors(kv, kv)
    big = np.zeros((4, 16), np.float32)
    other = np.zeros((4, 16), np.float32)
    with pytest.raises(ValueError, match="plane 1 layer 0 shares memory with plane 0 layer 0"):
        kvtier.Tier.from_tensors([big[:, 0:8], big[:, 8:16]], [big[:, 4:12], other[:, 0:8]])
    with kvtier.Tier.from_tensors([big[:, 0:8], big[:, 8:16]], [other[:, 0:8], other[:, 8:16]]):
        pass  # the same page stride, apart
    flat = np.zeros((2, 5, 8), np.float32).reshape(-1, 8)  # layer 1 starts a page into layer 0
    with pytest.raises(ValueError, match="layer 1 shares memory with plane 0 layer 0"):
        kvtier.Tier.from_tensors(np.lib.stride_tricks.as_strided(flat, (2, 5, 8), (32, 32, 4)))
    inter = np.zeros((6, 2, 16), np.int8)  # [blocks, K/V, bytes]
    with kvtier.Tier.from_tensors([inter[:, 0]], [inter[:, 1]]) as t:
        t.write_page(3, bytes([1]) * 16 + bytes([2]) * 16)
        assert inter[3, 0].tolist() == [1] * 16 and inter[3, 1].tolist() == [2] * 16 and inter.sum() == 48


def test_from_tensors_says_why_layers_at_a_stride_of_zero_or_below_are_refused():
    base = np.zeros((1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="plane 0: layer stride 0 bytes: the layers must lie at increasing"):
        kvtier.Tier.from_tensors(np.lib.stride_tricks.as_strided(base, (3, 4, 8), (0, 32, 4)))
    with pytest.raises(ValueError, match="plane 0: layer stride -128 bytes"):
        kvtier.Tier.from_tensors(np.zeros((3, 4, 8), np.float32)[::-1])


def test_from_tensors_refuses_read_only_memory():
    ro = np.zeros((2, 4, 8), dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="plane 0: read-only memory"):
        kvtier.Tier.from_tensors(ro)
    layers = [np.zeros((4, 8), np.float16), np.frombuffer(bytes(64), np.float16).reshape(4, 8)]
    with pytest.raises(ValueError, match="plane 0 layer 1: read-only memory"):
        kvtier.Tier.from_tensors(layers)


def test_from_tensors_refuses_a_torch_tensor_over_a_read_only_mapping(tmp_path):
    """torch keeps no read-only flag: a tensor over a PROT_READ mapping was
    taken, and the first copy into it killed the process on a copy thread."""
    torch = pytest.importorskip("torch")
    import warnings
    path = tmp_path / "ro.bin"
    np.arange(4 * 64, dtype=np.int8).tofile(path)
    ro = np.memmap(path, dtype=np.int8, mode="r", shape=(4, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "the given NumPy array is not writable"
        t = torch.from_numpy(ro)
    assert t.data_ptr() == ro.ctypes.data
    with pytest.raises(ValueError, match="plane 0: read-only memory"):
        kvtier.Tier.from_tensors(t)
    with pytest.raises(ValueError, match="plane 1 layer 0: read-only memory"):
        kvtier.Tier.from_tensors([torch.zeros(4, 64, dtype=torch.int8)], [t])
    half = torch.zeros(8, 64, dtype=torch.int8)[4:]  # a view: only its own bytes are asked about
    kvtier.Tier.from_tensors(half).close()
    from kvtier.tier import HostMaps
    maps = HostMaps()
    assert maps.writable(half.data_ptr(), 256) and not maps.writable(t.data_ptr(), 1)
    assert not maps.writable(0, 4096), "nothing is mapped at 0"


def test_an_engine_tier_notices_its_storage_resized():
    torch = pytest.importorskip("torch")
    k = torch.arange(64, dtype=torch.float32).reshape(4, 16)  # 4 pages of 64 bytes
    v = torch.zeros(4, 16)
    t = kvtier.Tier.from_tensors([k], [v])
    assert t.read_page(1)[:64] == np.arange(16, 32, dtype=np.float32).tobytes()  # (no .numpy(): it pins the storage)
    storage = k.untyped_storage() if hasattr(k, "untyped_storage") else k.storage()
    storage.resize_(0)  # the engine frees the memory (torch_memory_saver, an RL weight update ...)
    with pytest.raises(kvtier.InvalidArgument, match="plane 0 layer 0: the memory under the tier was resized"):
        t.read_page(1)
    with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
        t.write_page(0, bytes(t.page_bytes))
    with kvtier.Tier.host(4, 1, t.layer_bytes) as h, kvtier.Transfer([t, h]) as x:
        with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
            x.submit(1, 0, [(0, 0)])
    t.close()


def test_an_engine_tier_notices_a_numpy_array_resized():
    a = np.zeros((4, 16), dtype=np.float32)
    t = kvtier.Tier.from_tensors([a])
    a.resize((1024, 16), refcheck=False)  # numpy reallocates: the tier's address is freed memory
    with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
        t.write_page(0, bytes(t.page_bytes))
    t.close()


def test_a_cache_checks_its_engine_tier_before_copying():
    torch = pytest.importorskip("torch")
    pt = 4
    k = torch.zeros(8, pt, 8)
    l1 = kvtier.Tier.from_tensors([k])
    with kvtier.Tier.host(16, 1, l1.layer_bytes) as l2, kvtier.Transfer([l1, l2]) as x, \
            kvtier.Cache(l1_pages=8, l2_pages=16, page_tokens=pt) as c:
        c.attach(x, l1, l2)
        c.admit(list(range(4 * pt))).release()
        c.sync()  # the backups in flight read L1: the memory may go only once they are done (docs/python.md)
        (k.untyped_storage() if hasattr(k, "untyped_storage") else k.storage()).resize_(0)
        with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
            c.admit(list(range(100, 100 + 4 * pt)))
    l1.close()


@pytest.mark.parametrize("first", ["pieces", "full"])
def test_a_hybrid_checks_every_engine_tier_whichever_is_attached_first(first):
    """attach after attach_pieces kept only its own tiers on the list the
    calls check, and copies ran into a pieces tier's freed buffer."""
    pt = 16
    with kvtier.Hybrid("full:1:64,window:24:1:64", page_tokens=pt, l1_bytes=1 << 20, l2_bytes=1 << 20,
                       l1_pages=64, l2_pages=64, l1_slots={1: 4}, l2_slots={1: 16}, moves=True,
                       async_moves=True) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], pt)
        arr = np.zeros((16, size), np.uint8)
        wl1, wl2 = kvtier.Tier.arena(4, 1, size), kvtier.Tier.from_tensors([arr])  # the pieces' L2: the engine's
        fl1, fl2 = kvtier.Tier.arena(64, 1, 1024), kvtier.Tier.host(64, 1, 1024)
        x, y = kvtier.Transfer([wl1, wl2]), kvtier.Transfer([fl1, fl2])
        for step in ((first == "pieces") * ["pieces"] + ["full"] + (first == "full") * ["pieces"]):
            if step == "pieces":
                h.attach_pieces({1: (x, wl1, wl2)}, lambda mv: wl1.write_page(mv.dst_slot, b"w" * size))
            else:
                h.attach(y, fl1, fl2)
        arr.resize((0,), refcheck=False)
        with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
            h.admit(list(range(4 * pt)))
        for call in (h.pieces_sync, h.poll, h.sync, lambda: h.prefetch(list(range(4 * pt)))):
            with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
                call()
    for o in (x, y, wl1, wl2, fl1, fl2):
        o.close()


def test_a_cache_closed_with_a_request_over_freed_memory_is_left_not_released():
    """Closing releases the live requests, and a release copies (here
    write_through backs the new pages up, out of L1): over an L1 whose
    memory is gone the C cache is left, with a warning, never released (it
    read the freed buffer: SIGSEGV). Cache and Hybrid, in a process of
    their own."""
    code = ("import warnings, numpy as np, kvtier\n"
            "warnings.simplefilter('error')\n"
            "pt, pb = 16, 4096 * 16\n"
            "for kind in ('cache', 'hybrid'):\n"
            "    if kind == 'cache':\n"
            "        c = kvtier.Cache(l1_pages=16, l2_pages=16, page_tokens=pt, write_policy='write_through')\n"
            "    else:\n"
            "        c = kvtier.Hybrid('full:1:4096,window:24:1:64', page_tokens=pt, l1_bytes=64 << 20,\n"
            "                          l2_bytes=64 << 20, l1_pages=16, l2_pages=16, l1_slots={1: 8},\n"
            "                          l2_slots={1: 16}, write_policy='write_through')\n"
            "    arr = np.zeros((16, pb), np.uint8)\n"
            "    l1, l2 = kvtier.Tier.from_tensors([arr]), kvtier.Tier.host(16, 1, pb)\n"
            "    x = kvtier.Transfer([l1, l2])\n"
            "    c.attach(x, l1, l2)\n"
            "    r = c.admit(list(range(8 * pt)))\n"
            "    arr.resize((0,), refcheck=False)\n"
            "    try:\n"
            "        c.close()\n"
            "    except RuntimeWarning as w:\n"
            "        print(kind, 'left:', 'never freeing' in str(w) or 'without freeing' in str(w))\n"
            "    warnings.simplefilter('ignore')\n"
            "    c.close()\n"
            "    warnings.simplefilter('error')\n")
    p = run_code(code, 120)
    assert p.returncode == 0 and p.stdout == "cache left: True\nhybrid left: True\n", \
        f"exit {p.returncode}: {p.stdout} {p.stderr[-2000:]}"


def test_a_cycle_of_tiers_and_their_transfer_is_collected_without_a_crash():
    """The collector clears weak references before it finalizes a cycle: a
    tier whose transfer engine (copying) was in the same cycle was destroyed
    first, and the engine's workers faulted (SIGSEGV, every run)."""
    code = ("import gc, kvtier\n"
            "gc.disable()\n"
            "class Engine:\n"
            "    def __init__(self):\n"
            "        self.l1 = kvtier.Tier.host(4096, 8, 64 << 10)\n"
            "        self.l2 = kvtier.Tier.host(4096, 8, 64 << 10)\n"
            "        self.x = kvtier.Transfer([self.l1, self.l2], threads=4)\n"
            "        self.me = self\n"
            "e = Engine()\n"
            "for k in range(4):\n"
            "    e.x.submit(0, 1, [(i, i) for i in range(4096)])\n"
            "del e\n"
            "gc.collect()\n"
            "print('ok')\n")
    for _ in range(3):
        p = run_code(code, 120)
        assert p.returncode == 0 and p.stdout == "ok\n", f"exit {p.returncode}: {p.stderr[-2000:]}"


def test_attach_refuses_indices_that_name_other_tiers():
    l1, l2 = kvtier.Tier.host(16, 2, 64), kvtier.Tier.host(32, 2, 64)
    x = kvtier.Transfer([l1, l2])
    c = kvtier.Cache(l1_pages=16, l2_pages=32, page_tokens=4)
    with pytest.raises(kvtier.InvalidArgument, match="must name l1 and l2 among the Transfer's tiers"):
        c.attach(x, l1, l2, l1_index=1, l2_index=0)  # copies would have moved L2's bytes over L1, served as hits
    c.attach(x, l1, l2)  # nothing changed: the right indices still attach
    c.close(), x.close(), l1.close(), l2.close()


# ---- what keeps a C object's memory and handle its own ---------------------------------------------


def test_a_handle_is_neither_copied_nor_pickled():
    """copy.copy gave a second object over the same C pointer: closing both freed it twice."""
    import copy
    import pickle
    with kvtier.Tier.host(4, 1, 64) as t, kvtier.Cache(l1_pages=8, l2_pages=0, page_tokens=4) as c:
        for h in (t, c):
            for how in (copy.copy, copy.deepcopy, pickle.dumps):
                with pytest.raises(TypeError, match="owns a C object"):
                    how(h)


def test_an_engine_tier_pins_what_it_keeps():
    """A bytearray kept was grown (reallocated) under the tier, and a host tier kept
    was closed under it: the next write went to freed memory."""
    ba = bytearray(4 * 64)
    addr = np.frombuffer(ba, dtype=np.uint8).__array_interface__["data"][0]
    with kvtier.Tier.engine([Plane(64, 64, base=addr)], 4, 1, keep=[ba]) as t:
        with pytest.raises(BufferError):
            ba.extend(b"x" * (1 << 20))
        t.write_page(3, bytes(range(64)))
        assert bytes(ba[192:256]) == bytes(range(64))
    ba.extend(b"x")  # the tier closed: its own again
    with kvtier.Tier.host(4, 1, 64) as host:
        base = host.plane_addr(0, 0, 0)
        with kvtier.Tier.engine([Plane(64, 64, base=base)], 4, 1, keep=[host]) as t:
            with pytest.raises(kvtier.Busy, match="still used by Tier"):
                host.close()
            t.write_page(1, bytes(64 * [7]))
            assert host.read_page(1) == bytes(64 * [7])
        with pytest.raises(ValueError, match="not in the memory of keep"):  # a page past the host tier's
            kvtier.Tier.engine([Plane(64, 64, base=base)], 5, 1, keep=[host])


def test_an_engine_tier_checks_what_it_keeps_as_from_tensors_does():
    """Tier.engine's keep: a kept engine tier's memory is what its planes
    address (its first plane's address plus pages x page bytes overran the
    first layer's array), a closed tier's memory is gone, read-only memory
    cannot take loads (a write faulted), and a torch storage resized to 0
    under it is noticed before the next use (it was read after the free).
    A numpy view by as_strided is held to its array's memory, not to what
    the view claims (64 bytes viewed as 4,096 pages were written past)."""
    import mmap
    from numpy.lib.stride_tricks import as_strided
    k0, k1 = np.zeros((8, 64), np.uint8), np.zeros((8, 64), np.uint8)
    with kvtier.Tier.from_tensors([k0, k1]) as te:
        base = te.plane_addr(0, 0, 0)
        with pytest.raises(ValueError, match="not in the memory of keep"):
            kvtier.Tier.engine([Plane(128, 128, base=base)], 8, 1, keep=[te])
        with kvtier.Tier.engine([Plane(64, 64, base=base)], 8, 1, keep=[te]) as t:  # layer 0 itself
            t.write_page(7, bytes(range(64)))
            assert bytes(k0[7]) == bytes(range(64))
    host = kvtier.Tier.host(4, 1, 64)
    base = host.plane_addr(0, 0, 0)
    host.close()
    with pytest.raises(kvtier.ClosedError, match="keep"):
        kvtier.Tier.engine([Plane(64, 64, base=base)], 4, 1, keep=[host])
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    ro = np.frombuffer(m, dtype=np.uint8)
    for keep in (m, ro, bytes(4096)):
        addr = np.frombuffer(keep, dtype=np.uint8).ctypes.data
        with pytest.raises(ValueError, match="read-only"):
            kvtier.Tier.engine([Plane(64, 64, base=addr)], 4, 1, keep=[keep])
    del ro
    m.close()
    torch = pytest.importorskip("torch")
    k = torch.zeros(64, 1024, dtype=torch.uint8)
    with kvtier.Tier.engine([Plane(1024, 1024, base=k.data_ptr())], 64, 1, keep=[k]) as t:
        k.untyped_storage().resize_(0)
        with pytest.raises(kvtier.InvalidArgument, match="resized or freed"):
            t.read_page(63)
    buf = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="not in the memory of keep"):
        kvtier.Tier.from_tensors(as_strided(buf, shape=(1, 4096, 64), strides=(0, 64, 1)))
    with kvtier.Tier.from_tensors(as_strided(buf, shape=(1, 1, 64), strides=(0, 64, 1))) as t:  # within it: fine
        t.write_page(0, bytes(range(64)))
        assert bytes(buf) == bytes(range(64))


def test_token_arrays_and_packed_keys_are_read_as_they_are():
    """An array('i') of tokens is exported while C reads it (another thread
    shrinking it crashed the read); a bytes subclass's __len__ is not trusted
    for how many keys C reads."""
    from array import array
    from kvtier._core import tokens_arg
    a = array("i", range(64))
    addr, n, keep = tokens_arg(a)
    with pytest.raises(BufferError):
        del a[:]
    del keep
    del a[:]

    class Lying(bytes):
        def __len__(self):
            return 50_000_000 * 16

    with kvtier.KeyedCache(pages=8) as k:
        assert k.remove_packed(Lying(bytes(16))) == 0  # one key, absent (it read 50 M)


def test_a_hybrid_request_keeps_its_own_tokens():
    """An engine that reuses its token buffer after admit can still release the request."""
    with kvtier.Hybrid("full:1:64", page_tokens=4, l1_bytes=1 << 20) as h:
        buf = np.arange(64, dtype=np.int32)
        r = h.admit(buf)
        buf[:] = 7
        h.release(r)
        assert r.released and h.stats()["cached_tokens"] == 64
