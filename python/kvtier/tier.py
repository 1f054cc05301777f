"""Tiers: page-addressed memory (tier.h). kvtier's own (host, shm, arena) and
engine tiers over an engine's KV tensors, described by pointer, shape and
stride and never copied or freed."""
from __future__ import annotations

import bisect
import ctypes
import math
import sys
import weakref
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _args as _a
from ._core import ClosedError, Handle, check, enum_arg, enum_names, error
from ._lib import (KVT_TIER_MAX_PLANES, Geom, TierConfig, TierEngine, TierInfo, lib)

__all__ = ["Tier", "Plane", "TensorInfo", "LAYOUTS", "KINDS"]

LAYOUTS = ("page_first", "layer_first")
KINDS = enum_names(lib.kvt_tier_kind_name, 7)
_KIND = {k: i for i, k in enumerate(KINDS)}
_NAME_MAX = 63  # tier.h's KVT_TIER_NAME_MAX: a label's bytes
HUGE, LOCK, CHECKSUM, ATTACH, SHARED, REGISTER = 0x1, 0x2, 0x4, 0x8, 0x10, 0x20
COPY_DMA, COPY_KERNEL = 0x40, 0x80
_COPY = {"auto": 0, "dma": COPY_DMA, "kernel": COPY_KERNEL}  # device memory: how batches are copied (tier.h)


def _copy_flag(copy: str, device: Optional[int]) -> int:
    if not isinstance(copy, str):
        raise TypeError(f"copy: expected a str ({', '.join(_COPY)}), not {type(copy).__name__}")
    if copy not in _COPY:
        raise ValueError(f"copy={copy!r}: expected one of {', '.join(_COPY)}")
    if copy != "auto" and device is None:
        raise ValueError(f"copy={copy!r} is for device memory: these tensors are host memory")
    return _COPY[copy]


class Plane(NamedTuple):
    """One plane of an engine tier, by address: per layer a base (``layer_bases``,
    one address per layer; or ``base`` + l x ``layer_stride``), the bytes of
    one page in one layer (``piece_bytes``) and the bytes from one page to the
    next (``page_stride`` >= piece_bytes)."""
    piece_bytes: int
    page_stride: int
    layer_bases: Optional[Sequence[int]] = None
    base: int = 0
    layer_stride: int = 0


def _extent(shape: tuple, strides: tuple, itemsize: int) -> int:
    """The bytes from a tensor's first element to the end of its last (0 when empty)."""
    if any(d == 0 for d in shape):
        return 0
    return sum((d - 1) * abs(st) for d, st in zip(shape, strides)) + itemsize


class HostMaps:
    """Which host memory is mapped writable: /proc/self/maps, read on the
    first question and kept for the next ones (one snapshot a batch of
    tensors: reading it costs about a millisecond). torch keeps no read-only
    flag: a tensor over a PROT_READ mapping (torch.from_numpy of a read-only
    memmap) is accepted by torch and faults on the first copy into it, on a
    copy thread."""

    def __init__(self) -> None:
        self._spans: Optional[List[Tuple[int, int, bool]]] = None

    def writable(self, ptr: int, n: int) -> bool:
        """Whether every byte of [ptr, ptr + n) is mapped writable (True where
        the maps cannot be read)."""
        if n <= 0:
            return True
        if self._spans is None:
            try:
                with open("/proc/self/maps", "rb") as f:
                    lines = f.read().split(b"\n")
            except OSError:
                return True
            spans = []
            for line in lines:
                if line:
                    span, perms = line.split(b" ", 2)[:2]
                    lo, hi = span.split(b"-")
                    spans.append((int(lo, 16), int(hi, 16), perms[1:2] == b"w"))
            self._spans = spans
        at, end = ptr, ptr + n
        k = bisect.bisect_right(self._spans, (at, 1 << 64, True)) - 1  # the last span starting at or before ptr
        for lo, hi, w in self._spans[max(k, 0):]:
            if hi <= at:
                continue
            if lo > at or not w:
                return False
            at = hi
            if at >= end:
                return True
        return False


class TensorInfo(NamedTuple):
    """What a tier needs to know of a tensor or array: its address, shape,
    strides in bytes, element size, dtype name, whether it is CUDA memory and
    whether it is read-only."""
    ptr: int
    shape: tuple
    strides: tuple  # bytes
    itemsize: int
    dtype: str
    device: Optional[int]  # CUDA ordinal, or None for host memory
    obj: Any
    readonly: Optional[bool] = False  # None: host memory whose object does not say (torch): ask writable()

    def writable(self, maps: "HostMaps") -> bool:
        """Whether the tier may write into it: its flag, or for host memory
        that keeps none, the process's maps."""
        if self.readonly is not None:
            return not self.readonly
        return maps.writable(self.ptr, _extent(self.shape, self.strides, self.itemsize))

    @staticmethod
    def of(t: Any, what: str = "tensor") -> "TensorInfo":
        """A torch tensor, a numpy array, or anything with __array_interface__ /
        __cuda_array_interface__. TypeError for what holds no plain bytes
        (Python objects, a sparse tensor, a meta tensor), naming ``what``."""
        if type(t).__module__.startswith("torch"):
            import torch
            if t.layout != torch.strided:
                raise TypeError(f"{what}: a {t.layout} tensor: only dense (strided) tensors")
            if t.device.type not in ("cpu", "cuda"):
                raise TypeError(f"{what}: a tensor on {t.device}: only CPU and CUDA memory")
            itemsize = t.element_size()
            dev = t.device.index or 0 if t.device.type == "cuda" else None
            shape, strides = tuple(t.shape), tuple(s * itemsize for s in t.stride())
            return TensorInfo(t.data_ptr(), shape, strides, itemsize, str(t.dtype).replace("torch.", ""), dev, t,
                              None if dev is None else False)
        for attr, dev in (("__cuda_array_interface__", 0), ("__array_interface__", None)):
            ai = getattr(t, attr, None)
            if ai is None:
                continue
            if dev is not None:  # (CuPy's arrays name theirs; the library checks the memory is that device's)
                dev = getattr(getattr(t, "device", None), "id", 0)
                dev = dev if type(dev) is int else 0
            import numpy as np  # the typestr's element size
            dt = np.dtype(ai["typestr"])
            if dt.kind == "V" and ai.get("descr"):
                dt = np.dtype(ai["descr"])  # a structured dtype: its fields
            if dt.hasobject:
                raise TypeError(f"{what}: dtype {dt} holds Python objects (pointers), not KV bytes")
            shape = tuple(ai["shape"])
            strides = ai.get("strides")
            if strides is None:  # C-contiguous
                strides, acc = [], dt.itemsize
                for d in reversed(shape):
                    strides.insert(0, acc)
                    acc *= d
            return TensorInfo(ai["data"][0], shape, tuple(strides), dt.itemsize, dt.name, dev, t,
                              bool(ai["data"][1]))
        raise TypeError(f"{what}: expected a torch tensor or a numpy array, not {type(t).__name__}")

    def inner_contiguous(self, skip: int) -> bool:
        """Are the dimensions after the first `skip` row-major contiguous?"""
        acc = self.itemsize
        for d, s in zip(reversed(self.shape[skip:]), reversed(self.strides[skip:])):
            if d != 1 and s != acc:
                return False
            acc *= d
        return True


def _shm_name(name: Any, what: str) -> bytes:
    """A POSIX shared memory name as tier.h takes it: "/" then up to 59 bytes, no other "/"."""
    b = _a.text(name, what)
    if not b.startswith(b"/") or b"/" in b[1:] or not 2 <= len(b) <= 60:
        raise ValueError(f"{what}: {name!r} (expected \"/\" and a name of 1..59 bytes with no other \"/\", "
                         "e.g. \"/kvtier-l2\")")
    return b


def _geom(pages: int, layers: int, layer_bytes: int, layout: Union[str, int], what: str = "Tier",
          min_layer_bytes: int = 1) -> Geom:
    """A tier's geometry as kvt_tier_create takes it: up to 2**32-1 pages, and
    the whole tier addressable (pages x layers x layer_bytes at most 2**62).
    (A CP group without tiers has layer_bytes 0.)"""
    g = Geom(_a.u32(pages, f"{what} pages", 1), _a.u32(layers, f"{what} layers", 1),
             _a.u64(layer_bytes, f"{what} layer_bytes", min_layer_bytes),
             enum_arg(layout, lib.kvt_layout_parse, f"{what} layout", LAYOUTS))
    if g.pages * g.layers * g.layer_bytes > 1 << 62:
        raise ValueError(f"{what}: {g.pages} pages x {g.layers} layers x {g.layer_bytes} bytes is more than "
                         "2**62 bytes")
    return g


Probe = Tuple[str, Callable[[], Tuple[int, int]], Tuple[int, int]]


def _np_root(np: Any, a: Any) -> Any:
    """The numpy array that owns a's memory: up its bases, through the
    stand-in object numpy.lib.stride_tricks.as_strided leaves between a view
    and its array (its own size would be taken for the memory's)."""
    while True:
        b = a.base
        if isinstance(b, np.ndarray):
            a = b
        elif b is not None and hasattr(b, "__array_interface__") and isinstance(getattr(b, "base", None), np.ndarray):
            a = b.base
        else:
            return a


def _memory_probe(obj: Any, where: str) -> Optional[Probe]:
    """(where, read, what read gives now) for the allocation obj's elements
    live in: a torch storage or the numpy array that owns the data. A probe
    that reads differently later means the memory was resized or freed under
    the tier. None when nothing can resize it (or it cannot be known)."""
    if type(obj).__module__.startswith("torch"):
        st = obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj.storage().untyped()
        read = lambda: (st.data_ptr(), st.nbytes())  # noqa: E731
        return where, read, read()
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        root = _np_root(np, obj)
        if root.base is not None:  # another object's memory (bytes, mmap): numpy cannot resize it
            return None
        read = lambda: (root.__array_interface__["data"][0], root.nbytes)  # noqa: E731
        return where, read, read()
    return None


def _kept_ranges(obj: Any, what: str) -> Optional[List[Tuple[int, int]]]:
    """The [start, end) ranges of memory obj holds: the allocation its bytes
    live in (a torch storage, the numpy array owning the data, a buffer), a
    tier's own (_spans); None when it cannot be known. ClosedError for a
    closed tier (its memory is gone); ValueError for memory the tier could
    not write (a read-only buffer or array: loads and gets write into it)."""
    if isinstance(obj, Tier):
        if obj.closed:
            raise ClosedError(f"{what}: the kept Tier (its memory is gone)")
        return obj._memory()
    r = _kept_range(obj)
    if r is not None and _readonly(obj):
        raise ValueError(f"{what}: read-only memory (the tier writes into it: loads, gets)")
    return None if r is None else [r]


def _readonly(obj: Any) -> bool:
    if type(obj).__module__.startswith("torch"):
        return False
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return not obj.flags.writeable
    try:
        with memoryview(obj) as m:
            return m.readonly
    except TypeError:
        return False


def _kept_range(obj: Any) -> Optional[Tuple[int, int]]:
    """[start, end) of the allocation obj's bytes live in (a torch storage,
    the numpy array owning the data, a buffer); None when it cannot be known."""
    if type(obj).__module__.startswith("torch"):
        try:
            if obj.device.type != "cpu":
                return None
            st = obj.untyped_storage()
        except (AttributeError, RuntimeError):  # a torch object that is no tensor
            return None
        return st.data_ptr(), st.data_ptr() + st.nbytes()
    np = sys.modules.get("numpy")
    try:
        if np is None:
            raise TypeError
        root = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError, BufferError):
        return None
    root = _np_root(np, root)
    a = root.__array_interface__["data"][0]
    return a, a + root.nbytes


def _plane_spans(planes: Any, pages: int, layers: int) -> List[Tuple[int, int]]:
    """The [start, end) each engine plane's layer addresses."""
    out = []
    for pl in planes:
        span = (pages - 1) * pl.page_stride + pl.piece_bytes
        for j in range(layers):
            lo = (pl.layer_base[j] or 0) if pl.layer_base else (pl.base or 0) + j * pl.layer_stride
            out.append((lo, lo + span))
    return out


def _check_planes_in(spans: List[Tuple[int, int]], layers: int, keep: Sequence[Any], what: str) -> None:
    """Every byte the engine planes address (spans, plane-major) lies in
    memory keep holds, when keep's memory can be known: an address off by a
    page stride would otherwise be read and written wherever it points."""
    ranges: List[Tuple[int, int]] = []
    known = True
    for i, k in enumerate(keep):  # each one checked (closed, read-only), whatever the others are
        r = _kept_ranges(k, f"{what} keep[{i}]")
        known &= r is not None
        ranges += r or []
    if not known or not ranges:  # memory that cannot be known: the addresses must at least be mapped writable
        maps = HostMaps()
        for n, (lo, hi) in enumerate(spans):
            if not maps.writable(lo, hi - lo):
                raise ValueError(f"{what}: plane {n // layers} layer {n % layers}: bytes [{lo:#x}, {hi:#x}) are not "
                                 "mapped writable in this process")
        return
    for n, (lo, hi) in enumerate(spans):
        if not any(a <= lo and hi <= b for a, b in ranges):
            raise ValueError(f"{what}: plane {n // layers} layer {n % layers}: bytes [{lo:#x}, {hi:#x}) are not in the "
                             "memory of keep")


def _no_shared_pieces(planes: List[Plane], layers: int, pages: int) -> None:
    """Raises ValueError where two planes or layers would share bytes: the
    same tensor passed twice, or views that overlap. Each (plane, layer) is
    a run of `pages` pieces a page stride apart; runs whose spans meet are
    compared piece by piece where their strides are equal (interleaved K and
    V pages, as in a [blocks, 2, ...] tensor, share no byte), and by their
    first bytes otherwise."""
    runs = []
    for p, pl in enumerate(planes):
        for layer in range(layers):
            start = pl.layer_bases[layer] if pl.layer_bases else pl.base + layer * pl.layer_stride
            end = start + (pages - 1) * pl.page_stride + pl.piece_bytes
            runs.append((start, end, pl.page_stride, pl.piece_bytes, p, layer))
    runs.sort()
    live: List[tuple] = []
    for r in runs:
        live = [o for o in live if o[1] > r[0]]
        for o in live:
            if o[2] == r[2]:
                d = (r[0] - o[0]) % o[2]
                shared = d < o[3] or o[2] - d < r[3]
            else:
                shared = o[0] == r[0]
            if shared:
                raise ValueError(f"from_tensors: plane {r[4]} layer {r[5]} shares memory with plane {o[4]} layer "
                                 f"{o[5]} (the same tensor twice, or overlapping views)")
        live.append(r)


class Tier(Handle):
    """A tier of ``pages`` pages of ``layers`` x ``layer_bytes`` bytes.

    Build one with a class method: :meth:`host`, :meth:`shm`, :meth:`arena`
    (kvtier's memory) or :meth:`from_tensors` / :meth:`engine` (the engine's
    own KV memory, kept alive by the tier and never freed by it).

    Views (:meth:`view`, :meth:`checksums`) point into the tier's memory:
    while one is alive the tier refuses to close (Busy); release it first
    (``v.release()``, ``del v``, or ``with t.view(p) as v:``)."""

    def __init__(self, cfg: TierConfig, keep: Sequence[Any] = (), what: str = "Tier",
                 probes: Sequence[Probe] = ()) -> None:
        super().__init__()
        cfg.size = ctypes.sizeof(TierConfig)
        h = ctypes.c_void_p()
        check(lib.kvt_tier_create(ctypes.byref(h), ctypes.byref(cfg)), what)
        self._adopt(h.value, keep, probes)

    def _adopt(self, h: int, keep: Sequence[Any] = (), probes: Sequence[Probe] = ()) -> None:
        """Owns a created tier; what never changes is read once."""
        g = lib.kvt_tier_geom(h).contents
        self._geom = Geom(g.pages, g.layers, g.layer_bytes, g.layout)
        self._kind = KINDS[lib.kvt_tier_kind(h)]
        name = lib.kvt_tier_name(h)
        self._name = name.decode(errors="replace") if name else ""
        self._host_visible = bool(lib.kvt_tier_host_visible(h))
        self._planes = lib.kvt_tier_planes(h)
        self._keep = list(keep)  # the tensors an engine tier points into
        self._probes = list(probes)  # their memory, checked before each use
        self._spans: Optional[List[Tuple[int, int]]] = None  # an engine tier on host memory: what its planes address
        self._views: List[weakref.ref] = []
        self._own(h)

    @classmethod
    def _from_handle(cls, h: int) -> "Tier":
        t = cls.__new__(cls)
        Handle.__init__(t)
        t._adopt(h)
        return t

    def _destroy(self, h: int) -> None:
        lib.kvt_tier_destroy(h)
        self._keep = []
        self._probes = []

    def _memory(self) -> Optional[List[Tuple[int, int]]]:
        """The [start, end) ranges of host memory the tier's pages are in
        (an engine tier: what its planes address); None for device memory."""
        if self._spans is not None:
            return list(self._spans)
        if not self.host_visible or self._kind == "engine":
            return None
        base = self.plane_addr(0, 0, 0)  # one region: host, arena, shm
        return [(base, base + self.pages * self.page_bytes)]

    def _close_refused(self) -> str:
        why = super()._close_refused()
        if why:
            return why
        live = sum(1 for r in self._views if r() is not None)
        if live:
            return (f"{live} view{'s' if live > 1 else ''} of its memory (view(), checksums()) still alive: "
                    "release them first (v.release(), del v, or `with t.view(p) as v:`)")
        return ""

    def _check_memory(self) -> None:
        """Raises InvalidArgument when memory under an engine tier was resized
        or freed since the tier was made (a storage resized to 0, an array
        resized with refcheck=False): using it would write into freed memory."""
        for where, read, want in self._probes:
            got = read()
            if got != want:
                raise error(-1, "Tier", f"{where}: the memory under the tier was resized or freed "
                            f"(0x{want[0]:x}, {want[1]} bytes; now 0x{got[0]:x}, {got[1]} bytes): "
                            "this tier can no longer be used; close it and make another")

    # -- constructors --------------------------------------------------------

    @classmethod
    def host(cls, pages: int, layers: int, layer_bytes: int, layout: Union[str, int] = "page_first",
             checksum: bool = False, huge: bool = False, lock: bool = False, name: Optional[str] = None) -> "Tier":
        """Private host memory (an L2 tier): anonymous pages, huge pages when
        ``huge`` and the system has them; an XXH3-64 per page with ``checksum``."""
        w = "Tier.host"
        cfg = TierConfig(kind=_KIND["host"], geom=_geom(pages, layers, layer_bytes, layout, w),
                         flags=(CHECKSUM if _a.flag(checksum, f"{w} checksum") else 0)
                         | (HUGE if _a.flag(huge, f"{w} huge") else 0) | (LOCK if _a.flag(lock, f"{w} lock") else 0),
                         name=_a.text(name, f"{w} name", optional=True, max_bytes=_NAME_MAX))
        return cls(cfg, what=w)

    @classmethod
    def shm(cls, name: str, pages: int, layers: int, layer_bytes: int, layout: Union[str, int] = "page_first",
            attach: bool = False, checksum: bool = False, lock: bool = False) -> "Tier":
        """POSIX shared memory a node's processes share ("/kvtier-l2"): created
        (and unlinked on close) by one, attached by name by the others.

        The processes must trust one another: POSIX shared memory cannot be
        sealed, and a process of the same user that shrinks the segment
        (``ftruncate``) under the others makes their next access to the lost
        pages raise SIGBUS, which kills the interpreter. kvtier checks
        everything it reads from the segment's header, and places the pages
        from each process's own geometry."""
        w = "Tier.shm"
        cfg = TierConfig(kind=_KIND["shm"], geom=_geom(pages, layers, layer_bytes, layout, w),
                         flags=(ATTACH if _a.flag(attach, f"{w} attach") else 0)
                         | (CHECKSUM if _a.flag(checksum, f"{w} checksum") else 0)
                         | (LOCK if _a.flag(lock, f"{w} lock") else 0),
                         name=_shm_name(name, f"{w} name"))
        return cls(cfg, what=w)

    @classmethod
    def arena(cls, pages: int, layers: int, layer_bytes: int, layout: Union[str, int] = "page_first",
              shared: bool = False) -> "Tier":
        """Host memory standing in for GPU memory (an L1 tier on any machine)."""
        w = "Tier.arena"
        cfg = TierConfig(kind=_KIND["arena"], geom=_geom(pages, layers, layer_bytes, layout, w),
                         flags=SHARED if _a.flag(shared, f"{w} shared") else 0)
        return cls(cfg, what=w)

    @classmethod
    def engine(cls, planes: Sequence[Plane], pages: int, layers: int, keep: Sequence[Any] = (),
               device: Optional[int] = None, register: bool = False, name: Optional[str] = None,
               copy: str = "auto", _probes: Sequence[Probe] = ()) -> "Tier":
        """An engine tier over memory the caller owns, described by address
        (:class:`Plane`; at most 4). ``keep``: objects that own the memory,
        kept alive while the tier is open; when their memory can be known
        (torch CPU tensors, numpy arrays, buffers), every byte the planes
        address must lie in it (ValueError), else in memory this process has
        mapped writable (ValueError; where /proc/self/maps cannot be read,
        the addresses are taken as given), and the memory must stay so while
        the tier is open. ``device``: a CUDA ordinal for
        device memory (None: host memory). ``copy`` (device memory): "auto"
        (batches of small spans by the SMs' copy kernel, the rest by DMA),
        "dma" or "kernel". Prefer :meth:`from_tensors`, which derives the
        planes from tensors and checks them."""
        w = "Tier.engine"
        _a.sequence(planes, f"{w} planes")
        if not 1 <= len(planes) <= KVT_TIER_MAX_PLANES:
            raise ValueError(f"{w}: {len(planes)} planes (expected 1..{KVT_TIER_MAX_PLANES})")
        pages = _a.u64(pages, f"{w} pages", 1)
        layers = _a.u32(layers, f"{w} layers", 1)
        if device is not None:
            device = _a.integer(device, f"{w} device", 0, _a.I32_MAX)
        eng = TierEngine(size=ctypes.sizeof(TierEngine), planes=len(planes), device=device is not None)
        keep = list(keep)
        hold: List[Any] = list(keep)
        for k in keep:  # a buffer exported while the tier is open cannot be resized under it (a bytearray grown)
            if not isinstance(k, Tier) and not type(k).__module__.startswith(("torch", "numpy")):
                try:
                    hold.append(memoryview(k))
                except TypeError:
                    pass
        for i, p in enumerate(planes):
            _a.instance(p, Plane, f"{w} planes[{i}]")
            pl = eng.plane[i]
            pl.piece_bytes = _a.u64(p.piece_bytes, f"{w} plane {i} piece_bytes", 1)
            pl.page_stride = _a.u64(p.page_stride, f"{w} plane {i} page_stride")
            if p.layer_bases is not None:
                bases = _a.sequence(p.layer_bases, f"{w} plane {i} layer_bases")
                if len(bases) != layers:
                    raise ValueError(f"{w}: plane {i}: {len(bases)} layer bases for {layers} layers")
                arr = (ctypes.c_void_p * layers)(*[_a.u64(b, f"{w} plane {i} layer_bases[{j}]")
                                                   for j, b in enumerate(bases)])
                hold.append(arr)
                pl.layer_base = ctypes.cast(arr, ctypes.POINTER(ctypes.c_void_p))
            else:
                pl.base = _a.u64(p.base, f"{w} plane {i} base")
                pl.layer_stride = _a.u64(p.layer_stride, f"{w} plane {i} layer_stride")
        spans = None
        probes = {p[2]: p for p in _probes}  # one per allocation
        if device is None:
            spans = _plane_spans(eng.plane[:len(planes)], pages, layers)
            _check_planes_in(spans, layers, keep, w)
            for i, k in enumerate(keep):  # memory resized or freed under the tier is noticed, kept tiers' too
                for pr in (k._probes if isinstance(k, Tier) else [_memory_probe(k, f"keep[{i}]")]):
                    if pr is not None:
                        probes.setdefault(pr[2], pr)
        flags = (REGISTER if _a.flag(register, f"{w} register") else 0) | _copy_flag(copy, device)
        cfg = TierConfig(kind=_KIND["engine"], geom=Geom(pages, layers, 0, 0),
                         name=_a.text(name, f"{w} name", optional=True, max_bytes=_NAME_MAX), device=device or 0,
                         flags=flags)
        cfg.engine = ctypes.pointer(eng)
        t = cls(cfg, hold, what=w, probes=list(probes.values()))
        t._spans = spans
        for k in keep:  # a kept tier refuses to close while this one reads its memory
            if isinstance(k, Tier):
                k._add_user(t)
        return t

    @classmethod
    def from_tensors(cls, *planes: Any, pages: Optional[int] = None, dtype: Any = None, register: bool = False,
                     name: Optional[str] = None, copy: str = "auto") -> "Tier":
        """An engine tier over the engine's own KV tensors, one argument per
        plane (K, V; one latent plane for MLA; at most 4). A plane is either a
        list of per-layer tensors shaped [pages, ...] or one tensor shaped
        [layers, pages, ...]; within a page the elements must be contiguous
        (a page's piece is one block), pages may be strided (padding between
        them is never touched). Every tensor must hold at least ``pages``
        pages (default: the smallest count), have ``dtype`` when given, be
        writable plain numbers (not read-only, not Python objects), and be
        of one device. The tier keeps the tensors alive until it is closed,
        and checks before each use that their memory was not resized or
        freed under it. ``copy``: for CUDA tensors, how the transfer engine
        copies a batch ("auto", "dma" or "kernel"; see :meth:`engine`).

        Example (SGLang's MHA pool: per-layer k_buffer and v_buffer of
        [tokens, heads, head_dim], viewed as pages of 16 tokens)::

            k = [b.view(-1, 16, heads, dim) for b in pool.k_buffer]
            v = [b.view(-1, 16, heads, dim) for b in pool.v_buffer]
            l1 = kvtier.Tier.from_tensors(k, v)
        """
        if not 1 <= len(planes) <= KVT_TIER_MAX_PLANES:
            raise ValueError(f"from_tensors: {len(planes)} planes (expected 1..{KVT_TIER_MAX_PLANES})")
        if pages is not None:
            pages = _a.u64(pages, "from_tensors pages", 1)
        want = None if dtype is None else str(dtype).replace("torch.", "")
        described: List[Plane] = []
        keep: List[Any] = []
        probes: dict = {}
        layers = None
        counts = []
        devices = set()
        maps = HostMaps()
        for p, plane in enumerate(planes):
            per_layer = isinstance(plane, (list, tuple))
            infos = ([TensorInfo.of(t, f"plane {p} layer {i}") for i, t in enumerate(plane)] if per_layer
                     else [TensorInfo.of(plane, f"plane {p}")])
            if per_layer and not infos:
                raise ValueError(f"plane {p}: no layers")
            nl = len(infos) if per_layer else (infos[0].shape[0] if infos[0].shape else 0)
            if layers is None:
                layers = nl
            elif nl != layers:
                raise ValueError(f"plane {p}: {nl} layers, plane 0 has {layers}")
            skip = 1 if per_layer else 2  # the leading dimensions that are not inside a page
            piece = None
            for i, ti in enumerate(infos):
                where = f"plane {p}" + (f" layer {i}" if per_layer else "")
                if not ti.writable(maps):
                    raise ValueError(f"{where}: read-only memory (the tier writes into it: loads, gets)")
                if len(ti.shape) < skip:
                    raise ValueError(f"{where}: shape {ti.shape} has no page dimension")
                if want is not None and ti.dtype != want:
                    raise TypeError(f"{where}: dtype {ti.dtype}, expected {want}")
                if ti.dtype != infos[0].dtype:
                    raise TypeError(f"{where}: dtype {ti.dtype}, layer 0 has {infos[0].dtype}")
                if not ti.inner_contiguous(skip):
                    raise ValueError(f"{where}: a page's elements are not contiguous (strides {ti.strides}): "
                                     "make it .contiguous() or view it as [pages, ...] pages")
                pb = math.prod(ti.shape[skip:]) * ti.itemsize
                if pb == 0:
                    raise ValueError(f"{where}: shape {ti.shape}: empty pages")
                if piece is None:
                    piece = pb
                elif pb != piece:
                    raise ValueError(f"{where}: {pb}-byte pages, layer 0 has {piece}")
                if ti.strides[skip - 1] < pb:
                    raise ValueError(f"{where}: page stride {ti.strides[skip - 1]} bytes is below the page's "
                                     f"{pb} bytes (pages overlap)")
                if ti.ptr == 0:
                    raise ValueError(f"{where}: no memory (address 0)")
                counts.append((where, ti.shape[skip - 1]))
                devices.add(ti.device)
                keep.append(ti.obj)
                probe = _memory_probe(ti.obj, where)
                if probe is not None:
                    probes.setdefault(probe[2], probe)  # one per allocation
            if per_layer:
                if len({ti.strides[0] for ti in infos}) != 1:
                    raise ValueError(f"plane {p}: layers have different page strides")
                described.append(Plane(piece, infos[0].strides[0], layer_bases=[ti.ptr for ti in infos]))
            else:
                if nl > 1 and infos[0].strides[0] <= 0:
                    raise ValueError(f"plane {p}: layer stride {infos[0].strides[0]} bytes: the layers must lie at "
                                     "increasing addresses, apart (an expanded or flipped view shares or reverses "
                                     "them; pass a list of per-layer tensors, or a .contiguous() copy)")
                described.append(Plane(piece, infos[0].strides[1], base=infos[0].ptr, layer_stride=infos[0].strides[0]))
        if len(devices) != 1:
            raise ValueError("from_tensors: tensors on different devices")
        device = devices.pop()
        have = min(c for _, c in counts)
        if pages is None:
            pages = have
        elif pages > have:
            small = [w for w, c in counts if c < pages][0]
            raise ValueError(f"from_tensors: {small} holds {have} pages, fewer than the {pages} asked for "
                             "(the tensor is too small for the geometry)")
        if pages < 1:
            raise ValueError("from_tensors: no pages")
        _no_shared_pieces(described, layers, pages)
        return cls.engine(described, pages, layers, keep, device=device, register=register, name=name, copy=copy,
                          _probes=list(probes.values()))

    # -- queries -------------------------------------------------------------

    @property
    def geom(self) -> Geom:
        g = self._open_geom()
        return Geom(g.pages, g.layers, g.layer_bytes, g.layout)

    def _open_geom(self) -> Geom:
        self._ptr  # raises once closed
        return self._geom

    @property
    def pages(self) -> int:
        return self._open_geom().pages

    @property
    def layers(self) -> int:
        return self._open_geom().layers

    @property
    def layer_bytes(self) -> int:
        return self._open_geom().layer_bytes

    @property
    def page_bytes(self) -> int:
        g = self._open_geom()
        return g.layers * g.layer_bytes

    @property
    def kind(self) -> str:
        self._ptr
        return self._kind

    @property
    def name(self) -> str:
        self._ptr
        return self._name

    @property
    def host_visible(self) -> bool:
        self._ptr
        return self._host_visible

    @property
    def planes(self) -> int:
        """Planes of the tier (an engine tier's count; 1 for a local one-plane tier; 0 remote)."""
        self._ptr
        return self._planes

    def info(self) -> dict:
        st = TierInfo(size=ctypes.sizeof(TierInfo))
        with self._use as h:
            check(lib.kvt_tier_info(h, ctypes.byref(st)), "Tier.info")
        return {n: getattr(st, n) for n, _ in TierInfo._fields_ if n != "size"}

    def _page(self, page: int) -> int:
        return _a.index(page, "page", self._geom.pages, "the tier has pages:")

    def plane_addr(self, plane: int, page: int, layer: int) -> int:
        """The address of plane ``plane``'s piece of (page, layer)."""
        g = self._open_geom()
        plane = _a.index(plane, "plane", self._planes, "the tier has planes:")
        page = self._page(page)
        layer = _a.index(layer, "layer", g.layers, "the tier has layers:")
        with self._use as h:
            self._check_memory()
            return lib.kvt_tier_plane_addr(h, plane, page, layer) or 0

    def read_page(self, page: int) -> bytes:
        """The page's bytes in logical order (layer 0, layer 1, ...; planes in order within a layer)."""
        g = self._open_geom()
        page = self._page(page)
        buf = ctypes.create_string_buffer(g.layers * g.layer_bytes)
        with self._use as h:
            self._check_memory()
            for layer in range(g.layers):
                check(lib.kvt_tier_read(h, page, layer, ctypes.byref(buf, layer * g.layer_bytes)), "Tier.read_page")
        return buf.raw

    def write_page(self, page: int, data: bytes) -> None:
        """Writes a page's bytes (logical order, as read_page gives them). Bytes
        only: a checksummed tier keeps the page's recorded sum, so a copy out of
        the page then fails its check (kvt_tier_write; the way tests plant a
        stray write)."""
        g = self._open_geom()
        page = self._page(page)
        try:  # the buffer protocol only: bytes(128) would be 128 zero bytes
            data = bytes(memoryview(data))
        except TypeError:
            raise TypeError(f"write_page data: expected bytes-like (bytes, bytearray, memoryview, an array), "
                            f"not {type(data).__name__}") from None
        if len(data) != g.layers * g.layer_bytes:
            raise ValueError(f"write_page: {len(data)} bytes, a page is {g.layers * g.layer_bytes}")
        buf = ctypes.create_string_buffer(data, len(data))
        with self._use as h:
            self._check_memory()
            for layer in range(g.layers):
                check(lib.kvt_tier_write(h, page, layer, ctypes.byref(buf, layer * g.layer_bytes)),
                      "Tier.write_page")

    def page_sum(self, page: int) -> int:
        """XXH3-64 of the page (host-visible tiers; 0 for others)."""
        page = self._page(page)
        with self._use as h:
            self._check_memory()
            return lib.kvt_tier_page_sum(h, page)

    def _export(self, addr: int, n: int) -> memoryview:
        """A byte view of n bytes at addr that the tier tracks (close refuses while it lives)."""
        arr = (ctypes.c_char * n).from_address(addr)
        arr._tier = self  # a view keeps its tier alive
        with self._mu:  # close reads the list under the same lock
            self._views = [r for r in self._views if r() is not None]
            self._views.append(weakref.ref(arr))
        return memoryview(arr).cast("B")

    def checksums(self) -> Optional[memoryview]:
        """The per-page XXH3-64 a checksummed host tier keeps (a live uint64
        view, ``pages`` long), or None. The tier refuses to close while the view lives."""
        with self._use as h:
            p = lib.kvt_tier_sums(h)
            if not p:
                return None
            return self._export(ctypes.addressof(p.contents), 8 * self._geom.pages).cast("Q")

    def view(self, page: int) -> memoryview:
        """A writable view of a page of a one-plane host tier (host, shm, arena),
        for tests and tools that poke at bytes (a page_first page is one block;
        for layer_first, layer 0's bytes only). The tier refuses to close
        while the view lives: release it first (``with t.view(p) as v:``)."""
        if self.kind == "engine" or not self._host_visible:
            raise ValueError(f"view: a {self._kind} tier has no single host block per page")
        page = self._page(page)
        g = self._geom
        n = g.layers * g.layer_bytes if g.layout == 0 else g.layer_bytes
        with self._use as h:
            return self._export(lib.kvt_tier_addr(h, page, 0), n)

    def __repr__(self) -> str:
        if self.closed:
            return "<kvtier.Tier closed>"
        g = self._geom
        return f"<kvtier.Tier {self._kind} {g.pages} pages x {g.layers} layers x {g.layer_bytes} B>"
