"""kvtier's statistics as a prometheus_client collector, registered next to
an engine's own metrics::

    from prometheus_client import REGISTRY
    from kvtier.prometheus import KvtierCollector
    REGISTRY.register(KvtierCollector(cache=cache, store=store, labels={"instance": "decode-0"}))

Names follow the rules of `kvtier replay --stats prom` (counters end in
_total, values in ns or µs are written in seconds and named _seconds):
kvtier_cache_<field>, kvtier_tree_<field>, kvtier_l3_store_<op>_<field>,
kvtier_xfer_<field>{src=,dst=} (the tier indices as labels, where the
command names the pair in the family: kvtier_xfer_l1_to_l2_<field>).
Counters and gauges only: the latency histograms are the command's. Help
texts are the headers' own. Objects that are closed are skipped. Several
caches of one process: one collector, ``add`` for each after the first,
each with its own label values::

    REGISTRY.register(KvtierCollector(cache=a, labels={"instance": "a"}).add(cache=b, labels={"instance": "b"}))
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
        names = list(have[0][1])
        m = cls(f"{prefix}_{name}", help_text, labels=names)
        for v, lb in have:
            m.add_metric([lb[k] for k in names], float(v[field]) / scale)
        yield m


# What the command adds to a store's fields (kvt_store_emit): its usage, as gauges
_STORE_USAGE = (("stored_bytes", "GAUGE", "bytes the filesystem charges for the objects this process knows of (dir)"),
                ("stored_objects", "GAUGE", "objects this process knows of (dir)"))


class _Source:
    """One set of objects a collector reports, with its labels."""

    def __init__(self, cache: Any, store: Any, xfer: Any, xfer_pairs, labels: Optional[Dict[str, str]]) -> None:
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
            if tuple(pr) in self.xfer_pairs:  # (its series would be written twice: an exposition no scraper takes)
                raise ValueError(f"KvtierCollector xfer_pairs: {pr!r} given twice")
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

    def samples(self, p: str, out: Dict[Tuple[str, Any], list]) -> None:
        """This source's (values, labels) for each (family prefix, spec); a
        closed object skipped (a scrape runs on the HTTP server's thread: an
        object may close meanwhile)."""
        lb = self.labels
        if self.cache is not None:
            try:
                cache, tree = self.cache.stats(), self.cache.tree_stats()
                out.setdefault((f"{p}_cache", _fields.CACHE_STATS), []).append((cache, lb))
                out.setdefault((f"{p}_tree", _fields.RADIX_STATS), []).append((tree, lb))
            except ClosedError:
                pass
        if self.store is not None:
            try:
                for op in OPS:
                    st = self.store.stats(op)
                    if st["calls"] or st["inflight"]:
                        out.setdefault((f"{p}_l3_store_{op}", _fields.STORE_STATS + _STORE_USAGE), []).append((st, lb))
            except ClosedError:
                pass
        if self.xfer is not None:
            try:
                pairs = [(self.xfer.stats(src, dst), dict(lb, src=str(src), dst=str(dst))) for src, dst in self.xfer_pairs]
                out.setdefault((f"{p}_xfer", _fields.XFER_STATS), []).extend(pairs)  # one family, a sample a pair
            except ClosedError:
                pass

    def families(self, p: str) -> Iterator[Tuple[str, Any]]:
        """The (family prefix, spec)s this source can report, whatever it holds now."""
        if self.cache is not None:
            yield f"{p}_cache", _fields.CACHE_STATS
            yield f"{p}_tree", _fields.RADIX_STATS
        if self.store is not None:
            for op in OPS:
                yield f"{p}_l3_store_{op}", _fields.STORE_STATS + _STORE_USAGE
        if self.xfer is not None and self.xfer_pairs:
            yield f"{p}_xfer", _fields.XFER_STATS


class KvtierCollector:
    """Collects a Cache's, its tree's, a Store's and a Transfer engine's
    statistics at every scrape (each optional). ``add`` reports more of them
    (another cache of the process, under other label values) in the same
    families: two collectors in one registry would write each family twice,
    which is no longer valid exposition text (prometheus_client's registry
    refuses the second, naming the families)."""

    def __init__(self, cache: Any = None, store: Any = None, xfer: Any = None, xfer_pairs=(),
                 labels: Optional[Dict[str, str]] = None, prefix: str = "kvtier") -> None:
        if not isinstance(prefix, str) or not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", prefix) \
                or prefix.startswith("__"):
            raise ValueError(f"KvtierCollector prefix: {prefix!r} (expected a metric name: letters, digits, '_' "
                             "and ':', not starting with a digit or '__')")
        self._sources = [_Source(cache, store, xfer, xfer_pairs, labels)]
        self.prefix = prefix

    def add(self, cache: Any = None, store: Any = None, xfer: Any = None, xfer_pairs=(),
            labels: Optional[Dict[str, str]] = None) -> "KvtierCollector":
        """Reports these objects too, under labels with the same names as the
        first set's and other values (a family's samples have one set of
        label names, and two samples with the same labels are one series
        twice). Returns the collector."""
        src = _Source(cache, store, xfer, xfer_pairs, labels)
        first = self._sources[0].labels
        if sorted(src.labels) != sorted(first):
            raise ValueError(f"KvtierCollector.add labels: {sorted(src.labels)}: the names must be the first "
                             f"set's, {sorted(first)}")
        for other in self._sources:
            if other.labels == src.labels:
                raise ValueError(f"KvtierCollector.add labels: {src.labels!r} are another set's: each set its "
                                 "own values")
        self._sources.append(src)
        return self

    def describe(self) -> Iterator[Any]:
        """The families' names, for the registry to find a clash at
        registration (their samples come at scrape time)."""
        seen = set()
        for src in self._sources:
            for prefix, spec in src.families(self.prefix):
                for field, kind, help_text in spec:
                    name = f"{prefix}_{_name_and_scale(field)[0]}"
                    if name not in seen:
                        seen.add(name)
                        yield (CounterMetricFamily if kind == "COUNTER" else GaugeMetricFamily)(name, help_text)

    def collect(self) -> Iterator[Any]:
        samples: Dict[Tuple[str, Any], list] = {}
        for src in self._sources:
            src.samples(self.prefix, samples)
        fams: list = []
        for (prefix, spec), have in samples.items():
            fams += _families(prefix, spec, have)
        yield from fams
