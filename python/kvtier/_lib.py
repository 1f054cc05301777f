"""The C side: loading libkvtier, its structures and its function prototypes.

ctypes, not cffi: it is in every CPython (Debian's, pyenv's, a venv's) with
nothing to install and nothing to compile, so ``import kvtier`` works in any
interpreter the library was built next to. The structures below mirror
include/kvtier/*.h field by field; the statistics lists come from the headers
themselves (_fields.py, generated), and tests/test_layout.py compiles a C
program that prints every structure's size and field offsets and compares
them with these, so a header change that is not made here fails the suite.

Which library: the first of
  1. the one shipped inside the package, kvtier/lib/libkvtier.so: a wheel
     (`pip install ./python`) has it, and then it is the only candidate (the
     structures below are those of the library built with them);
  2. $KVTIER_LIB, and then nothing else: a checkout's package run against a
     chosen build (the test suites, a sanitized build);
  3. the build recorded by scripts/install-python (kvtier/_build.py: `make`
     writes it for the project's .venv);
  4. build/ or build-rel/ of the checkout this package sits in;
  5. the system's libkvtier.so (`make install`).
LIBRARY says which was loaded.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_int, c_int32, c_size_t,
                    c_uint, c_uint8, c_uint16, c_uint32, c_uint64, c_int64, c_void_p)

from . import _fields

__all__ = ["lib", "LIBRARY"]

# ---- finding the library -------------------------------------------------


def _candidates():
    here = pathlib.Path(__file__).resolve().parent
    bundled = here / "lib" / "libkvtier.so"
    if bundled.exists():
        yield str(bundled)
        return
    env = os.environ.get("KVTIER_LIB")
    if env:
        yield env
        return
    try:  # written by `make python`: the library this package was built with
        from . import _build  # type: ignore[attr-defined]
        yield _build.LIBRARY
    except ImportError:
        pass
    for build in ("build", "build-rel"):  # an in-tree checkout: python/kvtier -> ../../build
        yield str(here.parent.parent / build / "libkvtier.so")
    found = ctypes.util.find_library("kvtier")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if not path:
            continue
        if os.path.sep in path and not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            found = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        if not hasattr(found, "kvt_version"):
            tried.append(f"{path} (loads, but is not libkvtier: it has no kvt_version)")
            continue
        return found, path
    raise ImportError("kvtier: cannot load libkvtier.so (`pip install ./python` ships it in the package;"
                      " in a checkout, build it with `make` or set KVTIER_LIB); tried: "
                      + "; ".join(tried or ["nothing"]))


lib, LIBRARY = _load()

# ---- structures ------------------------------------------------------------

KVT_NO_PAGE = 0xFFFFFFFF
KVT_TIER_MAX_PLANES = 4
KVT_HIST_BUCKETS = (40 - 6 + 1) << 6
KVT_PD_MAX_RANKS = 32
KVT_CP_RESULT_BYTES = 256
c_enum = c_int


def _u64_fields(spec):
    return [(name, c_uint64) for name, _kind, _help in spec]


class Hash128(Structure):
    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]


class Hist(Structure):
    _fields_ = [("count", c_uint64), ("sum", c_uint64), ("min", c_uint64), ("max", c_uint64),
                ("bucket", c_uint64 * KVT_HIST_BUCKETS)]


class Model(Structure):
    _fields_ = [("name", c_char_p), ("describe", c_char_p), ("layers", c_uint32), ("kv_heads", c_uint32),
                ("head_dim", c_uint32), ("dtype_bytes", c_uint32), ("bytes_per_token", c_uint64)]


class Geom(Structure):
    _fields_ = [("pages", c_uint64), ("layers", c_uint32), ("layer_bytes", c_uint64), ("layout", c_enum)]


class TierPlane(Structure):
    _fields_ = [("layer_base", POINTER(c_void_p)), ("base", c_void_p), ("layer_stride", c_uint64),
                ("piece_bytes", c_uint64), ("page_stride", c_uint64)]


class TierEngine(Structure):
    _fields_ = [("size", c_uint32), ("planes", c_uint32), ("plane", TierPlane * KVT_TIER_MAX_PLANES), ("device", c_bool)]


class TierConfig(Structure):
    _fields_ = [("size", c_uint32), ("kind", c_enum), ("geom", Geom), ("flags", c_uint32), ("name", c_char_p),
                ("device", c_int), ("streams", c_uint32), ("engine", POINTER(TierEngine)), ("token", c_uint64)]


class TierInfo(Structure):
    _fields_ = [("size", c_uint32), ("bytes", c_uint64), ("page_bytes", c_uint64), ("huge_pages", c_bool),
                ("thp_advised", c_bool), ("locked", c_bool), ("registered", c_bool), ("creator", c_bool),
                ("replaced_stale", c_bool)]


class CacheConfig(Structure):
    _fields_ = [("size", c_uint32), ("page_tokens", c_uint32), ("l1_pages", c_uint64), ("l2_pages", c_uint64),
                ("l1_lanes", c_uint32), ("l1_free_room", c_double), ("l2_free_room", c_double),
                ("policy", c_enum), ("write_policy", c_enum), ("write_through_hits", c_uint32),
                ("l3_pages", c_uint64), ("l3_write_policy", c_enum), ("l3_write_hits", c_uint32),
                ("prefetch_policy", c_enum), ("prefetch_threshold", c_uint32), ("prefetch_timeout_s", c_double),
                ("prefetch_timeout_per_1024_s", c_double), ("prefetch_timeout_max_s", c_double),
                ("l3_known", c_uint64), ("decision_digest", c_bool)]


class CacheReq(Structure):
    _fields_ = [("node", c_void_p), ("pages", c_uint64), ("l1_hit_pages", c_uint64), ("l2_hit_pages", c_uint64),
                ("new_pages", c_uint64), ("uncached_pages", c_uint64), ("committed", c_bool),
                ("l3_hit_pages", c_uint64), ("l3_foreign_pages", c_uint64), ("prefetch", c_enum),
                ("prefetch_wait_ns", c_uint64)]


class CacheStats(Structure):
    _fields_ = [("size", c_uint32)] + _u64_fields(_fields.CACHE_STATS)


class RadixStats(Structure):
    _fields_ = [("size", c_uint32)] + _u64_fields(_fields.RADIX_STATS)


class CacheCp(Structure):
    _fields_ = [("size", c_uint32), ("rank", c_uint32), ("io_rank", c_bool), ("arg", c_void_p),
                ("backup_started", c_void_p), ("l2_freed", c_void_p), ("before_copy", c_void_p)]


class XferCopy(Structure):
    _fields_ = [("src_page", c_uint32), ("dst_page", c_uint32)]


class XferDone(Structure):
    _fields_ = [("ticket", c_uint64), ("user", c_uint64), ("status", c_int), ("src", c_uint32), ("dst", c_uint32),
                ("copies", POINTER(XferCopy)), ("n", c_size_t), ("bad_page", c_uint64)]


class XferConfig(Structure):
    _fields_ = [("size", c_uint32), ("threads", c_uint32), ("max_batch_bytes", c_uint64),
                ("max_batch_copies", c_uint32), ("checksum", c_bool), ("on_done", c_void_p), ("arg", c_void_p)]


class XferStats(Structure):
    _fields_ = ([("size", c_uint32), ("src", c_uint32), ("dst", c_uint32)] + _u64_fields(_fields.XFER_STATS)
                + [("gbps", c_double), ("queue_ns", Hist), ("copy_ns", Hist), ("e2e_ns", Hist)])


STORE_LOG = CFUNCTYPE(None, c_void_p, c_char_p)


class StoreConfig(Structure):
    _fields_ = [("size", c_uint32), ("tier", c_void_p), ("model", c_char_p), ("page_tokens", c_uint32),
                ("layers", c_uint32), ("layer_bytes", c_uint64), ("dtype_bytes", c_uint32), ("tp_rank", c_uint32),
                ("tp_size", c_uint32), ("cp_rank", c_uint32), ("cp_size", c_uint32), ("ns", c_char_p),
                ("threads", c_uint32), ("timeout_ms", c_uint32), ("retries", c_uint32),
                ("log", c_void_p), ("log_arg", c_void_p)]


class StorePage(Structure):
    _fields_ = [("hash", Hash128), ("page", c_uint32)]


class StoreDone(Structure):
    _fields_ = [("ticket", c_uint64), ("user", c_uint64), ("op", c_enum), ("status", c_int), ("n", c_size_t),
                ("pages", POINTER(StorePage)), ("results", POINTER(c_uint8)), ("count", c_size_t),
                ("latency_ns", c_uint64)]


class StoreStats(Structure):
    _fields_ = ([("size", c_uint32), ("op", c_enum)] + _u64_fields(_fields.STORE_STATS)
                + [("stored_bytes", c_uint64), ("stored_objects", c_uint64), ("latency_ns", Hist)])


class PdRankStats(Structure):
    _fields_ = _u64_fields(_fields.PD_RANK_STATS) + [("gbps", c_double), ("straggler_factor", c_double),
                                                     ("batch_ns", Hist)]


class PdStats(Structure):
    _fields_ = ([("size", c_uint32), ("ranks", c_uint32)] + _u64_fields(_fields.PD_STATS)
                + [("straggler", c_int32), ("straggler_factor", c_double), ("first_vanished", c_int32),
                   ("first_failed", c_uint64), ("handoff_ns", Hist), ("data_last_error", c_char * 128),
                   ("control_last_error", c_char * 128), ("rank", PdRankStats * KVT_PD_MAX_RANKS)])


class PdReceiverConfig(Structure):
    _fields_ = [("size", c_uint32), ("pool", c_void_p), ("transport", c_enum), ("host", c_char_p),
                ("data_port", c_uint16), ("control_port", c_uint16), ("ranks", c_uint32), ("token", c_uint64),
                ("generation", c_uint32), ("resume_from", c_uint64), ("timeout_ms", c_uint64),
                ("join_timeout_ms", c_uint64), ("window", c_uint32), ("straggler_factor", c_double),
                ("max_live", c_uint32)]


class PdEvent(Structure):
    _fields_ = [("type", c_enum), ("handoff", c_uint64), ("status", c_int), ("rank", c_int32), ("reason", c_enum),
                ("npages", c_uint64), ("pages", POINTER(c_uint32))]


class PdSenderConfig(Structure):
    _fields_ = [("size", c_uint32), ("src", c_void_p), ("transport", c_enum), ("host", c_char_p),
                ("data_port", c_uint16), ("control_port", c_uint16), ("rank", c_uint32), ("ranks", c_uint32),
                ("token", c_uint64), ("streams", c_uint32), ("max_batch_bytes", c_uint64),
                ("welcome_timeout_ms", c_uint64)]


class CpGroupConfig(Structure):
    _fields_ = [("size", c_uint32), ("name", c_char_p), ("rank", c_uint32), ("ranks", c_uint32),
                ("l1_pages", c_uint64), ("l2_pages", c_uint64), ("page_tokens", c_uint32), ("layers", c_uint32),
                ("layer_bytes", c_uint64), ("layout", c_uint32), ("requests", c_uint64), ("tag", c_uint64),
                ("timeout_ms", c_uint32), ("wait_ms", c_uint32), ("cancel", c_void_p)]


class CpGroupInfo(Structure):
    _fields_ = [("size", c_uint32), ("rank", c_uint32), ("ranks", c_uint32), ("creator", c_bool),
                ("replaced_stale", c_bool), ("stopped", c_bool), ("stopped_by", c_int32), ("divergence", c_uint64),
                ("wait_ns", c_uint64), ("waits", c_uint64)]


class Key128(Structure):
    _fields_ = [("hi", c_uint64), ("lo", c_uint64)]


class KeyedConfig(Structure):
    _fields_ = [("size", c_uint32), ("events", c_uint32), ("pages", c_uint64), ("free_room", c_double),
                ("policy", c_uint32), ("reserved", c_uint32)]


class KeyedEvent(Structure):
    _fields_ = [("key", Key128), ("kind", c_uint32), ("why", c_uint32)]


class KeyedStats(Structure):
    _fields_ = [("size", c_uint32)] + _u64_fields(_fields.KEYED_STATS)


class MemStats(Structure):
    _fields_ = [("size", c_uint32), ("allocs", c_uint64), ("frees", c_uint64), ("failed", c_uint64),
                ("live_bytes", c_int64), ("peak_bytes", c_int64)]


class LayerGroup(Structure):
    _fields_ = [("kind", c_uint32), ("layers", c_uint32), ("window", c_uint32), ("reserved_", c_uint32),
                ("bytes", c_uint64)]


KVT_MODEL_MAX_GROUPS = 8


class TraceReq(Structure):
    _fields_ = [("timestamp_ms", c_uint64), ("input_length", c_uint64), ("output_length", c_uint64),
                ("hash_ids", POINTER(c_uint32)), ("nblocks", c_uint32)]


class Trace(Structure):
    _fields_ = [("req", POINTER(TraceReq)), ("n", c_size_t), ("cap", c_size_t), ("input_tokens", c_uint64),
                ("max_blocks", c_uint32)]


class HybridConfig(Structure):
    _fields_ = [("size", c_uint32), ("ngroups", c_uint32), ("groups", LayerGroup * KVT_MODEL_MAX_GROUPS),
                ("cache", CacheConfig), ("l1_slots", c_uint64 * KVT_MODEL_MAX_GROUPS),
                ("l2_slots", c_uint64 * KVT_MODEL_MAX_GROUPS), ("l3_slots", c_uint64 * KVT_MODEL_MAX_GROUPS),
                ("checkpoint_every", c_uint32), ("checkpoint_ends", c_bool), ("checkpoint_branches", c_bool),
                ("moves", c_bool), ("async_moves", c_bool)]


class HybridReq(Structure):
    _fields_ = [("full", CacheReq), ("hit_pages", c_uint64), ("full_hit_pages", c_uint64), ("hit_tier", c_uint32),
                ("short_by", c_uint32), ("priv_", c_void_p)]


class HybridStats(Structure):
    _fields_ = [("size", c_uint32)] + _u64_fields(_fields.HYBRID_STATS)


class HybridGroupBytes(Structure):
    _fields_ = [("bytes", c_uint64 * 3), ("slots", c_uint64 * 3)]


class HybridMove(Structure):
    _fields_ = [("group", c_uint32), ("src_tier", c_uint32), ("dst_tier", c_uint32), ("reserved_", c_uint32),
                ("src_slot", c_uint64), ("dst_slot", c_uint64), ("key", Key128)]


# kvt_hybrid_probe_fn: which of n keys of a group the engine's store holds (present[i]); nonzero: none
HYBRID_PROBE = CFUNCTYPE(c_int, c_void_p, c_uint32, POINTER(Key128), c_size_t, POINTER(c_uint8))
# kvt_hybrid_write_fn: the engine writes the piece a move from a request names into its L1 slot; nonzero: failed
HYBRID_WRITE = CFUNCTYPE(c_int, c_void_p, POINTER(HybridMove))


class HybridPlaneGroup(Structure):
    _fields_ = [("xfer", c_void_p), ("l1", c_void_p), ("l2", c_void_p), ("l1_index", c_uint), ("l2_index", c_uint),
                ("put", c_void_p), ("get", c_void_p)]


class HybridPlaneConfig(Structure):
    _fields_ = [("size", c_uint32), ("groups", HybridPlaneGroup * KVT_MODEL_MAX_GROUPS), ("write", HYBRID_WRITE),
                ("arg", c_void_p)]


class HybridPlaneStats(Structure):
    _fields_ = [("size", c_uint32)] + _u64_fields(_fields.HYBRID_PLANE_STATS)

# Every structure the layout test checks against the C compiler: Python class -> C type.
STRUCTS = {
    Hash128: "kvt_hash128_t", Hist: "kvt_hist_t", Model: "kvt_model_t", Geom: "kvt_geom_t",
    TierPlane: "kvt_tier_plane_t", TierEngine: "kvt_tier_engine_t", TierConfig: "kvt_tier_config_t",
    TierInfo: "kvt_tier_info_t", CacheConfig: "kvt_cache_config_t", CacheReq: "kvt_cache_req_t",
    CacheStats: "kvt_cache_stats_t", RadixStats: "kvt_radix_stats_t", CacheCp: "kvt_cache_cp_t",
    XferCopy: "kvt_xfer_copy_t", XferDone: "kvt_xfer_done_t", XferConfig: "kvt_xfer_config_t",
    XferStats: "kvt_xfer_stats_t", StoreConfig: "kvt_store_config_t", StorePage: "kvt_store_page_t",
    StoreDone: "kvt_store_done_t", StoreStats: "kvt_store_stats_t", PdRankStats: "kvt_pd_rank_stats_t",
    PdStats: "kvt_pd_stats_t", PdReceiverConfig: "kvt_pd_receiver_config_t", PdEvent: "kvt_pd_event_t",
    PdSenderConfig: "kvt_pd_sender_config_t", CpGroupConfig: "kvt_cp_group_config_t",
    CpGroupInfo: "kvt_cp_group_info_t", MemStats: "kvt_mem_stats_t", Key128: "kvt_key128_t",
    KeyedConfig: "kvt_keyed_config_t", KeyedEvent: "kvt_keyed_event_t", KeyedStats: "kvt_keyed_stats_t",
    LayerGroup: "kvt_layer_group_t", HybridConfig: "kvt_hybrid_config_t", HybridReq: "kvt_hybrid_req_t",
    HybridStats: "kvt_hybrid_stats_t", HybridGroupBytes: "kvt_hybrid_group_bytes_t", HybridMove: "kvt_hybrid_move_t",
    HybridPlaneGroup: "kvt_hybrid_plane_group_t", HybridPlaneConfig: "kvt_hybrid_plane_config_t",
    HybridPlaneStats: "kvt_hybrid_plane_stats_t",
    TraceReq: "kvt_trace_req_t", Trace: "kvt_trace_t",
}

# ---- functions -------------------------------------------------------------

vp, u32, u64, i32, P = c_void_p, c_uint32, c_uint64, c_int32, POINTER
_PROTOS = {
    # core
    "kvt_version": (c_uint, []),
    "kvt_version_string": (c_char_p, []),
    "kvt_strerror": (c_char_p, [c_int]),
    "kvt_err_name": (c_char_p, [c_int]),
    "kvt_now_ns": (u64, []),
    "kvt_hist_percentile": (u64, [P(Hist), c_double]),
    "kvt_hist_mean": (c_double, [P(Hist)]),
    "kvt_mem_stats": (c_int, [P(MemStats)]),
    "kvt_model_find": (P(Model), [c_char_p]),
    "kvt_model_at": (P(Model), [c_uint]),
    "kvt_page_hash_chain": (None, [u32, P(i32), u64, u32, P(Hash128)]),
    # enums by name
    "kvt_policy_name": (c_char_p, [c_enum]),
    "kvt_policy_parse": (c_int, [c_char_p, P(c_enum)]),
    "kvt_write_policy_name": (c_char_p, [c_enum]),
    "kvt_write_policy_parse": (c_int, [c_char_p, P(c_enum)]),
    "kvt_prefetch_policy_name": (c_char_p, [c_enum]),
    "kvt_prefetch_policy_parse": (c_int, [c_char_p, P(c_enum)]),
    "kvt_prefetch_outcome_name": (c_char_p, [c_enum]),
    "kvt_layout_name": (c_char_p, [c_enum]),
    "kvt_layout_parse": (c_int, [c_char_p, P(c_enum)]),
    "kvt_tier_kind_name": (c_char_p, [c_enum]),
    # cache
    "kvt_cache_config_default": (None, [P(CacheConfig)]),
    "kvt_cache_create": (c_int, [P(vp), P(CacheConfig)]),
    "kvt_cache_destroy": (None, [vp]),
    "kvt_cache_admit": (c_int, [vp, u32, vp, u64, i32, vp, P(CacheReq)]),
    "kvt_cache_admit_prefetched": (c_int, [vp, u64, u32, vp, u64, i32, vp, P(CacheReq)]),
    "kvt_cache_prefetch": (c_int, [vp, u32, vp, u64, P(u64)]),
    "kvt_cache_prefetch_cancel": (c_int, [vp, u64]),
    "kvt_cache_prefetches": (u64, [vp]),
    "kvt_cache_commit": (c_int, [vp, P(CacheReq)]),
    "kvt_cache_release": (c_int, [vp, P(CacheReq)]),
    "kvt_cache_abort": (c_int, [vp, P(CacheReq)]),
    "kvt_cache_config_check": (c_int, [P(CacheConfig), P(c_char_p)]),
    "kvt_cache_poll": (c_int, [vp]),
    "kvt_cache_sync": (c_int, [vp]),
    "kvt_cache_attach": (c_int, [vp, vp, vp, c_uint, vp, c_uint]),
    "kvt_cache_attach_store": (c_int, [vp, vp]),
    "kvt_cache_digest": (u64, [vp]),
    "kvt_cache_restore_room": (u64, [vp]),
    "kvt_cache_stats": (c_int, [vp, P(CacheStats)]),
    "kvt_cache_tree": (vp, [vp]),
    "kvt_cache_check": (c_int, [vp, P(c_char_p)]),
    "kvt_cache_lane_pages": (u64, [vp, u32]),
    "kvt_radix_stats": (c_int, [vp, P(RadixStats)]),
    # tiers
    "kvt_tier_create": (c_int, [P(vp), P(TierConfig)]),
    "kvt_tier_destroy": (None, [vp]),
    "kvt_tier_geom": (P(Geom), [vp]),
    "kvt_tier_kind": (c_enum, [vp]),
    "kvt_tier_name": (c_char_p, [vp]),
    "kvt_tier_host_visible": (c_bool, [vp]),
    "kvt_tier_addr": (vp, [vp, u64, u32]),
    "kvt_tier_planes": (u32, [vp]),
    "kvt_tier_plane_addr": (vp, [vp, u32, u64, u32]),
    "kvt_tier_write": (c_int, [vp, u64, u32, vp]),
    "kvt_tier_read": (c_int, [vp, u64, u32, vp]),
    "kvt_tier_sums": (P(u64), [vp]),
    "kvt_tier_page_sum": (u64, [vp, u64]),
    "kvt_tier_info": (c_int, [vp, P(TierInfo)]),
    "kvt_tier_cuda_built": (c_bool, []),
    # transfer engine
    "kvt_xfer_config_default": (None, [P(XferConfig)]),
    "kvt_xfer_copy_streams": (c_uint, []),
    "kvt_xfer_create": (c_int, [P(vp), P(XferConfig), P(vp), c_uint]),
    "kvt_xfer_destroy": (None, [vp]),
    "kvt_xfer_submit": (c_int, [vp, c_uint, c_uint, P(XferCopy), c_size_t, u64, P(u64)]),
    "kvt_xfer_poll": (c_int, [vp, P(XferDone), c_size_t, u64]),
    "kvt_xfer_pending": (u64, [vp]),
    "kvt_xfer_stats": (c_int, [vp, c_uint, c_uint, P(XferStats)]),
    # store
    "kvt_store_config_default": (None, [P(StoreConfig)]),
    "kvt_store_open": (c_int, [P(vp), c_char_p, P(StoreConfig)]),
    "kvt_store_close": (None, [vp]),
    "kvt_store_last_error": (c_char_p, [vp]),
    "kvt_store_url": (c_char_p, [vp]),
    "kvt_store_url_check": (c_int, [c_char_p]),
    "kvt_store_url_redact": (c_char_p, [c_char_p, c_char_p, c_size_t]),
    "kvt_store_backend": (c_char_p, [vp]),
    "kvt_store_key": (Hash128, [vp, P(Hash128), c_char_p]),
    "kvt_store_object_bytes": (u64, [vp]),
    "kvt_store_exists": (c_int, [vp, P(StorePage), c_size_t, u64, P(u64)]),
    "kvt_store_exists_leading": (c_int, [vp, P(StorePage), c_size_t, P(c_size_t)]),
    "kvt_store_run": (c_int, [vp, c_int, P(StorePage), c_size_t, c_char_p, P(c_size_t)]),
    "kvt_store_get": (c_int, [vp, P(StorePage), c_size_t, u64, P(u64)]),
    "kvt_store_put": (c_int, [vp, P(StorePage), c_size_t, u64, P(u64)]),
    "kvt_store_remove": (c_int, [vp, P(StorePage), c_size_t, u64, P(u64)]),
    "kvt_store_poll": (c_int, [vp, P(StoreDone), c_size_t, u64]),
    "kvt_store_pending": (u64, [vp]),
    "kvt_store_stats": (c_int, [vp, c_enum, P(StoreStats)]),
    # PD
    "kvt_pd_receiver_create": (c_int, [P(vp), P(PdReceiverConfig)]),
    "kvt_pd_receiver_destroy": (None, [vp]),
    "kvt_pd_receiver_data_port": (c_uint16, [vp]),
    "kvt_pd_receiver_control_port": (c_uint16, [vp]),
    "kvt_pd_receiver_poll": (c_int, [vp, P(PdEvent), c_size_t, u64]),
    "kvt_pd_receiver_release": (c_int, [vp, u64]),
    "kvt_pd_receiver_stats": (c_int, [vp, P(PdStats)]),
    "kvt_pd_sender_create": (c_int, [P(vp), P(PdSenderConfig)]),
    "kvt_pd_sender_destroy": (None, [vp]),
    "kvt_pd_sender_begin": (c_int, [vp, u64, u64, P(u32)]),
    "kvt_pd_sender_send": (c_int, [vp, u64, P(XferCopy), c_size_t]),
    "kvt_pd_sender_finish": (c_int, [vp]),
    "kvt_pd_sender_linked": (c_bool, [vp]),
    "kvt_pd_sender_stats": (c_int, [vp, P(PdRankStats)]),
    "kvt_net_ucx_built": (c_bool, []),
    # CP group
    "kvt_cp_group_join": (c_int, [P(vp), P(CpGroupConfig), P(c_char_p)]),
    "kvt_cp_group_wait_joined": (c_int, [vp]),
    "kvt_cp_group_open_tier": (c_int, [vp, c_char_p, P(TierConfig), P(vp)]),
    "kvt_cp_group_xfer_config": (None, [vp, P(XferConfig), c_uint]),
    "kvt_cp_group_attach": (c_int, [vp, vp, vp, vp, c_uint, vp, c_uint]),
    "kvt_cp_group_admitted": (c_int, [vp, P(CacheReq), P(u32)]),
    "kvt_cp_group_filled": (c_int, [vp, u64]),
    "kvt_cp_group_step": (c_int, [vp, u64, u64]),
    "kvt_cp_group_check_digests": (c_int, [vp, u64, P(u64)]),
    "kvt_cp_group_fail": (None, [vp, c_char_p]),
    "kvt_cp_group_finish": (c_int, [vp, vp, c_size_t]),
    "kvt_cp_group_result": (c_int, [vp, u32, vp, c_size_t]),
    "kvt_cp_group_leave": (c_int, [vp, P(c_char_p)]),
    "kvt_cp_group_why": (c_char_p, [vp]),
    "kvt_cp_group_info": (c_int, [vp, P(CpGroupInfo)]),
    "kvt_cp_group_remove_stale": (c_int, [c_char_p, P(c_char_p)]),
    # the keyed page cache
    "kvt_keyed_create": (c_int, [P(vp), P(KeyedConfig)]),
    "kvt_keyed_destroy": (None, [vp]),
    "kvt_keyed_lookup": (c_int, [vp, Key128]),
    "kvt_keyed_page": (c_int, [vp, Key128, P(u64)]),
    "kvt_keyed_prepare_store": (c_int, [vp, P(Key128), P(u64), c_size_t, P(Key128), c_size_t, P(u64), P(Key128),
                                        c_size_t, P(c_size_t)]),
    "kvt_keyed_complete_store": (None, [vp, P(Key128), c_size_t, c_int]),
    "kvt_keyed_pin": (c_int, [vp, P(Key128), c_size_t, P(u64)]),
    "kvt_keyed_unpin": (c_int, [vp, P(Key128), c_size_t]),
    "kvt_keyed_touch": (None, [vp, P(Key128), P(u64), c_size_t]),
    "kvt_keyed_remove": (c_int, [vp, P(Key128), c_size_t, P(c_size_t)]),
    "kvt_keyed_arc_touch": (c_int, [vp, P(Key128), c_size_t]),
    "kvt_keyed_arc_missed": (c_int, [vp, P(Key128), c_size_t]),
    "kvt_keyed_arc_finish": (c_int, [vp, P(Key128), P(c_uint8), c_size_t]),
    "kvt_keyed_reset": (c_int, [vp]),
    "kvt_keyed_take_events": (c_size_t, [vp, P(KeyedEvent), c_size_t]),
    "kvt_keyed_stats": (c_int, [vp, P(KeyedStats)]),
    "kvt_keyed_check": (c_int, [vp, P(c_char_p)]),
    # model layer groups and the hybrid cache
    "kvt_group_kind_name": (c_char_p, [c_enum]),
    "kvt_model_groups": (c_int, [P(Model), P(LayerGroup), u32, P(u32)]),
    "kvt_model_parse_groups": (c_int, [c_char_p, P(LayerGroup), u32, P(u32), P(u32)]),
    "kvt_hybrid_config_default": (c_int, [P(HybridConfig), P(LayerGroup), u32, u32, u64, u64, u64]),
    "kvt_hybrid_config_split": (c_int, [P(HybridConfig), u64, u64, u64, c_double, c_double]),
    "kvt_hybrid_config_split_tier": (c_int, [P(HybridConfig), u32, u64, c_double, c_double]),
    "kvt_hybrid_create": (c_int, [P(vp), P(HybridConfig)]),
    "kvt_hybrid_destroy": (None, [vp]),
    "kvt_hybrid_admit": (c_int, [vp, u32, vp, u64, i32, vp, P(HybridReq)]),
    "kvt_hybrid_admit_prefetched": (c_int, [vp, u64, u32, vp, u64, i32, vp, P(HybridReq)]),
    "kvt_hybrid_set_l3": (c_int, [vp, HYBRID_PROBE, vp]),
    "kvt_hybrid_release": (c_int, [vp, u32, vp, u64, P(HybridReq)]),
    "kvt_hybrid_abort": (c_int, [vp, P(HybridReq)]),
    "kvt_hybrid_cache": (vp, [vp]),
    "kvt_hybrid_digest": (u64, [vp]),
    "kvt_hybrid_stats": (c_int, [vp, P(HybridStats)]),
    "kvt_hybrid_group_bytes": (c_int, [vp, u32, P(HybridGroupBytes)]),
    "kvt_hybrid_check": (c_int, [vp, P(c_char_p)]),
    "kvt_hybrid_take_moves": (c_size_t, [vp, P(HybridMove), c_size_t]),
    "kvt_hybrid_moves": (c_size_t, [vp]),
    "kvt_hybrid_moves_done": (c_int, [vp, P(HybridMove), c_size_t, P(c_uint8)]),
    "kvt_hybrid_moves_outstanding": (c_size_t, [vp]),
    "kvt_hybrid_engine_waiting": (c_size_t, [vp, P(Key128), c_size_t]),
    "kvt_hybrid_ready": (c_int, [vp, P(HybridReq)]),
    "kvt_hybrid_slots": (c_int, [vp, P(HybridReq), u32, P(u64), c_size_t, P(c_size_t)]),
    "kvt_hybrid_longest": (u64, [P(LayerGroup), u32, u32, u64, P(P(c_uint8))]),
    "kvt_hybrid_piece_bytes": (u64, [P(LayerGroup), u32]),
    "kvt_hybrid_store_probe": (c_int, [vp, u32, P(Key128), c_size_t, P(c_uint8)]),
    "kvt_hybrid_plane_create": (c_int, [P(vp), vp, P(HybridPlaneConfig)]),
    "kvt_hybrid_plane_destroy": (None, [vp]),
    "kvt_hybrid_plane_poll": (c_int, [vp, u64]),
    "kvt_hybrid_plane_wait": (c_int, [vp, P(HybridReq)]),
    "kvt_hybrid_plane_sync": (c_int, [vp]),
    "kvt_hybrid_plane_in_flight": (c_size_t, [vp]),
    "kvt_hybrid_plane_stats": (c_int, [vp, P(HybridPlaneStats)]),
    # traces
    "kvt_trace_load": (c_int, [c_char_p, P(Trace), c_char_p, c_size_t]),
    "kvt_trace_free": (None, [P(Trace)]),
    "kvt_trace_block_tokens": (None, [u32, P(i32)]),
    "kvt_trace_request_tokens": (None, [P(TraceReq), P(i32)]),
}

_missing = [_name for _name in _PROTOS if not hasattr(lib, _name)]
if _missing:
    raise ImportError(f"kvtier: {LIBRARY} lacks {', '.join(_missing[:5])}"
                      f"{f' and {len(_missing) - 5} more' if len(_missing) > 5 else ''}: "
                      "it is another version of libkvtier than this package's (rebuild it, or set KVTIER_LIB)")
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
del _name, _res, _args, _f, _missing
