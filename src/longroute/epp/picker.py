"""The endpoint picker's routing state: the gateway's wiring, without its proxy.

One :class:`EndpointPicker` per process, shared by every ext_proc stream. It
builds what ``longroute serve`` builds from the same config (router by name,
FleetView with its prefix index, per-backend concurrency slots, health checks
with circuit breakers, RTT probes, engine scraping, Prometheus metrics) and
answers three calls per request: :meth:`pick` once its body is complete,
:meth:`first_byte` at the backend's first response byte, :meth:`finish` when
the exchange ends, however it ends. Every call is synchronous and O(backends)
plus the router's own cost; the only waits are the monitoring loops'.

There is no queue: when every eligible backend is at ``max_concurrency`` the
request is shed (a 429 the client may retry), since Envoy, not the picker,
holds the request.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client import Counter

from longroute.clock import WallClock
from longroute.errors import ConfigError
from longroute.gateway.admission import Admission, Grant
from longroute.gateway.backends import Backend, build_backends
from longroute.gateway.config import GatewayConfig
from longroute.gateway.errors import GatewayError, no_candidate_error, overloaded_error
from longroute.gateway.health import HealthMonitor
from longroute.gateway.http.types import Headers
from longroute.gateway.intake import RequestBuilder, authorize
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.parse import parse_body
from longroute.gateway.priority import without_client_priority
from longroute.gateway.secrets import GatewaySecrets
from longroute.gateway.usage import parse_usage
from longroute.gateway.wiring import (
    build_engine_truth,
    build_fleet,
    build_redactor,
    build_router,
    build_tokenizer,
    model_map,
    models_body,
    monitors,
)
from longroute.routing.fleet_view import (
    CandidatesExhaustedError,
    NoCandidateError,
)

#: The last bytes of a response kept to read its ``usage`` (cached prompt tokens).
USAGE_TAIL_BYTES = 8 * 1024
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d{1,12})')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,12})')


@dataclass(slots=True)
class Pick:
    """One request's routing: its slot (``grant``), the destination sent to Envoy
    (``ip:port[,fallback,...]``) and what the accounting at its end needs."""

    grant: Grant
    destination: str
    route: str
    model: str
    started_s: float
    has_first_byte: bool = False
    is_finished: bool = False
    num_choices: int = 1  # the request's n: its usage counts every choice's tokens
    tail: bytearray = field(default_factory=bytearray)


def endpoint_address(backend_name: str, url: str) -> str:
    """``ip:port`` of a backend URL (Envoy's ORIGINAL_DST cluster connects to an address,
    never a name); a ConfigError naming the backend for a host name or an https URL."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ConfigError(
            f"backend {backend_name!r}: `longroute epp` needs an http:// URL (Envoy's "
            f"ORIGINAL_DST cluster speaks plain HTTP to the picked address), got {url!r}"
        )
    host = parts.hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(
            f"backend {backend_name!r}: `longroute epp` needs an IP address in the URL "
            f"(Envoy connects to the address it is given), got host {host!r} in {url!r}"
        ) from None
    port = parts.port or 80
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


class EndpointPicker:
    """Routing state shared by every exchange; see the module doc."""

    def __init__(
        self, config: GatewayConfig, secrets: GatewaySecrets, *, num_fallbacks: int = 0
    ) -> None:
        if num_fallbacks < 0:
            raise ValueError(f"num_fallbacks must be 0 or more, got {num_fallbacks}")
        for backend_config in config.backends:
            if backend_config.api_key_env is not None:
                raise ConfigError(
                    f"backend {backend_config.name!r}: api_key_env is not supported by "
                    "`longroute epp` (Envoy forwards the client's request as it is; give "
                    "backend credentials in Envoy's config)"
                )
        self.config = config
        self.num_fallbacks = num_fallbacks
        self.clock = WallClock()
        self.backends: dict[str, Backend] = build_backends(config, secrets.backend_api_keys)
        self.addresses = {
            name: endpoint_address(name, b.base_url) for name, b in self.backends.items()
        }
        self.names_by_address = {address: name for name, address in self.addresses.items()}
        self.client_api_keys = secrets.client_api_keys
        self.redactor = build_redactor(secrets, self.backends)
        self.router = build_router(config, self.backends)
        self.fleet = build_fleet(config, self.backends, self.router)
        self.metrics = GatewayMetrics(
            self.fleet,
            lambda: 0,
            calibration=getattr(self.router, "calibration", None),
            is_healthy=lambda name: self.health.is_ready(name),
        )
        self.prompt_tokens = Counter(
            "longroute_epp_prompt_tokens",
            "Prompt tokens of answered requests by backend, as their usage reported: "
            "cached (served from the engine's prefix cache) or not.",
            ["endpoint", "kind"],
            registry=self.metrics.registry,
        )
        self.admission = Admission(
            self.fleet,
            self.router,
            {b.name: b.max_concurrency for b in self.backends.values()},
            max_queue=0,
            queue_policy="fcfs",
            clock=self.clock,
            observe_decision_s=self.metrics.decision.observe,
        )
        self.health = HealthMonitor(self.backends, config.health, self.clock, self._health_changed)
        self.rtt, self.scraper = monitors(config, self.backends, self.fleet, self.clock)
        self.served_models = frozenset(b.model for b in self.backends.values())
        self.models = model_map(config, self.backends)
        self.models_body = models_body(self.models)
        # engine truth (precise_prefix): the same tokenizer, index and KV-event sink as serve
        self.requests = RequestBuilder.for_router(
            config, self.clock, self.router, tokenizer=build_tokenizer(config)
        )
        self.engine_truth = build_engine_truth(config, self.fleet)
        if self.engine_truth is not None:
            from longroute.gateway.kv_metrics import KVEventsCollector

            self.metrics.registry.register(KVEventsCollector(self.engine_truth))

    def _health_changed(self, name: str, is_healthy: bool) -> None:
        self.fleet.set_health(name, is_healthy)

    @property
    def is_ready(self) -> bool:
        """At least one backend answered and has a closed breaker."""
        return bool(self.health.ready_backends())

    # ---- per request -------------------------------------------------------------
    def check_client(self, headers: Headers) -> None:
        """A 401 GatewayError for a client without a valid key (when keys are configured)."""
        authorize(headers, self.client_api_keys)

    def pick(self, route: str, headers: Headers, raw: bytes) -> tuple[Pick, bytes]:
        """Route a complete request body; returns the pick and the body to send on.

        Raises GatewayError: 400 (invalid body, no backend could fit it), 404 (model not
        served), 409 (every model tried), 429 (every eligible backend full: shed), 503 (no
        eligible backend ready)."""
        started_s = time.monotonic()
        raw, parsed = without_client_priority(raw, parse_body(raw, route))
        target = self.models.get(parsed.model)
        if target is None:
            raise GatewayError(
                404,
                f"The model `{parsed.model}` does not exist or is not served here.",
                kind="model_not_found",
                code="model_not_found",
                param="model",
            )
        request = self.requests.build(parsed, target, headers, route)
        try:
            grant = self.admission.try_grant(request, ())
        except CandidatesExhaustedError as exc:
            raise GatewayError(409, str(exc), kind="exhausted", code="all_models_tried") from None
        except NoCandidateError as exc:
            causes = self.redactor.client_text(self.health.causes())
            raise no_candidate_error(request, exc, self.backends, causes) from None
        if grant is None:
            retry_after_s = self.config.admission.retry_after_s
            message = "every backend that could serve this request is at its max_concurrency"
            raise overloaded_error(429, "shed", message, retry_after_s)
        if self.engine_truth is not None:  # counts the dispatch (the silence check)
            self.engine_truth.predicted_cached_tokens(grant.endpoint, grant.request)
        destination = self._destination(grant)
        pick = Pick(
            grant, destination, route, parsed.model, started_s, num_choices=parsed.num_choices
        )
        return pick, raw

    def _destination(self, grant: Grant) -> str:
        """The granted endpoint's address, then up to ``num_fallbacks`` other healthy
        candidates, best scored first."""
        addresses = [self.addresses[grant.endpoint]]
        if self.num_fallbacks:
            scores = grant.decision.scores
            others = [
                s.endpoint.name
                for s in self.fleet.candidates(grant.request)
                if s.endpoint.name != grant.endpoint
            ]
            others.sort(key=lambda name: scores.get(name, float("inf")))
            addresses += [self.addresses[name] for name in others[: self.num_fallbacks]]
        return ",".join(addresses)

    def first_byte(self, pick: Pick) -> None:
        """The backend's first response body byte passed: it no longer owes the prompt."""
        if pick.has_first_byte or pick.is_finished:
            return
        pick.has_first_byte = True
        self.admission.first_byte(pick.grant.request, pick.grant.endpoint)
        endpoint = pick.grant.endpoint
        model = self.backends[endpoint].model
        self.metrics.observe_ttft(model, endpoint, time.monotonic() - pick.started_s)

    def observe_body(self, pick: Pick, chunk: bytes) -> None:
        """Keeps the last USAGE_TAIL_BYTES of the response (its usage is at the end)."""
        tail = pick.tail
        tail += chunk[-USAGE_TAIL_BYTES:]
        if len(tail) > USAGE_TAIL_BYTES:
            del tail[: len(tail) - USAGE_TAIL_BYTES]

    def finish(self, pick: Pick, status: int | None) -> None:
        """The exchange ended: ``status`` is the response's (None: it ended before any
        response, e.g. the client hung up). Frees the slot; idempotent."""
        if pick.is_finished:
            return
        pick.is_finished = True
        endpoint = pick.grant.endpoint
        is_ok = status is not None and status < 400
        self.admission.finish(
            pick.grant.request, endpoint, has_first_byte=pick.has_first_byte, is_ok=is_ok
        )
        code = 499 if status is None else status
        self.metrics.count_request(pick.route, pick.model, endpoint, code)
        if status is None:
            self.metrics.errors.labels("client_disconnect").inc()
        elif is_ok:
            model = self.backends[endpoint].model
            self.metrics.observe_e2e(model, endpoint, time.monotonic() - pick.started_s)
            tail = bytes(pick.tail)
            self._count_usage(endpoint, tail)
            self._learn_length(pick, tail)

    def _learn_length(self, pick: Pick, tail: bytes) -> None:
        """The answer's completion tokens per choice (the engine's usage) teach the length
        estimate routers see, as in ``serve``."""
        usage = parse_usage(tail)
        if usage is not None and usage.completion_tokens is not None:
            request = pick.grant.request
            per_choice = usage.completion_tokens // max(1, pick.num_choices)
            self.requests.lengths.observe(request.model, request.task, per_choice)

    def _count_usage(self, endpoint: str, tail: bytes) -> None:
        prompt = _PROMPT.findall(tail)
        if not prompt:
            return
        num_prompt = int(prompt[-1])
        cached = _CACHED.findall(tail)
        num_cached = min(int(cached[-1]), num_prompt) if cached else 0
        self.prompt_tokens.labels(endpoint, "cached").inc(num_cached)
        self.prompt_tokens.labels(endpoint, "uncached").inc(num_prompt - num_cached)

    def count_rejected(self, route: str, status: int, kind: str) -> None:
        """A request answered by the picker itself (an ImmediateResponse)."""
        self.metrics.errors.labels(kind).inc()
        self.metrics.count_request(route, "", "", status)
