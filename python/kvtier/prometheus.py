"""kvtier's statistics as a prometheus_client collector, registered next to
an engine's own metrics::

    from prometheus_client import REGISTRY
    from kvtier.prometheus import KvtierCollector
    REGISTRY.register(KvtierCollector(cache=cache, store=store, labels={"instance": "decode-0"}))

Names follow `kvtier replay --stats prom`: kvtier_cache_<field>,
kvtier_tree_<field>, kvtier_store_<op>_<field> (counters end in _total);
help texts are the headers' own. Objects that are closed are skipped.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import _fields
from ._core import ClosedError
from .store import OPS

__all__ = ["KvtierCollector"]


def _families(prefix: str, spec, values: Dict[str, Any], labels: Dict[str, str]) -> Iterator[Any]:
    names, vals = list(labels), list(labels.values())
    for field, kind, help_text in spec:
        if field not in values:
            continue
        cls = CounterMetricFamily if kind == "COUNTER" else GaugeMetricFamily
        m = cls(f"{prefix}_{field}", help_text, labels=names)
        m.add_metric(vals, float(values[field]))
        yield m


class KvtierCollector:
    """Collects a Cache's, its tree's, a Store's and a Transfer engine's
    statistics at every scrape (each optional)."""

    def __init__(self, cache: Any = None, store: Any = None, xfer: Any = None, xfer_pairs=(),
                 labels: Optional[Dict[str, str]] = None, prefix: str = "kvtier") -> None:
        self.cache, self.store, self.xfer = cache, store, xfer
        self.xfer_pairs = list(xfer_pairs)  # (src, dst) tier index pairs to report
        self.labels = dict(labels or {})
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
                fams += _families(f"{p}_cache", _fields.CACHE_STATS, cache, lb)
                fams += _families(f"{p}_tree", _fields.RADIX_STATS, tree, lb)
            except ClosedError:
                pass
        if self.store is not None:
            try:
                for op in OPS:
                    st = self.store.stats(op)
                    if st["calls"] or st["inflight"]:
                        fams += _families(f"{p}_store_{op}", _fields.STORE_STATS, st, lb)
            except ClosedError:
                pass
        if self.xfer is not None:
            try:
                for src, dst in self.xfer_pairs:
                    st = self.xfer.stats(src, dst)
                    fams += _families(f"{p}_xfer", _fields.XFER_STATS, st, dict(lb, src=str(src), dst=str(dst)))
            except ClosedError:
                pass
        yield from fams
