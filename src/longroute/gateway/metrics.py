"""The gateway's Prometheus metrics, in its own CollectorRegistry.

Per-request work is a few counter increments and histogram observations;
gauges of live state (in-flight requests and tokens per backend, queue
depth, health, RTT, scraped engine load, the router-side prefix index's
blocks per backend and its bound) are read from the FleetView and the
admission queue only when ``/metrics`` is scraped, so they cost the request
path nothing. So are, for a router that learns time corrections (``ttca``'s
``calibration()``), each backend's last predicted and observed TTFT and TPOT
and its learned corrections; other routers export none of these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from longroute.estimators.service_time import Calibration
from longroute.gateway.hot_metrics import HotCollector, HotCounter, HotHistogram
from longroute.gateway.observe import RequestTrace
from longroute.routing.fleet_view import FleetView

LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# label sets whose counter child is kept at hand (model labels come from clients)
MAX_CACHED_LABEL_SETS = 4096
DECISION_BUCKETS_S = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class GatewayMetrics:
    """Counters and histograms updated per request; live gauges collected on scrape."""

    def __init__(
        self,
        fleet: FleetView | None,
        queue_depth: Callable[[], int],
        calibration: Callable[[], Mapping[str, Calibration]] | None = None,
        *,
        is_healthy: Callable[[str], bool] | None = None,
    ) -> None:
        """``calibration``: the router's ``calibration()``, read per scrape; None when the
        router has none (no calibration metrics then). ``is_healthy(endpoint)``: the
        health verdict ``longroute_backend_healthy`` shows, read per scrape (the gateway
        gives its health monitor's, the one ``/ready`` reads); None: the fleet view's.
        ``fleet`` None: the live gauges come with :meth:`watch` (the gateway builds its
        metrics before its fleet view)."""
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = HotCounter(
            "longroute_requests",
            "Requests answered, by route, requested model, backend and HTTP status.",
            ["route", "model", "endpoint", "code"],
        )
        self.errors = Counter("longroute_errors", "Errors by kind.", ["kind"], registry=registry)
        self.retries = Counter(
            "longroute_retries", "Failover attempts on another backend.", registry=registry
        )
        self.ttft = HotHistogram(
            "longroute_ttft_seconds",
            "Time to the first streamed byte, from the request's arrival, by served model "
            "and backend.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS_S,
        )
        self.e2e = HotHistogram(
            "longroute_e2e_seconds",
            "Time to the last byte of an answered request, from its arrival, by served "
            "model and backend.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS_S,
        )
        self.failovers = Counter(
            "longroute_failovers",
            "Attempts that failed before any byte reached the client and were tried on "
            "another backend, by reason (backend_connect, backend_5xx, backend_auth, "
            "backend_disconnect, backend_empty).",
            ["reason"],
            registry=registry,
        )
        self.usage = UsageCounters()
        self.reloads = Counter(
            "longroute_config_reloads",
            "Config reloads (SIGHUP, POST /admin/reload) by result: ok, or error (the old "
            "config kept serving).",
            ["result"],
            registry=registry,
        )
        for result in ("ok", "error"):
            self.reloads.labels(result)
        self.decision = HotHistogram(
            "longroute_routing_decision_seconds",
            "Time spent in the router's route() call.",
            buckets=DECISION_BUCKETS_S,
        )
        usage = self.usage
        registry.register(
            HotCollector([self.requests, self.ttft, self.e2e, self.decision, *usage.families])
        )
        self.context_requests = Counter(
            "longroute_context_requests",
            "Requests with documents planned by context reuse.",
            registry=registry,
        )
        self.context_documents = Counter(
            "longroute_context_documents",
            "Documents received in planned requests.",
            registry=registry,
        )
        self.context_deduplicated = Counter(
            "longroute_context_documents_deduplicated",
            "Documents replaced by a reference to an earlier turn of their conversation.",
            registry=registry,
        )
        self.context_reordered = Counter(
            "longroute_context_requests_reordered",
            "Planned requests whose documents were sent in another order than given.",
            registry=registry,
        )
        self._queue_depth = queue_depth
        self._is_healthy = is_healthy
        self._calibration: _CalibrationCollector | None = None
        if fleet is not None:
            self.watch(fleet, calibration)
        self._request_counts: dict[tuple[str, str, str, int], Any] = {}

    def watch(
        self,
        fleet: FleetView,
        calibration: Callable[[], Mapping[str, Calibration]] | None = None,
    ) -> None:
        """Collects the live gauges of ``fleet`` at each scrape; once."""
        self.registry.register(_LiveCollector(fleet, self._queue_depth, self._is_healthy))
        self.set_calibration(fleet, calibration)

    def set_calibration(
        self, fleet: FleetView, calibration: Callable[[], Mapping[str, Calibration]] | None
    ) -> None:
        """The router's ``calibration()`` (None: the router learns none); a reload that
        changes the router calls it again."""
        if self._calibration is not None:
            self.registry.unregister(self._calibration)
            self._calibration = None
        if calibration is not None:
            self._calibration = _CalibrationCollector(fleet, calibration)
            self.registry.register(self._calibration)

    def count_request(self, route: str, model: str, endpoint: str, status: int) -> None:
        """One answered request; the labelled child is looked up once per label set."""
        key = (route, model, endpoint, status)
        child = self._request_counts.get(key)
        if child is None:
            if len(self._request_counts) >= MAX_CACHED_LABEL_SETS:
                self._request_counts.clear()
            child = self.requests.labels(route, model, endpoint, str(status))
            self._request_counts[key] = child
        child.inc()

    def observe_ttft(self, model: str, endpoint: str, seconds: float) -> None:
        self.ttft.labels(model, endpoint).observe(seconds)

    def observe_e2e(self, model: str, endpoint: str, seconds: float) -> None:
        self.e2e.labels(model, endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class UsageCounters:
    """Tokens per served model and backend, from each answer's usage
    (:meth:`~longroute.gateway.observe.RequestTrace.usage`): a request sink."""

    def __init__(self) -> None:
        labels = ["model", "endpoint"]
        self.prompt = HotCounter(
            "longroute_prompt_tokens",
            "Prompt tokens of answered requests: the backend's usage, else the gateway's estimate.",
            labels,
        )
        self.cached = HotCounter(
            "longroute_cached_prompt_tokens",
            "Prompt tokens the backend served from its prefix cache (usage.prompt_tokens_"
            "details.cached_tokens; engines that do not report it add nothing).",
            labels,
        )
        self.completion = HotCounter(
            "longroute_completion_tokens",
            "Completion tokens of answered requests: the backend's usage, else the stream's "
            "events counted.",
            labels,
        )
        self.families = (self.prompt, self.cached, self.completion)
        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def finish(self, trace: RequestTrace) -> None:
        if trace.status >= 400 or not trace.endpoint:
            return
        key = (trace.served_model, trace.endpoint)
        children = self._children.get(key)
        if children is None:
            # every series of a backend exists once it answered, a zero cached count
            # included (a hit ratio is then 0, not missing)
            children = self._children[key] = (
                self.prompt.labels(*key),
                self.cached.labels(*key),
                self.completion.labels(*key),
            )
        usage = trace.usage()
        prompt, cached, completion = children
        prompt.value += usage.prompt_tokens or 0
        cached.value += usage.cached_tokens or 0
        completion.value += usage.completion_tokens or 0


class _LiveCollector:
    """Reads the FleetView's snapshots at scrape time: O(backends)."""

    def __init__(
        self,
        fleet: FleetView,
        queue_depth: Callable[[], int],
        is_healthy: Callable[[str], bool] | None,
    ) -> None:
        self._fleet = fleet
        self._queue_depth = queue_depth
        self._is_healthy = is_healthy

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        depth, inflight, tokens, healthy, rtt, waiting, running, kv, blocks, capacity = families
        depth.add_metric([], self._queue_depth())
        index = self._fleet.prefix_index
        capacity.add_metric([], index.capacity_blocks_per_endpoint)
        for endpoint in self._fleet.endpoints:
            state = self._fleet.state(endpoint.name)
            label = [endpoint.name]
            blocks.add_metric(label, index.num_blocks(endpoint.name))
            inflight.add_metric(label, state.num_inflight_requests)
            tokens.add_metric(label, state.num_queued_tokens)
            is_up = state.is_healthy if self._is_healthy is None else self._is_healthy(label[0])
            healthy.add_metric(label, 1.0 if is_up else 0.0)
            rtt.add_metric(label, state.rtt_ms)
            if state.engine_num_waiting is not None:
                waiting.add_metric(label, state.engine_num_waiting)
            if state.engine_num_running is not None:
                running.add_metric(label, state.engine_num_running)
            if state.engine_kv_usage is not None:
                kv.add_metric(label, state.engine_kv_usage)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        def per_endpoint(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["endpoint"])

        return [
            GaugeMetricFamily("longroute_queue_depth", "Requests waiting in the gateway queue."),
            per_endpoint("longroute_backend_inflight_requests", "Requests in flight."),
            per_endpoint(
                "longroute_backend_inflight_tokens", "Prompt and output tokens still owed."
            ),
            per_endpoint(
                "longroute_backend_healthy",
                "1 if the backend is ready: it answered and its circuit is closed (as /ready).",
            ),
            per_endpoint("longroute_backend_rtt_ms", "RTT estimate (EWMA of probes)."),
            per_endpoint("longroute_engine_num_waiting", "Scraped engine queue length."),
            per_endpoint("longroute_engine_num_running", "Scraped engine running requests."),
            per_endpoint("longroute_engine_kv_usage", "Scraped engine KV-cache usage, 0..1."),
            per_endpoint(
                "longroute_prefix_index_blocks",
                "Blocks the router-side prefix index believes the backend holds.",
            ),
            GaugeMetricFamily(
                "longroute_prefix_index_capacity_blocks",
                "Bound of the router-side prefix index, in blocks per backend.",
            ),
        ]


class _CalibrationCollector:
    """The router's learned time corrections, read at scrape time: O(backends).

    A backend the router has not priced yet has no sample; nor have the last
    predicted and observed figures before its first observation.
    """

    def __init__(
        self, fleet: FleetView, calibration: Callable[[], Mapping[str, Calibration]]
    ) -> None:
        self._fleet = fleet
        self._calibration = calibration

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        pred_ttft, obs_ttft, pred_tpot, obs_tpot, ttft_corr, tpot_corr = families
        calibrations = self._calibration()
        for endpoint in self._fleet.endpoints:
            c = calibrations.get(endpoint.name)
            if c is None:
                continue
            label = [endpoint.name]
            ttft_corr.add_metric(label, c.ttft_correction)
            tpot_corr.add_metric(label, c.tpot_correction)
            for family, value in (
                (pred_ttft, c.last_predicted_ttft_s),
                (obs_ttft, c.last_observed_ttft_s),
                (pred_tpot, c.last_predicted_tpot_s),
                (obs_tpot, c.last_observed_tpot_s),
            ):
                if value is not None:
                    family.add_metric(label, value)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        def per_endpoint(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["endpoint"])

        return [
            per_endpoint(
                "longroute_predicted_ttft_seconds",
                "Predicted TTFT (network included) of the last request observed on the backend.",
            ),
            per_endpoint(
                "longroute_observed_ttft_seconds",
                "Observed TTFT (dispatch to first byte) of the last request on the backend.",
            ),
            per_endpoint(
                "longroute_predicted_tpot_seconds",
                "Predicted time per output token of the last completed request on the backend.",
            ),
            per_endpoint(
                "longroute_observed_tpot_seconds",
                "Observed time per output token of the last completed request on the backend.",
            ),
            per_endpoint(
                "longroute_ttft_correction",
                "Learned factor on the profile's prefill-phase prediction (observed/predicted).",
            ),
            per_endpoint(
                "longroute_tpot_correction",
                "Learned factor on the profile's decode-step prediction (observed/predicted).",
            ),
        ]
