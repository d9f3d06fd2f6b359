"""Prometheus families of engine truth: each backend's KV-event stream and prefix state.

Read at scrape time from :class:`~longroute.gateway.engine_truth.EngineTruth` (the
subscribers' counters) and its precise index; nothing is counted on the hot path.
O(backends with kv_events) per scrape.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from longroute.gateway.engine_truth import EngineTruth

# KVSubscriberStats field -> the reason label of longroute_kv_event_errors_total
_ERRORS = {
    "num_gaps": "gap",
    "num_resyncs_failed": "replay_failed",
    "num_decode_errors": "undecodable",
    "num_restarts": "engine_restart",
    "num_unknown_events": "unknown_event",
    "num_unmappable_events": "unmappable_event",
    "num_foreign_topic": "foreign_topic",
    "num_sink_errors": "sink_error",
}


class KVEventsCollector:
    """``longroute_kv_event_batches_total``, ``longroute_kv_events_total``,
    ``longroute_kv_event_errors_total{reason}``, ``longroute_kv_event_fallbacks_total`` and
    ``longroute_prefix_state_precise`` (1: routing on the engine's reported cache), per
    backend with kv_events."""

    def __init__(self, truth: EngineTruth) -> None:
        self.truth = truth

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        batches, events, errors, fallbacks, precise = families = self._families()
        truth = self.truth
        for name, stats in sorted(truth.stats().items()):
            batches.add_metric([name], stats.num_batches)
            events.add_metric([name], stats.num_events)
            for field, reason in _ERRORS.items():
                errors.add_metric([name, reason], getattr(stats, field))
            fallbacks.add_metric([name], truth.num_fallbacks.get(name, 0))
            precise.add_metric([name], 1.0 if truth.is_precise(name) else 0.0)
        return families

    @staticmethod
    def _families() -> tuple[
        CounterMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
    ]:
        endpoint = ["endpoint"]
        return (
            CounterMetricFamily(
                "longroute_kv_event_batches", "KV-event batches applied.", labels=endpoint
            ),
            CounterMetricFamily(
                "longroute_kv_events", "KV-cache events received.", labels=endpoint
            ),
            CounterMetricFamily(
                "longroute_kv_event_errors",
                "KV-event stream faults by reason (gaps, failed replays, undecodable batches, "
                "engine restarts, skipped events).",
                labels=["endpoint", "reason"],
            ),
            CounterMetricFamily(
                "longroute_kv_event_fallbacks",
                "Times the backend fell back to the approximate prefix index.",
                labels=endpoint,
            ),
            GaugeMetricFamily(
                "longroute_prefix_state_precise",
                "1 while the backend's prefix state comes from its KV-cache events.",
                labels=endpoint,
            ),
        )
