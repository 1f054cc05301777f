"""kvtier: a KV-cache manager for LLM serving, from Python.

The C library (libkvtier) through ctypes: no compiler at install, nothing
copied: tiers point into the engine's own tensors by address, shape and
stride. Every object owns its C side and frees it on ``close()`` or at the
end of a ``with`` block; errors raise :class:`kvtier.Error` subclasses that
carry kvtier's error name and message.

    import kvtier
    with kvtier.Cache(l1_pages=4096, l2_pages=8192) as cache:
        req = cache.admit(tokens)          # match, lock, load back, allocate
        ...                                # compute KV past req.hit_pages
        req.release()

Modules: cache (Cache, Request), tier (Tier), xfer (Transfer), store (Store),
pd (PdReceiver, PdSender), cp (CpGroup), keyed (KeyedCache: pages by 128-bit
keys, under vLLM's offloading spec), hybrid (Hybrid: the cache for models
with sliding-window and state-space layers), prometheus (the statistics as a
prometheus_client collector), trace (Mooncake traces), sglang (an SGLang
HiCache storage backend).
"""
from ._core import (AlreadyExists, AlreadyReserved, Busy, ClosedError, Corrupt, Error, Fragmented, InvalidArgument,
                    IOFailure, NoSpace, NotFound, NotReserved, NotSupported, OutOfMemory, OutOfRange, ParseError,
                    TimedOut, TryAgain, error_class, page_hashes)
from ._lib import LIBRARY, lib as _clib
from .cache import POLICIES, PREFETCH_POLICIES, WRITE_POLICIES, Cache, Prefetch, Request, default_config
from .store import Store, StoreResult
from .tier import Tier, TensorInfo
from .xfer import Transfer, XferResult
from .pd import PdReceiver, PdSender
from .cp import CpGroup
from .keyed import KeyedCache
from .hybrid import Hybrid, HybridMove, HybridPrefetch, HybridRequest, LayerGroup, hybrid_longest, layer_groups


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH" ("0.4.0")."""
    v = _clib.kvt_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def build_info() -> str:
    """The library's version with what it was built with ("0.4.0 (cuda: no, ucx: yes)")."""
    return _clib.kvt_version_string().decode()


def version_number() -> int:
    """MAJOR * 10000 + MINOR * 100 + PATCH."""
    return _clib.kvt_version()


__version__ = version()
__all__ = ["Cache", "ClosedError", "CpGroup", "KeyedCache", "PdReceiver", "PdSender", "Error", "LIBRARY", "POLICIES", "PREFETCH_POLICIES", "Prefetch", "Request",
           "Store", "StoreResult", "TensorInfo", "Tier", "Transfer", "WRITE_POLICIES", "XferResult",
           "build_info", "default_config", "error_class", "page_hashes", "version", "version_number",
           "Hybrid", "HybridMove", "HybridPrefetch", "HybridRequest", "LayerGroup", "hybrid_longest", "layer_groups",
           # one exception class per C error (include/kvtier/error.h)
           "AlreadyExists", "AlreadyReserved", "Busy", "Corrupt", "Fragmented", "InvalidArgument", "IOFailure",
           "NoSpace", "NotFound", "NotReserved", "NotSupported", "OutOfMemory", "OutOfRange", "ParseError",
           "TimedOut", "TryAgain"]
