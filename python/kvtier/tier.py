"""Tiers: page-addressed memory (tier.h). kvtier's own (host, shm, arena) and
engine tiers over an engine's KV tensors, described by pointer, shape and
stride and never copied or freed."""
from __future__ import annotations

import ctypes
import math
from typing import Any, List, NamedTuple, Optional, Sequence, Union

from ._core import Handle, c_str, check, enum_arg, enum_names
from ._lib import (KVT_TIER_MAX_PLANES, Geom, TierConfig, TierEngine, TierInfo, lib)

__all__ = ["Tier", "Plane", "TensorInfo", "LAYOUTS", "KINDS"]

LAYOUTS = ("page_first", "layer_first")
KINDS = enum_names(lib.kvt_tier_kind_name, 7)
_KIND = {k: i for i, k in enumerate(KINDS)}
HUGE, LOCK, CHECKSUM, ATTACH, SHARED, REGISTER = 0x1, 0x2, 0x4, 0x8, 0x10, 0x20
COPY_DMA, COPY_KERNEL = 0x40, 0x80
_COPY = {"auto": 0, "dma": COPY_DMA, "kernel": COPY_KERNEL}  # device memory: how batches are copied (tier.h)


def _copy_flag(copy: str, device: Optional[int]) -> int:
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


class TensorInfo(NamedTuple):
    """What a tier needs to know of a tensor or array: its address, shape,
    strides in bytes, element size, dtype name and whether it is CUDA memory."""
    ptr: int
    shape: tuple
    strides: tuple  # bytes
    itemsize: int
    dtype: str
    device: Optional[int]  # CUDA ordinal, or None for host memory
    obj: Any

    @staticmethod
    def of(t: Any) -> "TensorInfo":
        """A torch tensor, a numpy array, or anything with __array_interface__ /
        __cuda_array_interface__."""
        if type(t).__module__.startswith("torch"):
            itemsize = t.element_size()
            dev = t.device.index or 0 if t.device.type == "cuda" else None
            if t.device.type not in ("cpu", "cuda"):
                raise TypeError(f"tensor on {t.device}: only CPU and CUDA memory")
            return TensorInfo(t.data_ptr(), tuple(t.shape), tuple(s * itemsize for s in t.stride()), itemsize,
                              str(t.dtype).replace("torch.", ""), dev, t)
        for attr, dev in (("__cuda_array_interface__", 0), ("__array_interface__", None)):
            ai = getattr(t, attr, None)
            if ai is None:
                continue
            import numpy as np  # the typestr's element size
            dt = np.dtype(ai["typestr"])
            shape = tuple(ai["shape"])
            strides = ai.get("strides")
            if strides is None:  # C-contiguous
                strides, acc = [], dt.itemsize
                for d in reversed(shape):
                    strides.insert(0, acc)
                    acc *= d
            return TensorInfo(ai["data"][0], shape, tuple(strides), dt.itemsize, dt.name, dev, t)
        raise TypeError(f"expected a torch tensor or a numpy array, not {type(t).__name__}")

    def inner_contiguous(self, skip: int) -> bool:
        """Are the dimensions after the first `skip` row-major contiguous?"""
        acc = self.itemsize
        for d, s in zip(reversed(self.shape[skip:]), reversed(self.strides[skip:])):
            if d != 1 and s != acc:
                return False
            acc *= d
        return True


def _geom(pages: int, layers: int, layer_bytes: int, layout: Union[str, int]) -> Geom:
    for what, v in (("pages", pages), ("layers", layers), ("layer_bytes", layer_bytes)):
        if not isinstance(v, int) or v < (0 if what == "layer_bytes" else 1):
            raise ValueError(f"{what}: {v!r} (expected an integer >= 1)")
    return Geom(pages, layers, layer_bytes, enum_arg(layout, lib.kvt_layout_parse, "layout", LAYOUTS))


class Tier(Handle):
    """A tier of ``pages`` pages of ``layers`` x ``layer_bytes`` bytes.

    Build one with a class method: :meth:`host`, :meth:`shm`, :meth:`arena`
    (kvtier's memory) or :meth:`from_tensors` / :meth:`engine` (the engine's
    own KV memory, kept alive by the tier and never freed by it)."""

    def __init__(self, cfg: TierConfig, keep: Sequence[Any] = (), what: str = "Tier") -> None:
        super().__init__()
        cfg.size = ctypes.sizeof(TierConfig)
        h = ctypes.c_void_p()
        check(lib.kvt_tier_create(ctypes.byref(h), ctypes.byref(cfg)), what)
        self._own(h.value)
        self._keep = list(keep)  # the tensors an engine tier points into

    def _destroy(self, h: int) -> None:
        lib.kvt_tier_destroy(h)
        self._keep = []

    # -- constructors --------------------------------------------------------

    @classmethod
    def host(cls, pages: int, layers: int, layer_bytes: int, layout: Union[str, int] = "page_first",
             checksum: bool = False, huge: bool = False, lock: bool = False, name: Optional[str] = None) -> "Tier":
        """Private host memory (an L2 tier): anonymous pages, huge pages when
        ``huge`` and the system has them; an XXH3-64 per page with ``checksum``."""
        cfg = TierConfig(kind=_KIND["host"], geom=_geom(pages, layers, layer_bytes, layout),
                         flags=(CHECKSUM if checksum else 0) | (HUGE if huge else 0) | (LOCK if lock else 0),
                         name=c_str(name))
        return cls(cfg, what="Tier.host")

    @classmethod
    def shm(cls, name: str, pages: int, layers: int, layer_bytes: int, layout: Union[str, int] = "page_first",
            attach: bool = False, checksum: bool = False, lock: bool = False) -> "Tier":
        """POSIX shared memory a node's processes share ("/kvtier-l2"): created
        (and unlinked on close) by one, attached by name by the others."""
        cfg = TierConfig(kind=_KIND["shm"], geom=_geom(pages, layers, layer_bytes, layout),
                         flags=(ATTACH if attach else 0) | (CHECKSUM if checksum else 0) | (LOCK if lock else 0),
                         name=c_str(name))
        return cls(cfg, what="Tier.shm")

    @classmethod
    def arena(cls, pages: int, layers: int, layer_bytes: int, layout: Union[str, int] = "page_first",
              shared: bool = False) -> "Tier":
        """Host memory standing in for GPU memory (an L1 tier on any machine)."""
        cfg = TierConfig(kind=_KIND["arena"], geom=_geom(pages, layers, layer_bytes, layout),
                         flags=SHARED if shared else 0)
        return cls(cfg, what="Tier.arena")

    @classmethod
    def engine(cls, planes: Sequence[Plane], pages: int, layers: int, keep: Sequence[Any] = (),
               device: Optional[int] = None, register: bool = False, name: Optional[str] = None,
               copy: str = "auto") -> "Tier":
        """An engine tier over memory the caller owns, described by address
        (:class:`Plane`; at most 4). ``keep``: objects that own the memory,
        kept alive while the tier is open. ``device``: a CUDA ordinal for
        device memory (None: host memory). ``copy`` (device memory): "auto"
        (batches of small spans by the SMs' copy kernel, the rest by DMA),
        "dma" or "kernel". Prefer :meth:`from_tensors`, which derives the
        planes from tensors and checks them."""
        if not 1 <= len(planes) <= KVT_TIER_MAX_PLANES:
            raise ValueError(f"engine: {len(planes)} planes (expected 1..{KVT_TIER_MAX_PLANES})")
        if not isinstance(layers, int) or layers < 1 or not isinstance(pages, int) or pages < 1:
            raise ValueError(f"engine: pages {pages!r} and layers {layers!r} must be integers >= 1")
        eng = TierEngine(planes=len(planes), device=device is not None)
        hold: List[Any] = list(keep)
        for i, p in enumerate(planes):
            pl = eng.plane[i]
            pl.piece_bytes, pl.page_stride = p.piece_bytes, p.page_stride
            if p.layer_bases is not None:
                if len(p.layer_bases) != layers:
                    raise ValueError(f"engine: plane {i}: {len(p.layer_bases)} layer bases for {layers} layers")
                arr = (ctypes.c_void_p * layers)(*p.layer_bases)
                hold.append(arr)
                pl.layer_base = ctypes.cast(arr, ctypes.POINTER(ctypes.c_void_p))
            else:
                pl.base, pl.layer_stride = p.base, p.layer_stride
        flags = (REGISTER if register else 0) | _copy_flag(copy, device)
        cfg = TierConfig(kind=_KIND["engine"], geom=Geom(pages, layers, 0, 0), name=c_str(name), device=device or 0,
                         flags=flags)
        cfg.engine = ctypes.pointer(eng)
        return cls(cfg, hold, what="Tier.engine")

    @classmethod
    def from_tensors(cls, *planes: Any, pages: Optional[int] = None, dtype: Any = None, register: bool = False,
                     name: Optional[str] = None, copy: str = "auto") -> "Tier":
        """An engine tier over the engine's own KV tensors, one argument per
        plane (K, V; one latent plane for MLA; at most 4). A plane is either a
        list of per-layer tensors shaped [pages, ...] or one tensor shaped
        [layers, pages, ...]; within a page the elements must be contiguous
        (a page's piece is one block), pages may be strided (padding between
        them is never touched). Every tensor must hold at least ``pages``
        pages (default: the smallest count), have ``dtype`` when given, and be
        of one device. The tier keeps the tensors alive until it is closed.
        ``copy``: for CUDA tensors, how the transfer engine copies a batch
        ("auto", "dma" or "kernel"; see :meth:`engine`).

        Example (SGLang's MHA pool: per-layer k_buffer and v_buffer of
        [tokens, heads, head_dim], viewed as pages of 16 tokens)::

            k = [b.view(-1, 16, heads, dim) for b in pool.k_buffer]
            v = [b.view(-1, 16, heads, dim) for b in pool.v_buffer]
            l1 = kvtier.Tier.from_tensors(k, v)
        """
        if not 1 <= len(planes) <= KVT_TIER_MAX_PLANES:
            raise ValueError(f"from_tensors: {len(planes)} planes (expected 1..{KVT_TIER_MAX_PLANES})")
        want = None if dtype is None else str(dtype).replace("torch.", "")
        described: List[Plane] = []
        keep: List[Any] = []
        layers = None
        counts = []
        devices = set()
        for p, plane in enumerate(planes):
            per_layer = isinstance(plane, (list, tuple))
            infos = [TensorInfo.of(t) for t in plane] if per_layer else [TensorInfo.of(plane)]
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
                counts.append((where, ti.shape[skip - 1]))
                devices.add(ti.device)
                keep.append(ti.obj)
            if per_layer:
                if len({ti.strides[0] for ti in infos}) != 1:
                    raise ValueError(f"plane {p}: layers have different page strides")
                described.append(Plane(piece, infos[0].strides[0], layer_bases=[ti.ptr for ti in infos]))
            else:
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
        return cls.engine(described, pages, layers, keep, device=device, register=register, name=name, copy=copy)

    # -- queries -------------------------------------------------------------

    @property
    def geom(self) -> Geom:
        return lib.kvt_tier_geom(self._ptr).contents

    @property
    def pages(self) -> int:
        return self.geom.pages

    @property
    def layers(self) -> int:
        return self.geom.layers

    @property
    def layer_bytes(self) -> int:
        return self.geom.layer_bytes

    @property
    def page_bytes(self) -> int:
        g = self.geom
        return g.layers * g.layer_bytes

    @property
    def kind(self) -> str:
        return KINDS[lib.kvt_tier_kind(self._ptr)]

    @property
    def name(self) -> str:
        n = lib.kvt_tier_name(self._ptr)
        return n.decode() if n else ""

    @property
    def host_visible(self) -> bool:
        return bool(lib.kvt_tier_host_visible(self._ptr))

    def info(self) -> dict:
        st = TierInfo(size=ctypes.sizeof(TierInfo))
        check(lib.kvt_tier_info(self._ptr, ctypes.byref(st)), "Tier.info")
        return {n: getattr(st, n) for n, _ in TierInfo._fields_ if n != "size"}

    def _page(self, page: int) -> int:
        if not isinstance(page, int) or not 0 <= page < self.pages:
            raise IndexError(f"page {page!r} is out of range (the tier has {self.pages} pages)")
        return page

    def plane_addr(self, plane: int, page: int, layer: int) -> int:
        """The address of plane ``plane``'s piece of (page, layer) (0 when out of range)."""
        return lib.kvt_tier_plane_addr(self._ptr, plane, page, layer) or 0

    @property
    def planes(self) -> int:
        """Planes of the tier (an engine tier's count; 1 for a local one-plane tier; 0 remote)."""
        return lib.kvt_tier_planes(self._ptr)

    def read_page(self, page: int) -> bytes:
        """The page's bytes in logical order (layer 0, layer 1, ...; planes in order within a layer)."""
        g = self.geom
        self._page(page)
        buf = ctypes.create_string_buffer(g.layers * g.layer_bytes)
        for layer in range(g.layers):
            check(lib.kvt_tier_read(self._ptr, page, layer, ctypes.byref(buf, layer * g.layer_bytes)),
                  "Tier.read_page")
        return buf.raw

    def write_page(self, page: int, data: bytes) -> None:
        """Writes a page's bytes (logical order, as read_page gives them)."""
        g = self.geom
        self._page(page)
        data = bytes(data)
        if len(data) != g.layers * g.layer_bytes:
            raise ValueError(f"write_page: {len(data)} bytes, a page is {g.layers * g.layer_bytes}")
        buf = ctypes.create_string_buffer(data, len(data))
        for layer in range(g.layers):
            check(lib.kvt_tier_write(self._ptr, page, layer, ctypes.byref(buf, layer * g.layer_bytes)),
                  "Tier.write_page")

    def page_sum(self, page: int) -> int:
        """XXH3-64 of the page (host-visible tiers; 0 for others)."""
        return lib.kvt_tier_page_sum(self._ptr, self._page(page))

    def checksums(self) -> Optional[memoryview]:
        """The per-page XXH3-64 a checksummed host tier keeps (a live uint64
        view, ``pages`` long, valid while the tier is open), or None."""
        p = lib.kvt_tier_sums(self._ptr)
        if not p:
            return None
        return memoryview((ctypes.c_uint64 * self.pages).from_address(ctypes.addressof(p.contents))).cast("B").cast("Q")

    def view(self, page: int) -> memoryview:
        """A writable view of a page of a one-plane host tier (host, shm, arena),
        for tests and tools that poke at bytes (a page_first page is one block;
        for layer_first, layer 0's bytes only). The view is valid while the tier
        is open."""
        if self.kind == "engine" or not self.host_visible:
            raise ValueError(f"view: a {self.kind} tier has no single host block per page")
        addr = lib.kvt_tier_addr(self._ptr, self._page(page), 0)
        g = self.geom
        n = g.layers * g.layer_bytes if g.layout == 0 else g.layer_bytes
        return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")

    def __repr__(self) -> str:
        if self.closed:
            return "<kvtier.Tier closed>"
        g = self.geom
        return f"<kvtier.Tier {self.kind} {g.pages} pages x {g.layers} layers x {g.layer_bytes} B>"
