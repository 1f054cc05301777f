"""Tensors stored whole, for SGLang's generic calls made before any host pool
is registered (kvtier.sglang).

SGLang's ``HiCacheStorage.get/set/exists`` and their batch forms take any
tensor; SGLang's own file backend writes its raw bytes under the key and
needs no pool. kvtier's store keeps fixed-geometry objects, so a tensor of
n bytes becomes one object of a store whose geometry is one n-byte layer,
and beside it a *size record* (8 bytes: n, little-endian) in a store of
fixed geometry, which is what exists asks for (it is given no tensor):

    set(key, t)   put payload  ns/sglang-obj        layer_bytes = t.nbytes
                  then record  ns/sglang-obj-size   layer_bytes = 8     <- exists, batch_exists
    get(key, t)   get the record; the payload of t.nbytes if the record names
                  that size (another size, or a key set again with another: a miss)
    get(key)      get the record, then the payload of the size it names

The payload goes first, so a record never names a payload that was not
written (a failed payload put leaves no record). Each size has a lane (a
Store and its staging tier); the few most recent sizes stay open."""
from __future__ import annotations

import ctypes
import struct
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._core import Error
from ._sglang_pool import STORAGE_BATCH_SIZE, _Lane, logger
from .tier import HostMaps, TensorInfo, Tier, _kept_range

_STAGING_BYTES = 64 << 20  # a staging tier holds at most this much (and at most one batch)
_SIZES_OPEN = 8  # payload sizes whose lanes stay open
_RECORD = 8


def tensor_bytes(t: Any, what: str, write: bool, maps: Optional[HostMaps] = None) -> Tuple[int, int]:
    """(address, bytes) of a contiguous CPU tensor (writable when write: by
    the maps given, one snapshot for a batch's tensors, else a new one)."""
    ti = TensorInfo.of(t, what)
    n = ti.itemsize
    for d in ti.shape:
        n *= d
    if ti.device is not None or not ti.inner_contiguous(0):
        raise ValueError(f"{what}: expected a contiguous CPU tensor")
    if n < 1:
        raise ValueError(f"{what}: an empty tensor (an object holds at least one byte)")
    # before the maps are asked: past a storage shrunk under it (resize_) lies whatever else is mapped there
    mem = _kept_range(ti.obj)
    if mem is not None and not (mem[0] <= ti.ptr and ti.ptr + n <= mem[1]):
        raise ValueError(f"{what}: its {n} bytes are not in its memory ({mem[1] - mem[0]} bytes: resized or freed)")
    if write and not ti.writable(maps or HostMaps()):
        raise ValueError(f"{what}: read-only memory (a get writes the object into it)")
    return ti.ptr, n


class Objects:
    """The object stores of one backend: size records and payload lanes."""

    def __init__(self, url: str, ident: dict, opts: dict) -> None:
        self.url, self.ident, self.opts = url, ident, opts
        self.lock = threading.Lock()  # the lane tables
        self.lanes: "OrderedDict[Tuple[str, int], _Lane]" = OrderedDict()
        self.closed = False

    def _lane(self, op: str, nbytes: int, record: bool = False) -> Optional[_Lane]:
        """The lane, opened on first use; None when the store cannot be
        reached now (the keys are misses; the next call tries again)."""
        try:
            return self._open(op, nbytes, record)
        except Error as e:
            if e.name != "KVT_EIO":
                raise
            logger.warning("kvtier L3 (objects): %s", e)
            return None

    def _open(self, op: str, nbytes: int, record: bool) -> _Lane:
        key = ("record-" + op if record else op, nbytes)
        with self.lock:
            if self.closed:
                raise RuntimeError("KvtierStorage is closed (close() was called): make a new one")
            lane = self.lanes.get(key)
            if lane is not None:
                self.lanes.move_to_end(key)
                return lane
            pages = max(1, min(STORAGE_BATCH_SIZE, _STAGING_BYTES // nbytes))
            tier = Tier.host(pages, 1, nbytes, name=f"kvtier-sglang-obj-{op}")
            ns = self.ident["ns"] + ("/sglang-obj-size" if record else "/sglang-obj")
            try:
                lane = _Lane(f"obj-{key[0]}-{nbytes}", self.url, tier,
                             dict(model=self.ident["model"], page_tokens=1, layers=1, layer_bytes=nbytes,
                                  dtype_bytes=1, tp=self.ident["tp"], cp=self.ident["cp"], ns=ns),
                             self.opts, own_tier=True)
            except BaseException:
                tier.close()
                raise
            lane.retired = False
            self.lanes[key] = lane
            old = None
            payloads = [k for k in self.lanes if not k[0].startswith("record")]
            if len(payloads) > 2 * _SIZES_OPEN:
                old = self.lanes.pop(payloads[0])
        if old is not None:
            _retire(old)
        return lane

    def close(self) -> None:
        with self.lock:
            self.closed = True
            lanes, self.lanes = list(self.lanes.values()), OrderedDict()
        for lane in lanes:
            _retire(lane)

    def _run(self, which: Tuple[str, int, bool], op: str, hashes: Sequence[bytes], before=None,
             after=None) -> List[bool]:
        """op over hashes in chunks of the staging tier of lane `which` (its
        op, size, record); before(i, page) fills a staging page for key i,
        after(i, page) reads one that was served. A lane retired meanwhile
        (another size took its place) is opened again."""
        while True:
            lane = self._lane(*which)
            if lane is None:
                return [False] * len(hashes)
            with lane.lock:
                if not lane.retired:
                    return self._run_locked(lane, op, hashes, before, after)

    @staticmethod
    def _run_locked(lane: _Lane, op: str, hashes: Sequence[bytes], before, after) -> List[bool]:
        out: List[bool] = []
        cap = lane.tier.pages
        for c in range(0, len(hashes), cap):
            chunk = hashes[c:c + cap]
            if before is not None:
                for i in range(len(chunk)):
                    before(c + i, lane.page_addr(i))
            results = lane.run(op, [(h, i) for i, h in enumerate(chunk)])
            ok = [r == "ok" for r in results] if results is not None else [False] * len(chunk)
            if after is not None:
                for i in range(len(chunk)):
                    if ok[i]:
                        after(c + i, lane.page_addr(i))
            out += ok
        return out

    def put(self, hashes: List[bytes], addrs: List[int], sizes: List[int]) -> List[bool]:
        ok = [False] * len(hashes)
        for n, idx in _by_size(sizes).items():
            got = self._run(("put", n, False), "put", [hashes[i] for i in idx],
                            before=lambda j, page, idx=idx, n=n: ctypes.memmove(page, addrs[idx[j]], n))
            for i, g in zip(idx, got):
                ok[i] = g
        done = [i for i, g in enumerate(ok) if g]
        if done:
            recs = self._run(("put", _RECORD, True), "put", [hashes[i] for i in done],
                             before=lambda j, page: ctypes.memmove(page, struct.pack("<Q", sizes[done[j]]), _RECORD))
            for i, g in zip(done, recs):
                ok[i] = g
        return ok

    def get(self, hashes: List[bytes], addrs: List[int], sizes: List[int],
            recorded: Optional[List[Optional[int]]] = None) -> List[bool]:
        """Each payload of its size into its address, only where the size record
        (``recorded``: read here unless the caller has just read it) names that
        size: a key set again with another size keeps the old payload under the
        old size's lane, which must not be served."""
        ok = [False] * len(hashes)
        if recorded is None:
            recorded = self.sizes(hashes)
        live = [i for i in range(len(hashes)) if recorded[i] == sizes[i]]
        for n, sub in _by_size([sizes[i] for i in live]).items():
            idx = [live[k] for k in sub]
            got = self._run(("get", n, False), "get", [hashes[i] for i in idx],
                            after=lambda j, page, idx=idx, n=n: ctypes.memmove(addrs[idx[j]], page, n))
            for i, g in zip(idx, got):
                ok[i] = g
        return ok

    def sizes(self, hashes: List[bytes]) -> List[Optional[int]]:
        """Each key's recorded payload size (None: no record)."""
        found: Dict[int, int] = {}

        def read(j: int, page: int) -> None:
            found[j] = struct.unpack("<Q", ctypes.string_at(page, _RECORD))[0]
        self._run(("get", _RECORD, True), "get", hashes, after=read)
        return [found.get(j) or None for j in range(len(hashes))]

    def exists(self, keys: List[Any], key_hash: Callable[[Any], bytes]) -> int:
        """How many keys (hashed by key_hash), from the first, have a size record."""
        while True:
            lane = self._lane("get", _RECORD, True)
            if lane is None:
                return 0
            with lane.lock:
                if lane.retired:
                    continue
                return lane.leading_of(list(keys), key_hash)


def _retire(lane: _Lane) -> None:
    """Closes a lane once its current caller is done; a caller that finds it retired takes a new one."""
    with lane.lock:
        lane.retired = True
        lane.close()


def _by_size(sizes: List[int]) -> Dict[int, List[int]]:
    groups: Dict[int, List[int]] = {}
    for i, n in enumerate(sizes):
        groups.setdefault(n, []).append(i)
    return groups
