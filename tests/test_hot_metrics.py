"""The request path's counters and histograms expose what prometheus_client's own would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from longroute.gateway import hot_metrics
from longroute.gateway.hot_metrics import HotCollector, HotCounter, HotHistogram

BUCKETS = (0.01, 0.1, 1.0, 10.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_hot_families_render_as_prometheus_clients_own() -> None:
    values = [0.005, 0.01, 0.05, 0.1, 0.5, 2.0, 20.0, 0.1]
    hot, plain = CollectorRegistry(), CollectorRegistry()
    counter = HotCounter("x_requests", "doc", ["code"])
    histogram = HotHistogram("x_seconds", "doc", ["endpoint"], buckets=BUCKETS)
    single = HotHistogram("x_decision_seconds", "doc", buckets=BUCKETS)
    hot.register(HotCollector([counter, histogram, single]))
    ref_counter = Counter("x_requests", "doc", ["code"], registry=plain)
    ref_histogram = Histogram("x_seconds", "doc", ["endpoint"], buckets=BUCKETS, registry=plain)
    ref_single = Histogram("x_decision_seconds", "doc", buckets=BUCKETS, registry=plain)
    for i, value in enumerate(values):
        code, endpoint = ("200", "a") if i % 3 else ("503", "b")
        counter.labels(code).inc()
        ref_counter.labels(code).inc()
        histogram.labels(endpoint).observe(value)
        ref_histogram.labels(endpoint).observe(value)
        single.observe(value)
        ref_single.observe(value)
    assert _samples(hot) == _samples(plain)


def test_label_sets_past_the_bound_share_one_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hot_metrics, "MAX_LABEL_SETS", 3)
    counter = HotCounter("x", "doc", ["model"])
    for name in ("a", "b", "c", "d", "e"):
        counter.labels(name).inc()
    assert set(counter.children) == {("a",), ("b",), ("c",), ("overflow",)}
    assert counter.labels("overflow").value == 2.0
