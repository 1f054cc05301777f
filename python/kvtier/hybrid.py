"""The hybrid cache (hybrid.h): prefix reuse for models whose layers keep
different things (model.h's layer groups): full attention (pages, in the
radix cache), sliding-window attention (pages, of which a prefix of n tokens
needs those covering [n - W, n)) and recurrent state (checkpoints at page
boundaries). ``admit`` says from how many pages every group can continue
(the match rule, hybrid.h); the engine owns the bytes. With ``moves=True``
the cache also says which copies make the bytes follow it (hybrid.h, "The
bytes"): the engine keeps one slot-indexed buffer per window or state group
and tier, runs ``take_moves()`` in order after every admit and release, and
reads a hit's pieces from the L1 slots ``req.slots(g)`` names. With
``async_moves=True`` as well, the moves taken may run at once and in any
order (a transfer engine's threads or streams): report each with
``moves_done`` when it lands or fails, and use a request's pieces once
``ready(req)`` says they are all in L1.

    with kvtier.Hybrid("gemma-3-like", page_tokens=16, l1_bytes=8 << 30, moves=True) as h:
        req = h.admit(tokens)
        run(h.take_moves())  # loads into L1 (and what they push down)
        ...  # resume every group from req.hit_pages pages: full pages at req.l1_ids,
             # window pages and the checkpoint at req.slots(g); compute the rest
        h.release(req, tokens)
        run(h.take_moves())  # what the request computed, stored, and what that pushed down
"""
from __future__ import annotations

import array
import ctypes
import operator
import weakref
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _args as _a
from . import _fields
from ._core import Handle, IOFailure, OutOfRange, TryAgain, check, error, in_callback, page_hashes, \
    tokens_arg, using
from ._lib import HYBRID_PROBE, HYBRID_WRITE, KVT_MODEL_MAX_GROUPS, CacheStats, HybridConfig, HybridGroupBytes, \
    HybridPlaneConfig, HybridPlaneGroup, HybridPlaneStats, HybridReq, HybridStats, Key128, lib
from ._lib import HybridMove as HybridMove_
from ._lib import LayerGroup as _CGroup
from .cache import CONFIG_FIELDS as _CACHE_FIELDS, _ENUMS as _CACHE_ENUMS, Prefetch, _config_value, _Holds, _leave_block, \
    attach_data_plane, attach_store, memory_intact, not_anothers

__all__ = ["LayerGroup", "Hybrid", "HybridRequest", "HybridMove", "HybridPrefetch", "HYBRID_STATS",
           "HYBRID_PLANE_STATS", "SHORT_BY", "piece_bytes",
           "STATE_SHARE", "WINDOW_WEIGHT", "WINDOW_WEIGHT_OVER_L3", "L3_WINDOW_WEIGHT", "ENGINE", "layer_groups", "hybrid_longest"]

KINDS = tuple(lib.kvt_group_kind_name(i).decode() for i in range(3))  # full, window, state
SHORT_BY = ("none", "window", "state", "room")  # kvt_hybrid_req_t.short_by by number
HYBRID_STATS = tuple(f for f, _, _ in _fields.HYBRID_STATS)
HYBRID_PLANE_STATS = tuple(f for f, _, _ in _fields.HYBRID_PLANE_STATS)
# Cache options a Hybrid takes beside its own: page_tokens is its own argument
_OPTIONS = tuple(f for f in _CACHE_FIELDS if f != "page_tokens")
# kvt_hybrid_config_default's split (hybrid.h): the state groups a quarter, a window group's bytes weighed an eighth
# hybrid.h's default split: a window group weighs an eighth, or with an L3 the whole in L1 and L2, a quarter in L3
STATE_SHARE, WINDOW_WEIGHT, WINDOW_WEIGHT_OVER_L3, L3_WINDOW_WEIGHT = 0.25, 0.125, 1.0, 0.25
ENGINE = 0  # KVT_HYBRID_ENGINE: a move's source is the request itself


class LayerGroup(NamedTuple):
    """One layer group (kvt_layer_group_t): kind "full", "window" or "state";
    ``bytes`` is KV bytes per token over the group's layers (full, window)
    or the bytes of one checkpoint (state); ``window`` is W for a window
    group, else 0."""
    kind: str
    layers: int
    window: int
    bytes: int


class HybridMove(NamedTuple):
    """One copy the engine owes (kvt_hybrid_move_t), for window or state
    group ``group``: into slot ``dst_slot`` of tier ``dst_tier`` (1, 2, 3
    for L1, L2, L3) from slot ``src_slot`` of tier ``src_tier``, or, when
    ``src_tier`` is ENGINE (0), from what the request computed: window page
    ``src_slot`` of the request, or the state after ``src_slot`` pages.
    ``key``: the piece, its chained page hash as (hi, lo) (the keyed
    cache's order; kvtier.page_hashes gives (lo, hi))."""
    group: int
    src_tier: int
    dst_tier: int
    src_slot: int
    dst_slot: int
    key: Tuple[int, int]


GroupsArg = Union[str, Sequence[Any]]


def layer_groups(text: str) -> List[LayerGroup]:
    """The layer groups of a preset name ("gemma-3-like") or of a description
    ("full:10:8192,window:1024:52:8192,state:4:65536": per-layer bytes, see
    model.h). InvalidArgument naming the first group refused."""
    b = _a.text(text, "layer_groups text")
    out = (_CGroup * KVT_MODEL_MAX_GROUPS)()
    n, bad = ctypes.c_uint32(), ctypes.c_uint32()
    rc = lib.kvt_model_parse_groups(b, out, KVT_MODEL_MAX_GROUPS, ctypes.byref(n), ctypes.byref(bad))
    if rc < 0:
        why = (f"more than {KVT_MODEL_MAX_GROUPS} groups" if rc == -5 else
               "no full group" if bad.value and bad.value == text.count(",") + 1 else
               f"group {bad.value} ({text.split(',')[bad.value]!r}) is refused, or no such preset")
        raise error(rc, "layer_groups", f"{text!r}: {why}")
    return [LayerGroup(KINDS[g.kind], g.layers, g.window, g.bytes) for g in out[:n.value]]


def _group(g: Any, i: int) -> _CGroup:
    what = f"groups[{i}]"
    if isinstance(g, Mapping):
        g = LayerGroup(**{k: g.get(k, 0) for k in LayerGroup._fields})
    if not isinstance(g, (tuple, list)) or len(g) != 4:
        raise TypeError(f"{what}: expected a LayerGroup (kind, layers, window, bytes), not {g!r}")
    kind, layers, window, nbytes = g
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"{what}: kind {kind!r} (choose from {', '.join(KINDS)})")
    return _CGroup(KINDS.index(kind), _a.u32(layers, f"{what} layers", 1), _a.u32(window, f"{what} window"), 0,
                   _a.u64(nbytes, f"{what} bytes", 1))


def _groups_arg(groups: GroupsArg) -> Tuple[Any, int]:
    """(C group array, count) of a preset name, a description or a list of LayerGroups."""
    if isinstance(groups, str):
        groups = layer_groups(groups)
    groups = _a.sequence(groups, "groups")
    if not 1 <= len(groups) <= KVT_MODEL_MAX_GROUPS:
        raise ValueError(f"groups: {len(groups)} groups (expected 1..{KVT_MODEL_MAX_GROUPS})")
    arr = (_CGroup * KVT_MODEL_MAX_GROUPS)()
    for i, g in enumerate(groups):
        arr[i] = _group(g, i)
        if (arr[i].kind == 1) != (arr[i].window != 0):
            raise ValueError(f"groups[{i}]: a window group needs a window >= 1, and only a window group has one")
    if not any(arr[i].kind == 0 for i in range(len(groups))):
        raise ValueError("groups: at least one must be full (the prefix tree holds its pages)")
    return arr, len(groups)


def hybrid_longest(groups: GroupsArg, page_tokens: int, m: int, present: Sequence[Any]) -> int:
    """The match rule alone (kvt_hybrid_longest): the longest n <= m from
    which every group can continue, for full groups that matched m pages.
    ``present[g]``: None for a full group; for a window group m flags (page
    i present); for a state group m + 1 flags (a checkpoint after i pages)."""
    arr, n = _groups_arg(groups)
    page_tokens = _a.u32(page_tokens, "hybrid_longest page_tokens", 1)
    m = _a.u64(m, "hybrid_longest m")
    present = _a.sequence(present, "hybrid_longest present")
    if len(present) != n:
        raise ValueError(f"hybrid_longest present: {len(present)} entries for {n} groups")
    ptrs = (ctypes.POINTER(ctypes.c_uint8) * n)()
    keep = []
    for g in range(n):
        kind, p = arr[g].kind, present[g]
        if kind == 0:
            if p is not None:
                raise ValueError(f"hybrid_longest present[{g}]: a full group takes None")
            continue
        want = m + (kind == 2)
        if not isinstance(p, (list, tuple)) and not hasattr(p, "__array_interface__"):
            raise TypeError(f"hybrid_longest present[{g}]: expected {want} flags, not {type(p).__name__}")
        if len(p) != want:
            raise ValueError(f"hybrid_longest present[{g}]: {len(p)} flags, expected {want} "
                             f"({'m + 1 for a state group' if kind == 2 else 'm for a window group'})")
        buf = (ctypes.c_uint8 * max(want, 1))(*[_a.flag(x, f"hybrid_longest present[{g}][{i}]")
                                                for i, x in enumerate(p)])
        keep.append(buf)
        ptrs[g] = ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8))
    return lib.kvt_hybrid_longest(arr, n, page_tokens, m, ptrs)


class HybridPrefetch(Prefetch):
    """The full groups' L3 prefetch of a request that just arrived
    (:meth:`Hybrid.prefetch`), finished by its admission
    (``Hybrid.admit(tokens, prefetch=p)``) or dropped by ``cancel()``."""

    __slots__ = ()

    def cancel(self) -> None:
        with self._cache._use as h:
            if not self.done:
                check(lib.kvt_cache_prefetch_cancel(lib.kvt_hybrid_cache(h), self.id), "HybridPrefetch.cancel")
                self._finished()


def piece_bytes(group: Any, page_tokens: int) -> int:
    """Bytes of one piece of a layer group (kvt_hybrid_piece_bytes): a
    window page (its bytes per token x page_tokens) or a checkpoint; 0 for a
    full group. What a tier of :meth:`Hybrid.attach_pieces` holds a page."""
    g = _group(group, 0)
    return lib.kvt_hybrid_piece_bytes(ctypes.byref(g), _a.u32(page_tokens, "piece_bytes page_tokens", 1))


def _tier_index(xfer: Any, tier: Any, what: str) -> int:
    try:
        return xfer.index(tier)
    except ValueError:
        raise ValueError(f"{what}: not a tier of that Transfer (tiers[g] = (xfer, l1, l2), l1 and l2 among "
                         "xfer's tiers)") from None


def _write_callback(hybrid: "Hybrid", write: Any) -> Any:
    """write(move) for the data plane, as the C write: a return is success;
    nothing raised gets into C: an exception is a write that failed
    (nonzero: the piece absent from L1, a miss), kept on the Hybrid."""
    ref = weakref.ref(hybrid)

    def call(_arg: Any, m: Any) -> int:
        h = ref()
        try:
            with in_callback(h):
                x = m[0]
                write(HybridMove(x.group, x.src_tier, x.dst_tier, x.src_slot, x.dst_slot, (x.key.hi, x.key.lo)))
            return 0
        except BaseException as e:  # noqa: B036 - an exception must not unwind through C
            if h is not None:
                h.last_write_error = e
            return -1

    return HYBRID_WRITE(call)


def _int01(x: Any) -> bool:
    """An integer (Python's or numpy's) that is 0 or 1."""
    try:
        return operator.index(x) in (0, 1)
    except TypeError:
        return False


def _probe_callback(hybrid: "Hybrid", probe: Any) -> Any:
    """probe(group, keys) -> flags, as the C probe: keys (hi, lo) as
    HybridMove.key. Nothing raised gets into C: an exception, or flags of the
    wrong count, answers "none held" (nonzero) and is kept on the Hybrid."""
    ref = weakref.ref(hybrid)  # the Hybrid holds the callback: no cycle through it

    def call(_arg: Any, group: int, keys: Any, n: int, present: Any) -> int:
        h = ref()
        try:
            with in_callback(h):
                got = list(probe(group, [(keys[i].hi, keys[i].lo) for i in range(n)]))
            if len(got) != n:
                raise ValueError(f"the probe answered {len(got)} flags for {n} keys")
            for x in got:  # read by truth, "miss" or [False] would be held
                if not (_a.is_bool(x) or _int01(x)):
                    raise TypeError(f"the probe answered {type(x).__name__} {x!r}: expected True or False a key")
            for i, x in enumerate(got):
                present[i] = 1 if x else 0
            return 0
        except BaseException as e:  # noqa: B036 - an exception must not unwind through C
            if h is not None:
                h.probe_errors += 1
                h.last_probe_error = e
            return -1

    return HYBRID_PROBE(call)


class HybridRequest:
    """An admitted request: every group continues from ``hit_pages`` pages
    (n) of the ``full_hit_pages`` (m) its full groups matched; ``short_by``
    says why n < m ("none", "window", "state", "room"), ``hit_tier`` the
    deepest tier a piece of the hit came from (1, 2, 3; 0: no hit).
    ``l1_ids``: the L1 page of each of the full groups' first ``pages``
    pages. Let it go once: ``release()`` (with the tokens it was admitted
    with) once its forward pass ran, ``abort()`` if it did not. Its ``with``
    block releases it, or aborts it when the block raises. A request
    collected without either is aborted at the cache's next call."""

    __slots__ = ("_hybrid", "_req", "_ns", "_tokens", "_key", "l1_ids", "tokens", "released", "__weakref__")

    def __init__(self, hybrid: "Hybrid", req: HybridReq, ns: int, keep: Any, l1_ids: array.array, n: int) -> None:
        self._hybrid, self._req, self._ns, self._tokens = hybrid, req, ns, keep
        self._key = 0  # the cache's key of its _Held (_Holds._hold)
        self.l1_ids = l1_ids
        self.tokens = n
        self.released = False

    hit_pages = property(lambda self: self._req.hit_pages, doc="n: pages every group continues from")
    full_hit_pages = property(lambda self: self._req.full_hit_pages, doc="m: pages the full groups matched")
    hit_tier = property(lambda self: self._req.hit_tier)
    short_by = property(lambda self: SHORT_BY[self._req.short_by] if self._req.short_by < 4 else "?")
    pages = property(lambda self: self._req.full.pages, doc="the full groups' pages of the request now cached")
    new_pages = property(lambda self: self._req.full.new_pages, doc="full-group pages allocated past the match")
    l1_hit_pages = property(lambda self: self._req.full.l1_hit_pages)
    l2_hit_pages = property(lambda self: self._req.full.l2_hit_pages)
    l3_hit_pages = property(lambda self: self._req.full.l3_hit_pages, doc="full-group pages that came from L3")
    l3_foreign_pages = property(lambda self: self._req.full.l3_foreign_pages,
                                doc="full-group L3 hit pages another instance put")

    def release(self, tokens: Any = None) -> None:
        """``Hybrid.release(self, tokens)``."""
        self._hybrid.release(self, tokens)

    def abort(self) -> None:
        """``Hybrid.abort(self)``."""
        self._hybrid.abort(self)

    def slots(self, g: int) -> array.array:
        """``Hybrid.slots(self, g)``."""
        return self._hybrid.slots(self, g)

    def __enter__(self) -> "HybridRequest":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _leave_block(self, self._hybrid, exc)

    def __repr__(self) -> str:
        r = self._req
        return (f"<kvtier.HybridRequest n={r.hit_pages} m={r.full_hit_pages} tier={r.hit_tier} "
                f"short_by={self.short_by}{' released' if self.released else ''}>")


def _slots_arg(v: Any, what: str, ngroups: int) -> Dict[int, int]:
    """Slot overrides: {group index: slots} or a list with one entry per group (None: the default)."""
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, (list, tuple)):
        if len(v) != ngroups:
            raise ValueError(f"Hybrid: {what}: {len(v)} entries for {ngroups} groups")
        items = [(g, s) for g, s in enumerate(v) if s is not None]
    else:
        raise TypeError(f"Hybrid: {what}: expected a dict {{group: slots}} or a list per group, not {type(v).__name__}")
    out = {}
    for g, s in items:
        g = _a.index(g, f"Hybrid: {what} group", ngroups, "groups:")
        out[g] = _a.u64(s, f"Hybrid: {what}[{g}]")
    return out


class Hybrid(Handle, _Holds):
    """``Hybrid(groups, page_tokens=16, l1_bytes=..., l2_bytes=0, l3_bytes=0, **options)``.

    ``groups``: a preset name, a description (:func:`layer_groups`) or a list
    of :class:`LayerGroup`. The tiers' bytes are split between the groups as
    kvt_hybrid_config_default says, or with ``state_share`` (0, 1) and
    ``window_weight`` (0, 16] as kvt_hybrid_config_split does (either one
    given: the other at its default, STATE_SHARE, and WINDOW_WEIGHT or with
    an L3 WINDOW_WEIGHT_OVER_L3), the L3's window groups weighed by
    ``l3_window_weight`` when given (kvt_hybrid_config_split_tier), else
    by ``window_weight`` when given, else by L3_WINDOW_WEIGHT; then the
    options override it:
    ``l1_slots``, ``l2_slots``, ``l3_slots`` ({group: slots} or a list per
    group), ``checkpoint_every``, ``checkpoint_ends``,
    ``checkpoint_branches``, ``moves`` (record the copies the engine owes:
    :meth:`take_moves`), ``async_moves`` (with moves: they complete out of
    order, :meth:`moves_done`), and any Cache option for the full groups'
    cache (``write_policy``, ``l1_pages``, ...). TypeError for an unknown
    option, ValueError for a value out of range, InvalidArgument for a
    config the library refuses. Its calls run one at a time."""

    _SERIAL = True

    _copies_into_tiers = True  # the tiers it attaches are its own (not_anothers)

    def __init__(self, groups: GroupsArg, *, page_tokens: int = 16, l1_bytes: int, l2_bytes: int = 0,
                 l3_bytes: int = 0, state_share: Optional[float] = None, window_weight: Optional[float] = None,
                 l3_window_weight: Optional[float] = None,
                 l1_slots: Any = None, l2_slots: Any = None, l3_slots: Any = None,
                 checkpoint_every: Optional[int] = None, checkpoint_ends: Optional[bool] = None,
                 checkpoint_branches: Optional[bool] = None, moves: bool = False, async_moves: bool = False,
                 **options: Any) -> None:
        super().__init__()
        self._holding()
        arr, n = _groups_arg(groups)
        page_tokens = _a.u32(page_tokens, "Hybrid page_tokens", 1)
        l1 = _a.u64(l1_bytes, "Hybrid l1_bytes", 1)
        l2, l3 = _a.u64(l2_bytes, "Hybrid l2_bytes"), _a.u64(l3_bytes, "Hybrid l3_bytes")
        for k in options:
            if k not in _OPTIONS:
                raise TypeError(f"Hybrid: unknown option {k!r} (Cache options: {', '.join(_OPTIONS)})")
        cache_opts = {k: _config_value(k, v) for k, v in options.items()}
        overrides = [(name, _slots_arg(v, name, n)) for name, v in
                     (("l1_slots", l1_slots), ("l2_slots", l2_slots), ("l3_slots", l3_slots)) if v is not None]
        split = None
        if state_share is not None or window_weight is not None:
            ss = STATE_SHARE if state_share is None else _a.number(state_share, "Hybrid state_share", 0, 1)
            ww = (WINDOW_WEIGHT_OVER_L3 if l3 else WINDOW_WEIGHT) if window_weight is None else \
                _a.number(window_weight, "Hybrid window_weight", 0, 16)
            if not (0 < ss < 1 and ww > 0):
                raise ValueError(f"Hybrid: state_share {ss!r} must be in (0, 1), window_weight {ww!r} in (0, 16]")
            split = (ss, ww)
        l3_split = None
        if l3_window_weight is not None:
            w3 = _a.number(l3_window_weight, "Hybrid l3_window_weight", 0, 16)
            if not w3 > 0 or not l3:
                raise ValueError(f"Hybrid: l3_window_weight {w3!r} must be in (0, 16], with l3_bytes")
            l3_split = (STATE_SHARE if split is None else split[0], w3)
        elif split is not None and l3 and window_weight is None:  # the split gave L3 the weight of L1 and L2
            l3_split = (split[0], L3_WINDOW_WEIGHT)
        cfg = HybridConfig()
        too_small = "a tier too small for a page or a slot of each group (or an L3 without an L2)"
        check(lib.kvt_hybrid_config_default(ctypes.byref(cfg), arr, n, page_tokens, l1, l2, l3), "Hybrid", too_small)
        if split is not None:
            check(lib.kvt_hybrid_config_split(ctypes.byref(cfg), l1, l2, l3, *split), "Hybrid", too_small)
        if l3_split is not None:
            check(lib.kvt_hybrid_config_split_tier(ctypes.byref(cfg), 3, l3, *l3_split), "Hybrid", too_small)
        for k, v in cache_opts.items():
            setattr(cfg.cache, k, v)
        for name, slots in overrides:
            for g, s in slots.items():
                getattr(cfg, name)[g] = s
        if checkpoint_every is not None:
            cfg.checkpoint_every = _a.u32(checkpoint_every, "Hybrid checkpoint_every")
        if checkpoint_ends is not None:
            cfg.checkpoint_ends = _a.flag(checkpoint_ends, "Hybrid checkpoint_ends")
        if checkpoint_branches is not None:
            cfg.checkpoint_branches = _a.flag(checkpoint_branches, "Hybrid checkpoint_branches")
        cfg.moves = _a.flag(moves, "Hybrid moves")
        cfg.async_moves = _a.flag(async_moves, "Hybrid async_moves")
        if cfg.async_moves and not cfg.moves:
            raise ValueError("Hybrid: async_moves=True needs moves=True (there is nothing to report without moves)")
        why = ctypes.c_char_p()
        if lib.kvt_cache_config_check(ctypes.byref(cfg.cache), ctypes.byref(why)) < 0:
            raise error(-1, "Hybrid", f"the cache's {why.value.decode()}")
        h = ctypes.c_void_p()
        check(lib.kvt_hybrid_create(ctypes.byref(h), ctypes.byref(cfg)), "Hybrid",
              "slots against the tiers (a window or state group needs L1 slots, and L2/L3 slots exactly when the"
              " cache has that tier; full groups none), a write policy the slots refuse, or a cache field")
        self._own(h.value)
        self._cfg = cfg
        self._ids = array.array("I", bytes(4 * 64))
        self._tiers: list = []  # attached engine tiers whose memory is checked before each call that copies
        self._full_tiers: tuple = ()  # attach's l1 and l2
        self._piece_tiers: tuple = ()  # attach_pieces' tiers
        self._store: Any = None
        self._probe: Any = None  # the C callback of set_l3, alive while the cache may call it
        self.probe_errors = 0  # probe calls that raised (each answered "none held")
        self.last_probe_error: Optional[BaseException] = None
        self._plane: Optional[int] = None  # kvt_hybrid_plane_t (attach_pieces)
        self._plane_keep: Any = None  # its write callback and config, alive while the plane may call them
        self.last_write_error: Optional[BaseException] = None

    def _let_go(self, h: int, what: Any) -> bool:
        if isinstance(what, HybridReq):
            return lib.kvt_hybrid_abort(h, ctypes.byref(what)) >= 0
        lib.kvt_cache_prefetch_cancel(lib.kvt_hybrid_cache(h), what)
        return True

    def _destroy(self, h: int) -> None:
        held = [ref.what for ref in self._live.values() if isinstance(ref.what, HybridReq)]
        if held and not memory_intact(self, "Hybrid"):
            return  # letting them go could copy out of freed memory: the C cache is left, not freed
        if self._plane is not None:  # the copies in flight land and are reported to the cache first
            lib.kvt_hybrid_plane_destroy(self._plane)
            self._plane = None
        for req in reversed(held):  # not released: their KV cannot be known to be written (kvt_hybrid_destroy
            lib.kvt_hybrid_abort(h, ctypes.byref(req))  # frees one that cannot be aborted); the last admitted first
        for ref in self._live.values():
            o = ref()
            if o is not None and isinstance(o, HybridRequest):
                o.released = True
        self._live.clear()
        lib.kvt_hybrid_destroy(h)

    # -- what it was made with ----------------------------------------------

    @property
    def groups(self) -> List[LayerGroup]:
        c = self._cfg
        return [LayerGroup(KINDS[g.kind], g.layers, g.window, g.bytes) for g in c.groups[:c.ngroups]]

    @property
    def page_tokens(self) -> int:
        return self._cfg.cache.page_tokens

    @property
    def config(self) -> Dict[str, Any]:
        """The config it was created with: slots per group and tier, the
        checkpoint options and the full groups' cache options."""
        c, n = self._cfg, self._cfg.ngroups
        out: Dict[str, Any] = {"groups": self.groups}
        for name in ("l1_slots", "l2_slots", "l3_slots"):
            out[name] = list(getattr(c, name)[:n])
        out.update(checkpoint_every=c.checkpoint_every, checkpoint_ends=bool(c.checkpoint_ends),
                   checkpoint_branches=bool(c.checkpoint_branches), moves=bool(c.moves),
                   async_moves=bool(c.async_moves))
        for k in _CACHE_FIELDS:
            v = getattr(c.cache, k)
            out[k] = _CACHE_ENUMS[k][1][v] if k in _CACHE_ENUMS else v
        return out

    # -- the full groups' data plane, and the L3 shared with other instances -----

    def _check_memory(self) -> None:
        for t in self._tiers:
            t._check_memory()

    def attach(self, xfer: Any, l1: Any, l2: Any, l1_index: Optional[int] = None,
               l2_index: Optional[int] = None) -> None:
        """The full groups' pages move as bytes from now on (Cache.attach on
        the inner radix cache, kvt_hybrid_cache): L1 page i is page i of tier
        ``l1`` (the engine's full layers' K and V: a request's pages are its
        ``l1_ids``), L2 page i of tier ``l2``, copied on transfer engine
        ``xfer``. Before the first admission; the engine and tiers stay open
        while the cache is. The window and state pieces stay the engine's to
        move (:meth:`take_moves`)."""
        for t, name in ((l1, "l1"), (l2, "l2")):
            if any(t is u for u in self._piece_tiers):
                raise error(-1, "Hybrid.attach", f"{name} is a window or state group's tier (attach_pieces): a slot "
                            "would be a page")
        with self._use as h:
            self._tiers += attach_data_plane(self, lib.kvt_hybrid_cache(h), "Hybrid.attach", xfer, l1, l2, l1_index,
                                             l2_index)
            self._full_tiers = (l1, l2)

    def attach_store(self, store: Any) -> None:
        """The full groups' L3 (Cache.attach_store on the inner radix cache):
        their pages are put to ``store`` under l3_write_policy and fetched by
        :meth:`prefetch`; its tier is the attached L2. Needs no modeled L3
        (l3_bytes 0, l3_pages 0). The store stays open while the cache is."""
        with self._use as h:
            self._store = attach_store(self, lib.kvt_hybrid_cache(h), "Hybrid.attach_store", store)

    def set_l3(self, probe: Any) -> None:
        """The window and state pieces' L3, outside the cache
        (kvt_hybrid_set_l3): the engine's own store, which other instances
        fill too. ``probe(group, keys)`` answers, for keys ((hi, lo), as
        HybridMove.key) of window or state group ``group``, a flag per key
        (True or False, or an integer 0 or 1: a string or a store's result
        names are refused): does the store hold that piece. An exception in
        it (or a wrong count or kind of flags) answers "none held": counted in ``probe_errors``, kept in
        ``last_probe_error``. From then on moves with ``dst_tier`` 3 are puts
        and with ``src_tier`` 3 loads, by key (the slot UINT64_MAX). None: no
        L3 for the pieces. Needs an L2 (l2_bytes), no modeled L3 (l3_bytes 0)
        and no request admitted: InvalidArgument otherwise."""
        if probe is not None and not callable(probe):
            raise TypeError(f"Hybrid.set_l3 probe: expected a callable probe(group, keys) or None, "
                            f"not {type(probe).__name__}")
        fn = _probe_callback(self, probe) if probe is not None else HYBRID_PROBE()
        with self._use as h:
            if self._plane is not None:
                raise error(-1, "Hybrid.set_l3", "the data plane's stores are the pieces' L3 (attach_pieces)")
            check(lib.kvt_hybrid_set_l3(h, fn, None), "Hybrid.set_l3",
                  "needs an L2, no modeled L3 (l3_bytes 0), an l3_write_policy other than write_through_selective"
                  " and no request admitted")
            self._probe = fn if probe is not None else None

    @property
    def has_l3(self) -> bool:
        """An L3 behind L2: the modeled one (l3_bytes), or a store for the
        full groups (attach_store) or the pieces (set_l3, attach_pieces)."""
        return self._probe is not None or self._store is not None or self._cfg.cache.l3_pages > 0 or \
            any(self._cfg.l3_slots[:self._cfg.ngroups]) or (self._plane_keep is not None and self._plane_keep[2])

    # -- kvtier's data plane for the pieces ------------------------------------

    def attach_pieces(self, tiers: Mapping[int, Tuple[Any, Any, Any]], write: Any,
                      stores: Optional[Mapping[int, Tuple[Any, Any]]] = None) -> None:
        """kvtier moves the window and state pieces from now on
        (kvt_hybrid_plane, hybrid.h): ``tiers[g] = (xfer, l1, l2)`` for each
        window or state group g, two Tiers of a piece a page
        (:func:`piece_bytes`; at least the group's slots) on a Transfer that
        is this cache's alone; ``stores[g] = (put, get)``, optionally for
        every such group, the pieces' L3: two Stores on one URL under the
        group's own model identity, ``put``'s tier l2, ``get``'s tier l1.
        ``write(move)`` writes what a request computed (a HybridMove from
        ENGINE: window page ``src_slot`` of the request, or the state after
        ``src_slot`` pages) into L1 slot ``dst_slot`` of group ``move.group``
        and returns; an exception is a failed write (the piece a miss), kept
        in ``last_write_error``. It is called inside the calls below, on
        their thread; a call into this Hybrid from it raises InvalidArgument.
        Then :meth:`pieces_wait` before reading a hit's pieces at
        :meth:`slots`, and :meth:`pieces_poll` or :meth:`pieces_sync` after a
        release. The plane alone takes and reports the moves from then on
        (:meth:`take_moves`, :meth:`moves_done` and :meth:`set_l3` refuse),
        and alone submits to and polls its Transfers and Stores (theirs
        refuse while this Hybrid is open); groups may share a Transfer, never
        a tier or a store identity. Needs ``moves=True, async_moves=True``,
        no modeled L3 for the pieces, no request admitted and no move taken
        and not reported: InvalidArgument otherwise (nothing changed)."""
        from .store import Store
        from .tier import Tier
        from .xfer import Transfer
        if not callable(write):
            raise TypeError(f"Hybrid.attach_pieces write: expected a callable write(move), not {type(write).__name__}")
        if not isinstance(tiers, Mapping) or (stores is not None and not isinstance(stores, Mapping)):
            raise TypeError("Hybrid.attach_pieces: tiers (and stores) map a group to its (xfer, l1, l2) "
                            "(and (put, get))")
        n = self._cfg.ngroups
        deps: list = []
        plan: Dict[int, Tuple[Any, Any, Any, int, int, Any, Any]] = {}
        for g, t in tiers.items():
            g = _a.index(g, "Hybrid.attach_pieces group", n, "groups:")
            if self._cfg.groups[g].kind == KINDS.index("full"):
                raise ValueError(f"Hybrid.attach_pieces tiers[{g}]: group {g} is full attention: its pages are the "
                                 "prefix tree's (Hybrid.attach), only window and state groups have pieces")
            t = _a.sequence(t, f"Hybrid.attach_pieces tiers[{g}]")
            if len(t) != 3:
                raise TypeError(f"Hybrid.attach_pieces tiers[{g}]: expected (xfer, l1, l2), not {len(t)} items")
            xfer, l1, l2 = t
            _a.instance(xfer, Transfer, f"Hybrid.attach_pieces tiers[{g}] xfer")
            _a.instance(l1, Tier, f"Hybrid.attach_pieces tiers[{g}] l1")
            _a.instance(l2, Tier, f"Hybrid.attach_pieces tiers[{g}] l2")
            put = get = None
            if stores is not None and g in stores:
                s = _a.sequence(stores[g], f"Hybrid.attach_pieces stores[{g}]")
                if len(s) != 2:
                    raise TypeError(f"Hybrid.attach_pieces stores[{g}]: expected (put, get), not {len(s)} items")
                put, get = s
                _a.instance(put, Store, f"Hybrid.attach_pieces stores[{g}] put")
                _a.instance(get, Store, f"Hybrid.attach_pieces stores[{g}] get")
            for d, name in ((xfer, "xfer"), (put, "put"), (get, "get")):
                if d is not None:
                    d._may_drive(self, "data plane", f"Hybrid.attach_pieces tiers[{g}] {name}" if name == "xfer"
                                 else f"Hybrid.attach_pieces stores[{g}] {name}")
            plan[g] = (xfer, l1, l2, _tier_index(xfer, l1, f"Hybrid.attach_pieces tiers[{g}] l1"),
                       _tier_index(xfer, l2, f"Hybrid.attach_pieces tiers[{g}] l2"), put, get)
            deps += [d for d in (xfer, l1, l2, put, get) if d is not None and all(d is not e for e in deps)]
        if stores is not None:
            for g in stores:
                if g not in plan:
                    raise ValueError(f"Hybrid.attach_pieces: stores[{g!r}] without tiers[{g!r}]")
        for g, (_, l1, l2, *_) in plan.items():
            if any(t is u for t in (l1, l2) for u in self._full_tiers):
                raise error(-1, "Hybrid.attach_pieces", f"tiers[{g}]: a tier of the full groups (attach): a slot "
                            "would be a page")
            not_anothers(self, (l1, l2), f"Hybrid.attach_pieces tiers[{g}]")
        cfg = HybridPlaneConfig(size=ctypes.sizeof(HybridPlaneConfig))
        fn = _write_callback(self, write)
        cfg.write = fn
        plane = ctypes.c_void_p()
        with self._use as h, using(*deps) as ptrs:
            at = {id(d): p for d, p in zip(deps, ptrs)}
            for g, (xfer, l1, l2, i1, i2, put, get) in plan.items():
                cfg.groups[g] = HybridPlaneGroup(at[id(xfer)], at[id(l1)], at[id(l2)], i1, i2,
                                                 at[id(put)] if put is not None else None,
                                                 at[id(get)] if get is not None else None)
            if self._plane is not None:
                raise error(-1, "Hybrid.attach_pieces", "the pieces have a data plane already")
            check(lib.kvt_hybrid_plane_create(ctypes.byref(plane), h, ctypes.byref(cfg)), "Hybrid.attach_pieces",
                  "needs moves=True and async_moves=True, no modeled L3 for the pieces, no request admitted, no move "
                  "taken and not reported, every window and state group's tiers (a piece a page, at least its "
                  "slots; l1 not l2, no tier another group's), Transfers and Stores with no batches on them, and "
                  "stores for every such group or none (put over l2, get over l1, both on one URL, one model "
                  "identity a group, not the full groups' store's: attach_store; an l3_write_policy other than "
                  "write_through_selective)")
            self._plane = plane.value
            self._plane_keep = (fn, cfg, bool(stores))
            self._own(h, deps)
            for d in deps:
                if not isinstance(d, Tier):
                    d._drive(self, "data plane")
            self._tiers += [t for t in deps if isinstance(t, Tier) and t._probes]
            self._piece_tiers = tuple(d for d in deps if isinstance(d, Tier))

    def _plane_of(self, what: str) -> int:
        if self._plane is None:
            raise error(-1, what, "no data plane for the pieces (attach_pieces)")
        return self._plane

    def pieces_poll(self, timeout: float = 0.0) -> None:
        """Starts the pieces' moves the cache hands out and reports those
        that completed, waiting up to ``timeout`` seconds for one while
        some is in flight (kvt_hybrid_plane_poll)."""
        t = _a.number(timeout, "Hybrid.pieces_poll timeout", 0, 3600)
        self._check_memory()
        with self._use as h:
            check(lib.kvt_hybrid_plane_poll(self._plane_of("Hybrid.pieces_poll"), int(t * 1e9)), "Hybrid.pieces_poll")

    def pieces_wait(self, req: HybridRequest) -> bool:
        """Runs the pieces' moves until req's pieces are in L1: True, or
        False when one of them failed (recompute what the others cannot
        continue: hybrid_longest). InvalidArgument for a request not live here."""
        _a.instance(req, HybridRequest, "Hybrid.pieces_wait req")
        self._check_memory()
        with self._use as h:
            if req._hybrid is not self or not self._holds(req):
                raise error(-1, "Hybrid.pieces_wait", "the request is not live here (another cache's, or released)")
            rc = lib.kvt_hybrid_plane_wait(self._plane_of("Hybrid.pieces_wait"), ctypes.byref(req._req))
        if rc == IOFailure.code:
            return False
        check(rc, "Hybrid.pieces_wait")
        return True

    def pieces_sync(self) -> None:
        """Runs the pieces' moves until none is outstanding."""
        self._check_memory()
        with self._use as h:
            check(lib.kvt_hybrid_plane_sync(self._plane_of("Hybrid.pieces_sync")), "Hybrid.pieces_sync")

    def pieces_stats(self) -> Dict[str, int]:
        """The data plane's counters (KVT_HYBRID_PLANE_STATS_FIELDS), and
        ``in_flight``: moves started and not yet reported."""
        st = HybridPlaneStats(size=ctypes.sizeof(HybridPlaneStats))
        with self._use as h:
            p = self._plane_of("Hybrid.pieces_stats")
            check(lib.kvt_hybrid_plane_stats(p, ctypes.byref(st)), "Hybrid.pieces_stats")
            out = {k: getattr(st, k) for k in HYBRID_PLANE_STATS}
            out["in_flight"] = lib.kvt_hybrid_plane_in_flight(p)
        return out

    def prefetch(self, tokens: Any, ns: int = 0) -> HybridPrefetch:
        """Starts the full groups' L3 prefetch of a request that just arrived
        (Cache.prefetch on the inner cache); pass it to the request's admit.
        A no-op prefetch (id 0) without an attached store, below the
        threshold, or with nothing of it in L3."""
        return self._start_prefetch("Hybrid.prefetch", tokens, ns, lib.kvt_hybrid_cache, HybridPrefetch)

    @property
    def prefetches(self) -> int:
        """The full groups' prefetches started and not yet finished or cancelled."""
        with self._use as h:
            return lib.kvt_cache_prefetches(lib.kvt_hybrid_cache(h))

    def poll(self) -> int:
        """Applies the full groups' copies that completed; how many."""
        with self._use as h:
            self._check_memory()
            return check(lib.kvt_cache_poll(lib.kvt_hybrid_cache(h)), "Hybrid.poll")

    def sync(self) -> None:
        """Waits for every copy and store call of the full groups in flight
        (their puts to L3 included): before reading what other instances
        find in the store."""
        with self._use as h:
            self._check_memory()
            check(lib.kvt_cache_sync(lib.kvt_hybrid_cache(h)), "Hybrid.sync")

    # -- requests ------------------------------------------------------------

    def admit(self, tokens: Any, ns: int = 0, priority: int = 0,
              prefetch: Optional[HybridPrefetch] = None) -> HybridRequest:
        """Admits a request: the full groups' match m, then the longest n <= m
        the match rule allows; the pieces n needs are loaded into L1 and pinned.
        ``prefetch``: the request's :meth:`prefetch`, finished first (the
        full groups' pages it fetched from L3 count in m)."""
        ns = _a.u32(ns, "Hybrid.admit ns")
        priority = _a.i32(priority, "Hybrid.admit priority")
        if prefetch is not None:
            _a.instance(prefetch, HybridPrefetch, "Hybrid.admit prefetch", optional=True)
        addr, n, keep = tokens_arg(tokens)
        own = array.array("i")  # a copy: the engine may reuse its buffer before the release
        own.frombytes(ctypes.string_at(addr, 4 * n) if n else b"")  # before the admission: nothing can fail after it
        req = HybridReq()
        with self._use as h:
            self._check_memory()
            need = n // self._cfg.cache.page_tokens + 1
            if len(self._ids) < need:
                self._ids = array.array("I", bytes(4 * max(need, 2 * len(self._ids))))
            pid = 0
            if prefetch is not None:
                if prefetch._cache is not self or prefetch.done and prefetch.id:
                    raise error(-1, "Hybrid.admit", "the prefetch is not this cache's, or is over")
                pid = prefetch.id
            rc = lib.kvt_hybrid_admit_prefetched(h, pid, ns, addr, n, priority, self._ids.buffer_info()[0],
                                                 ctypes.byref(req))
            if rc < 0:
                raise error(rc, "Hybrid.admit", "the tokens are not those the prefetch was started with, or an"
                            " unknown prefetch" if pid and rc == -1 else "")
            if prefetch is not None:
                prefetch._finished()
            r = HybridRequest(self, req, ns, own, self._ids[:req.full.pages], n)
            self._hold(r, req)
        return r

    def release(self, req: HybridRequest, tokens: Any = None) -> None:
        """The request ran over its tokens from ``hit_pages`` on: lets go of it
        and keeps what it leaves behind (hybrid.h). ``tokens``: the tokens it
        was admitted with (None: those, as given to admit). InvalidArgument
        for a request not admitted here, released already, or other tokens."""
        _a.instance(req, HybridRequest, "Hybrid.release req")
        addr, n, keep = tokens_arg(req._tokens if tokens is None else tokens)
        with self._use as h:
            if req._hybrid is not self or not self._holds(req):
                raise error(-1, "Hybrid.release", "the request is not live here (another cache's, or released)")
            self._check_memory()
            rc = lib.kvt_hybrid_release(h, req._ns, addr, n, ctypes.byref(req._req))
            del keep
            if rc == -1:  # nothing changed: the tokens are not the request's
                raise error(rc, "Hybrid.release", "the tokens are not those the request was admitted with")
            req.released = True
            del self._live[req._key]
            check(rc, "Hybrid.release")

    def abort(self, req: HybridRequest) -> None:
        """Lets go of a request whose forward pass did not run or failed: the
        full groups' new pages hold no KV and leave the cache, its pieces are
        unpinned and nothing is stored for it; what its hit matched or loaded
        stays cached. Busy (nothing changed) while a request admitted after
        it matched its new pages: abort that one first. InvalidArgument for a
        request not live here."""
        _a.instance(req, HybridRequest, "Hybrid.abort req")
        with self._use as h:
            if req._hybrid is not self or not self._holds(req):
                raise error(-1, "Hybrid.abort", "the request is not live here (another cache's, or released)")
            check(lib.kvt_hybrid_abort(h, ctypes.byref(req._req)), "Hybrid.abort",
                  "a request admitted after it matched its new pages: abort that one first; this one is still held")
            req.released = True
            del self._live[req._key]

    # -- the bytes -------------------------------------------------------------

    def take_moves(self) -> List[HybridMove]:
        """The copies recorded since the last call, oldest first, and forgets
        them. Run them in this order, after every admit (before reading
        :meth:`slots`) and every release: a slot's old piece leaves before its
        new one arrives, and a piece is in a tier before it is copied on.
        InvalidArgument when the cache was made without ``moves=True``."""
        with self._use as h:
            if not self._cfg.moves:
                raise error(-1, "Hybrid.take_moves", "the cache records no moves (made without moves=True)")
            if self._plane is not None:
                raise error(-1, "Hybrid.take_moves", "the data plane takes the moves (attach_pieces)")
            out: List[HybridMove] = []
            while True:
                want = lib.kvt_hybrid_moves(h)
                if not want:
                    return out
                buf = (HybridMove_ * want)()
                got = lib.kvt_hybrid_take_moves(h, buf, want)
                out += [HybridMove(m.group, m.src_tier, m.dst_tier, m.src_slot, m.dst_slot, (m.key.hi, m.key.lo))
                        for m in buf[:got]]

    def pending_moves(self) -> int:
        """Moves recorded and not yet taken (kvt_hybrid_moves); with
        async_moves, those ready to be taken."""
        with self._use as h:
            return lib.kvt_hybrid_moves(h)

    def moves_done(self, moves: Sequence[HybridMove], ok: Union[bool, Sequence[bool]] = True) -> None:
        """Reports moves taken (async_moves): each landed (ok true) or failed
        (its piece then absent from that tier, a miss). ``ok``: one flag for
        all, or one per move. InvalidArgument, nothing changed, for a cache
        without async_moves or a move not taken, or reported already (each
        once); TypeError / ValueError for what is not a list of HybridMove
        or a flag count that differs."""
        if not isinstance(moves, (list, tuple)) or not all(isinstance(m, HybridMove) for m in moves):
            raise TypeError("Hybrid.moves_done moves: expected a list of HybridMove (as take_moves returns)")
        one = _a.is_bool(ok)
        try:
            flags = [bool(ok)] * len(moves) if one else list(ok)
        except TypeError:
            flags = None
        if flags is None or len(flags) != len(moves) or \
                not all(_a.is_bool(f) for f in flags):
            raise ValueError(f"Hybrid.moves_done ok: expected a bool or {len(moves)} bools, one per move")
        buf = (HybridMove_ * max(len(moves), 1))()
        for i, m in enumerate(moves):  # each field checked: ctypes would wrap one out of range into another move
            w = f"Hybrid.moves_done moves[{i}]"
            buf[i].group, buf[i].src_tier, buf[i].dst_tier = (_a.u32(m.group, f"{w} group"),
                                                              _a.u32(m.src_tier, f"{w} src_tier"),
                                                              _a.u32(m.dst_tier, f"{w} dst_tier"))
            buf[i].src_slot, buf[i].dst_slot = _a.u64(m.src_slot, f"{w} src_slot"), _a.u64(m.dst_slot, f"{w} dst_slot")
            if not isinstance(m.key, tuple) or len(m.key) != 2:
                raise TypeError(f"{w} key: expected (hi, lo), not {m.key!r}")
            buf[i].key.hi, buf[i].key.lo = _a.u64(m.key[0], f"{w} key hi"), _a.u64(m.key[1], f"{w} key lo")
        okb = (ctypes.c_uint8 * max(len(moves), 1))(*[int(f) for f in flags])
        with self._use as h:
            if self._plane is not None:
                raise error(-1, "Hybrid.moves_done", "the data plane reports the moves (attach_pieces)")
            check(lib.kvt_hybrid_moves_done(h, buf, len(moves), okb), "Hybrid.moves_done",
                  "a cache without async_moves, or a move not taken here or reported already")

    def outstanding_moves(self) -> int:
        """Moves taken and not yet reported, and moves waiting for a slot's
        copy down before they are handed out (async_moves)."""
        with self._use as h:
            return lib.kvt_hybrid_moves_outstanding(h)

    def engine_waiting(self, tokens: Any, ns: int = 0) -> int:
        """Moves from the engine of a released request's pieces (its tokens,
        its namespace) not handed out yet, waiting for a slot's copy down
        (async_moves): while any is, keep what the request computed."""
        hashes = page_hashes(tokens, self.page_tokens, ns)
        keys = (Key128 * max(len(hashes), 1))(*[Key128(hi, lo) for lo, hi in hashes])
        with self._use as h:
            return lib.kvt_hybrid_engine_waiting(h, keys, len(hashes))

    def ready(self, req: HybridRequest) -> Optional[bool]:
        """Whether req's pieces are all in L1 (async_moves; always True
        without): True, False while a copy into L1 is in flight, None when
        one failed (recompute what the pieces it has cannot continue:
        hybrid_longest). InvalidArgument for a request not live here."""
        _a.instance(req, HybridRequest, "Hybrid.ready req")
        with self._use as h:
            if req._hybrid is not self or not self._holds(req):
                raise error(-1, "Hybrid.ready", "the request is not live here (another cache's, or released)")
            rc = lib.kvt_hybrid_ready(h, ctypes.byref(req._req))
        if rc == TryAgain.code:
            return False
        if rc == IOFailure.code:
            return None
        check(rc, "Hybrid.ready")
        return True

    def slots(self, req: HybridRequest, g: int) -> array.array:
        """The L1 slots (array of uint64) of the pieces group g needs for
        req's hit, pinned until req is released: for a window group, the
        pages floor(max(0, nP - W) / P) .. n - 1 in order; for a state group,
        the checkpoint at n; empty for a full group or no hit. Valid once the
        admission's moves have run (with async_moves: once :meth:`ready`).
        InvalidArgument for a request not live here, IOFailure when one of
        them failed to reach L1, TryAgain while one is on its way there,
        IndexError for g out of range."""
        _a.instance(req, HybridRequest, "Hybrid.slots req")
        g = _a.index(g, "Hybrid.slots group", self._cfg.ngroups, "groups:")
        gr = self._cfg.groups[g]
        n = req._req.hit_pages
        cap = 0 if gr.kind == 0 or n == 0 else 1 if gr.kind == 2 else min(n, gr.window // self.page_tokens + 2)
        with self._use as h:
            if req._hybrid is not self or not self._holds(req):
                raise error(-1, "Hybrid.slots", "the request is not live here (another cache's, or released)")
            while True:
                out = array.array("Q", bytes(8 * max(cap, 1)))
                got = ctypes.c_size_t()
                rc = lib.kvt_hybrid_slots(h, ctypes.byref(req._req), g,
                                          ctypes.cast(out.buffer_info()[0], ctypes.POINTER(ctypes.c_uint64)), cap,
                                          ctypes.byref(got))
                if rc == OutOfRange.code and got.value > cap:  # cap was short: got says how many
                    cap = got.value
                    continue
                check(rc, "Hybrid.slots")
                return out[:got.value]

    # -- introspection -------------------------------------------------------

    def stats(self) -> Dict[str, int]:
        """kvt_hybrid_stats_t as a dict (the fields of KVT_HYBRID_STATS_FIELDS)."""
        st = HybridStats(size=ctypes.sizeof(HybridStats))
        with self._use as h:
            check(lib.kvt_hybrid_stats(h, ctypes.byref(st)), "Hybrid.stats")
        return {k: getattr(st, k) for k in HYBRID_STATS}

    def cache_stats(self) -> Dict[str, int]:
        """The full groups' radix cache's statistics (Cache.stats)."""
        st = CacheStats(size=ctypes.sizeof(CacheStats))
        with self._use as h:
            check(lib.kvt_cache_stats(lib.kvt_hybrid_cache(h), ctypes.byref(st)), "Hybrid.cache_stats")
        return {k: getattr(st, k) for k, _, _ in _fields.CACHE_STATS}

    def group_bytes(self, g: int) -> Dict[str, Tuple[int, int, int]]:
        """What group g holds in L1, L2, L3: {"bytes": (...), "slots": (...)}
        (a full group: its share of the radix pages)."""
        g = _a.index(g, "Hybrid.group_bytes group", self._cfg.ngroups, "groups:")
        out = HybridGroupBytes()
        with self._use as h:
            check(lib.kvt_hybrid_group_bytes(h, g, ctypes.byref(out)), "Hybrid.group_bytes")
        return {"bytes": tuple(out.bytes), "slots": tuple(out.slots)}

    @property
    def digest(self) -> int:
        """A running hash of the cache's decisions, the full pages' and every
        group's pieces' (kvt_hybrid_digest): caches fed the same calls agree on
        it exactly when they decided alike. Kept only by a cache made with
        ``decision_digest=True``; 0 otherwise."""
        with self._use as h:
            return lib.kvt_hybrid_digest(h)

    def check(self) -> None:
        """Recomputes every invariant (the full cache's, each keyed cache's,
        the pins'); Corrupt naming the first broken one."""
        why = ctypes.c_char_p()
        with self._use as h:
            rc = lib.kvt_hybrid_check(h, ctypes.byref(why))
        if rc < 0:
            raise error(rc, "Hybrid.check", (why.value or b"").decode())

    def __repr__(self) -> str:
        if self.closed:
            return "<kvtier.Hybrid closed>"
        kinds = ",".join(g.kind + (f":{g.window}" if g.window else "") for g in self.groups)
        return f"<kvtier.Hybrid {kinds} L1 {self._cfg.cache.l1_pages} full pages of {self.page_tokens} tokens>"
