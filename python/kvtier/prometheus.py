"""kvtier's statistics as a prometheus_client collector, registered next to
an engine's own metrics::

    from prometheus_client import REGISTRY
    from kvtier.prometheus import KvtierCollector
    REGISTRY.register(KvtierCollector(cache=cache, store=store, labels={"instance": "decode-0"}))

Names follow the rules of `kvtier replay --stats prom` (counters end in
_total, values in ns or µs are written in seconds and named _seconds):
kvtier_cache_<field>, kvtier_tree_<field>, kvtier_store_<op>_<field>,
kvtier_xfer_<field>{src=,dst=} (the tier indices as labels, where the
command names the pair in the family: kvtier_xfer_l1_to_l2_<field>).
Counters and gauges only: the latency histograms are the command's. Help
texts are the headers' own. Objects that are closed are skipped.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import _args as _a
from . import _fields
from ._core import ClosedError
from .store import OPS

__all__ = ["KvtierCollector"]


# A field's unit suffix, and what its value is divided by to be in seconds
_SECONDS = (("_ns", 1e9), ("_micros", 1e6))
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # Prometheus's label names


def _name_and_scale(field: str) -> Tuple[str, float]:
    """A field's family name (before _total) and its divisor: busy_ns is
    busy_seconds, in seconds, as the command writes it."""
    for suffix, scale in _SECONDS:
        if field.endswith(suffix):
            return field[:-len(suffix)] + "_seconds", scale
    return field, 1.0


def _families(prefix: str, spec, samples: List[Tuple[Dict[str, Any], Dict[str, str]]]) -> Iterator[Any]:
    """One family per field of spec, with a sample per (values, labels) that has it:
    a family named twice is not valid exposition text."""
    for field, kind, help_text in spec:
        have = [(v, lb) for v, lb in samples if field in v]
        if not have:
            continue
        name, scale = _name_and_scale(field)
        cls = CounterMetricFamily if kind == "COUNTER" else GaugeMetricFamily
        m = cls(f"{prefix}_{name}", help_text, labels=list(have[0][1]))
        for v, lb in have:
            m.add_metric(list(lb.values()), float(v[field]) / scale)
        yield m


class KvtierCollector:
    """Collects a Cache's, its tree's, a Store's and a Transfer engine's
    statistics at every scrape (each optional)."""

    def __init__(self, cache: Any = None, store: Any = None, xfer: Any = None, xfer_pairs=(),
                 labels: Optional[Dict[str, str]] = None, prefix: str = "kvtier") -> None:
        from .cache import Cache
        from .xfer import Transfer
        from .store import Store
        _a.instance(cache, Cache, "KvtierCollector cache", optional=True)
        _a.instance(store, Store, "KvtierCollector store", optional=True)
        _a.instance(xfer, Transfer, "KvtierCollector xfer", optional=True)
        self.cache, self.store, self.xfer = cache, store, xfer
        self.xfer_pairs = []  # (src, dst) tier index pairs to report
        for pr in xfer_pairs:
            if not (isinstance(pr, (list, tuple)) and len(pr) == 2 and
                    all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in pr)):
                raise ValueError(f"KvtierCollector xfer_pairs: {pr!r} is not a (src, dst) pair of tier indices")
            self.xfer_pairs.append(tuple(pr))
        if self.xfer_pairs and xfer is None:
            raise ValueError("KvtierCollector xfer_pairs: given without an xfer")
        for pr in self.xfer_pairs:  # (checked now: a scrape that raised would fail the engine's registry too)
            if max(pr) >= len(xfer._tiers):
                raise ValueError(f"KvtierCollector xfer_pairs: {pr!r}: the Transfer has {len(xfer._tiers)} tiers")
        self.labels = dict(labels or {})
        for k, v in self.labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"KvtierCollector labels: {k!r}: {v!r}: names and values are strings")
            if not _LABEL.fullmatch(k) or k.startswith("__") or k in ("src", "dst"):
                raise ValueError(f"KvtierCollector labels: {k!r}: a label name is [a-zA-Z_][a-zA-Z0-9_]*, not "
                                 "starting with __ and not one the collector sets (src, dst)")
        self.prefix = prefix

    def describe(self):
        return []  # collected at scrape time only (the objects may close)

    def collect(self) -> Iterator[Any]:
        # a scrape runs on the HTTP server's thread: an object may close meanwhile (ClosedError: skipped)
        p, lb = self.prefix, self.labels
        fams: list = []
        if self.cache is not None:
            try:
                cache, tree = self.cache.stats(), self.cache.tree_stats()
                fams += _families(f"{p}_cache", _fields.CACHE_STATS, [(cache, lb)])
                fams += _families(f"{p}_tree", _fields.RADIX_STATS, [(tree, lb)])
            except ClosedError:
                pass
        if self.store is not None:
            try:
                for op in OPS:
                    st = self.store.stats(op)
                    if st["calls"] or st["inflight"]:
                        fams += _families(f"{p}_store_{op}", _fields.STORE_STATS, [(st, lb)])
            except ClosedError:
                pass
        if self.xfer is not None:
            try:
                pairs = [(self.xfer.stats(src, dst), dict(lb, src=str(src), dst=str(dst))) for src, dst in self.xfer_pairs]
                fams += _families(f"{p}_xfer", _fields.XFER_STATS, pairs)  # one family, a sample a pair
            except ClosedError:
                pass
        yield from fams
