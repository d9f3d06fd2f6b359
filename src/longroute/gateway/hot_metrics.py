"""Counters and histograms for the request path, without prometheus_client's per-update cost.

``prometheus_client``'s metric objects take a lock and go through a value object
on every update: about a microsecond a counter and two a histogram, several
times per request. The gateway updates its metrics from one event-loop thread
(scrapes render on that thread too), so :class:`HotCounter` and
:class:`HotHistogram` keep plain numbers per label set: an update is a dict
lookup (the label set's child, cached) and an addition, a histogram's also a
``bisect`` over its bounds. They are exposed in the Prometheus text format at
scrape time, by :class:`HotCollector`, as counters (``_total``) and histograms
(``_bucket{le}``, ``_sum``, ``_count``) like prometheus_client's own. Label sets
are bounded by the caller (backends and served models come from the config).
Not thread-safe: update them from the event loop only.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

MAX_LABEL_SETS = 4096
"""Label sets a family keeps; further ones share one ``overflow`` child, so a family never
grows without bound."""


class _Bucketed:
    """One histogram child: counts per bucket (the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """One observation: O(log buckets)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Counted:
    """One counter child."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


_Child = TypeVar("_Child", _Counted, _Bucketed)


class _Family(Generic[_Child]):
    """Children by label values; a label set past MAX_LABEL_SETS shares an overflow child."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], _Child] = {}

    def labels(self, *values: str) -> _Child:
        """The child of one label set: one dict lookup once it exists."""
        child = self.children.get(values)
        if child is None:
            child = self._child(values)
        return child

    def _child(self, labels: tuple[str, ...]) -> _Child:
        child = self.children.get(labels)
        if child is None:
            if len(self.children) >= MAX_LABEL_SETS:
                labels = ("overflow",) * len(self.labelnames)
                child = self.children.get(labels)
            if child is None:
                child = self.children[labels] = self._new()
        return child

    def _new(self) -> _Child:
        raise NotImplementedError


class HotCounter(_Family[_Counted]):
    """A labelled counter: ``labels(*values).inc(n)`` (the child may be kept and reused)."""

    def _new(self) -> _Counted:
        return _Counted()

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, child in self.children.items():
            family.add_metric(list(labels), child.value)
        return family


class HotHistogram(_Family[_Bucketed]):
    """A histogram, labelled or not: ``labels(*values).observe(v)``, or ``observe(v)``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(sorted(buckets))
        if not labelnames:
            self._only = self._child(())

    def _new(self) -> _Bucketed:
        return _Bucketed(self.bounds)

    def observe(self, value: float) -> None:
        """An observation of the unlabelled histogram."""
        self._only.observe(value)

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        edges = [repr(float(b)) for b in self.bounds] + ["+Inf"]
        for labels, child in self.children.items():
            cumulative, buckets = 0, []
            for edge, count in zip(edges, child.counts, strict=True):
                cumulative += count
                buckets.append((edge, float(cumulative)))
            family.add_metric(list(labels), buckets, child.sum)
        return family


class HotCollector:
    """Exposes hot families to a prometheus_client registry, read at each scrape."""

    def __init__(self, families: Iterable[HotCounter | HotHistogram]) -> None:
        self.families = tuple(families)

    def collect(self) -> Iterable[Metric]:
        return [family.metric() for family in self.families]

    def describe(self) -> Iterable[Metric]:
        return self.collect()


__all__ = ["MAX_LABEL_SETS", "HotCollector", "HotCounter", "HotHistogram"]
