"""The gateway application: long-lived state, request dispatch and background tasks.

``Gateway(config, secrets)`` builds everything that needs no event loop: the
:class:`~longroute.gateway.wiring.Wiring` of its config (backends, router, model
map, request builder, keys) and the state that outlives a reload (fleet view,
admission, metrics, health, one upstream pool per backend, request ids and the
request sinks). :meth:`Gateway.start` opens the HTTP server
(:mod:`longroute.gateway.http.server`) and the background loops (health checks,
RTT probes, engine scraping on an ``aiohttp.ClientSession`` of their own, the
access log's flushes); :meth:`Gateway.stop` drains and ends them.
:func:`serve_gateway` does both around a ``with`` block. Completions are served by
:mod:`longroute.gateway.completions`, the drain by :mod:`longroute.gateway.lifecycle`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from longroute.clock import WallClock
from longroute.gateway.access_log import AccessLog
from longroute.gateway.admission import Admission
from longroute.gateway.backends import Backend
from longroute.gateway.completions import CompletionHandler, check_content_type
from longroute.gateway.config import GatewayConfig, GatewaySecrets, resolve_secrets
from longroute.gateway.errors import GatewayError, draining_error
from longroute.gateway.health import HealthMonitor
from longroute.gateway.http.server import HttpServer, ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpRequest, HttpResponse
from longroute.gateway.intake import authorize
from longroute.gateway.lifecycle import Drain, DrainReport
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.observe import (
    REQUEST_ID_HEADER,
    RequestIds,
    RequestObserver,
    RequestSink,
    Tracing,
)
from longroute.gateway.parse import ROUTES
from longroute.gateway.proxy import Proxy
from longroute.gateway.redact import RedactingFilter
from longroute.gateway.wiring import Wiring, build_fleet, monitors
from longroute.routing.base import Router

log = logging.getLogger("longroute.gateway")

# how long Gateway.stop() (tests, `serve_gateway`) lets in-flight requests finish;
# `longroute serve` drains for the config's shutdown.drain_timeout_s instead
STOP_GRACE_S = 5.0
# what a draining gateway still answers on a kept-alive connection (the rest: 503)
_OPS_PATHS = frozenset({"/health", "/ready", "/metrics", "/admin/fleet"})
# the server's own rejections (its error code) -> longroute_errors_total{kind}
_REJECT_KINDS = {
    "request_too_large": "body_too_large",
    "uri_too_long": "head_too_large",
    "request_header_fields_too_large": "head_too_large",
    "request_timeout": "head_timeout",
}

def build_tracing(config: GatewayConfig) -> Tracing:
    """The tracer of ``config.otel``: OpenTelemetry spans (imported only then: the ``otel``
    extra), else the base that only forwards ids and the client's trace context."""
    if config.otel is None:
        return Tracing()
    from longroute.gateway.otel import OtelTracing

    return OtelTracing(config.otel)


RouteHandler = Callable[[HttpRequest, ResponseStream, str], Awaitable[HttpResponse | None]]
"""A gateway route: the request, its response stream and its request id."""


class Gateway:
    """Everything one gateway process owns; handlers are its methods."""

    def __init__(self, config: GatewayConfig, secrets: GatewaySecrets) -> None:
        self.clock = WallClock()
        self.ids = RequestIds()
        self._request_numbers = itertools.count(1)  # internal ids: never restart (reloads)
        self.metrics = GatewayMetrics(
            None,
            lambda: self.admission.num_waiting,
            is_healthy=lambda name: self.health.is_ready(name),
        )
        self.wiring = Wiring(config, secrets, self.metrics, self.clock, self._request_numbers)
        wiring = self.wiring
        # every gateway log record is redacted and kept on one line (see redact.py)
        self.log_filter = RedactingFilter(wiring.redactor)
        self.fleet = build_fleet(config, wiring.backends, wiring.router)
        self.metrics.watch(self.fleet, calibration=getattr(wiring.router, "calibration", None))
        self.admission = Admission(
            self.fleet,
            wiring.router,
            {b.name: b.max_concurrency for b in wiring.backends.values()},
            max_queue=config.admission.max_queue,
            queue_policy=config.admission.queue_policy,
            queue_policy_params=config.admission.queue_policy_params,
            clock=self.clock,
            observe_decision_s=self.metrics.decision.observe,
        )
        self.health = HealthMonitor(
            wiring.backends, config.health, self.clock, self._health_changed
        )
        self.tracing = build_tracing(config)
        self.proxy = Proxy(
            wiring,
            self.admission,
            self.health,
            self.metrics,
            self.tracing,
            keepalive_s=config.backend_keepalive_s,
        )
        self.rtt, self.scraper = monitors(config, wiring.backends, self.fleet, self.clock)
        self.access_log = self._access_log(config)
        self.observer = RequestObserver(self._sinks())
        self.background_tasks: list[asyncio.Task[None]] = []
        self.routes = self._route_table()
        self._server: HttpServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self.drain = Drain()
        self._drain_report: DrainReport | None = None

    # ---- the wiring in force (read per request) ---------------------------------
    @property
    def config(self) -> GatewayConfig:
        return self.wiring.config

    @property
    def backends(self) -> dict[str, Backend]:
        return self.wiring.backends

    @property
    def router(self) -> Router:
        return self.wiring.router

    @property
    def redactor(self) -> Any:
        return self.wiring.redactor

    def _access_log(self, config: GatewayConfig) -> AccessLog | None:
        spec = config.access_log
        if spec is None:
            return None
        return AccessLog(
            spec.path,
            self.wiring.redactor,
            lambda: self.wiring.router.name,
            own_id_prefix=self.ids.prefix,
            flush_interval_s=spec.flush_interval_s,
        )

    def _sinks(self) -> list[RequestSink]:
        sinks: list[RequestSink] = [self.tracing]
        if self.config.usage_metrics:
            sinks.append(self.metrics.usage)
        if self.access_log is not None:
            sinks.append(self.access_log)
        return sinks

    def _route_table(self) -> dict[tuple[str, str], RouteHandler]:
        routes: dict[tuple[str, str], RouteHandler] = {
            ("POST", route): CompletionHandler(self, route) for route in ROUTES
        }
        routes[("GET", "/v1/models")] = self.handle_models
        routes[("GET", "/health")] = self.handle_health
        routes[("GET", "/ready")] = self.handle_ready
        routes[("GET", "/metrics")] = self.handle_metrics
        if self.config.admin_enabled:
            routes[("GET", "/admin/fleet")] = self.handle_admin_fleet
        return routes

    async def dispatch(
        self, http_request: HttpRequest, stream: ResponseStream
    ) -> HttpResponse | None:
        """The server's handler: the request's id (on its response, whatever it is), one
        dict lookup, then the route's handler (else a 404)."""
        request_id = self.ids.take(http_request.headers.get(REQUEST_ID_HEADER))
        stream.extra_head = b"x-request-id: %s\r\n" % request_id.encode("ascii")
        handler = self.routes.get((http_request.method, http_request.path))
        if handler is None:
            message = f"Invalid URL ({http_request.method} {http_request.path})"
            return GatewayError(404, message, kind="unknown_url").response()
        if self.drain.is_draining and http_request.path not in _OPS_PATHS:
            self.drain.num_refused += 1
            self.metrics.errors.labels("draining").inc()
            return draining_error(self.config.admission.retry_after_s).response()
        return await handler(http_request, stream, request_id)

    def _health_changed(self, name: str, is_healthy: bool) -> None:
        self.fleet.set_health(name, is_healthy)
        self.admission.wake()

    # ---- everything else -----------------------------------------------------
    async def handle_models(self, http_request: HttpRequest, _: ResponseStream, __: str) -> Any:
        try:
            authorize(http_request.headers, self.wiring.client_api_keys)
        except GatewayError as err:
            return err.response()
        return HttpResponse(200, self.wiring.models_body)

    async def handle_health(self, _: HttpRequest, __: ResponseStream, ___: str) -> Any:
        return HttpResponse(200, b'{"status": "ok"}')

    async def handle_ready(self, _: HttpRequest, __: ResponseStream, ___: str) -> Any:
        if self.drain.is_draining:
            return HttpResponse(503, b'{"status": "draining"}', JSON_TYPE)
        healthy = self.health.ready_backends()
        status = 200 if healthy else 503
        body: dict[str, Any] = {
            "status": "ready" if healthy else "no healthy backend",
            "healthy": healthy,
        }
        if not healthy:
            body["causes"] = self.redactor.client_text(self.health.causes())
        return HttpResponse(status, json.dumps(body).encode(), JSON_TYPE)

    async def handle_metrics(self, _: HttpRequest, __: ResponseStream, ___: str) -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST

        return HttpResponse(200, self.metrics.render(), CONTENT_TYPE_LATEST)

    async def handle_admin_fleet(
        self, http_request: HttpRequest, _: ResponseStream, __: str
    ) -> Any:
        try:
            authorize(http_request.headers, self.wiring.client_api_keys)
        except GatewayError as err:
            return err.response()
        return HttpResponse(200, json.dumps(self.fleet_snapshot()).encode(), JSON_TYPE)

    def fleet_snapshot(self) -> dict[str, Any]:
        """The fleet as the router sees it, plus breaker states and scraped engine stats."""
        backends: dict[str, Any] = {}
        for name in self.backends:
            state = self.fleet.state(name)
            engine = self.scraper.stats.get(name) if self.scraper is not None else None
            backends[name] = {
                "model": state.endpoint.model,
                "region": state.endpoint.region,
                "circuit": self.health.breakers[name].state.value,
                "rtt_ms": state.rtt_ms,
                "num_inflight_requests": state.num_inflight_requests,
                "num_slots": self.backends[name].max_concurrency,
                "num_queued_tokens": state.num_queued_tokens,
                "engine": None if engine is None else dataclasses.asdict(engine),
            }
        return {
            "router": self.router.name,
            "queue_depth": self.admission.num_waiting,
            "backends": backends,
        }

    # ---- lifecycle -------------------------------------------------------------
    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Opens the monitoring loops, then listens; returns the bound (host, port) pairs."""
        log.addFilter(self.log_filter)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit_per_host=4,  # probes and scrapes only: the traffic has its own pools
                keepalive_timeout=self.config.backend_keepalive_s,
                ttl_dns_cache=10,  # follow DNS changes (e.g. a rescheduled pod) within seconds
            ),
            cookie_jar=aiohttp.DummyCookieJar(),  # one backend's cookies must not reach others
        )
        loops = [self.health.run(self._session)]
        loops += [m.run(self._session) for m in (self.rtt, self.scraper) if m is not None]
        if self.access_log is not None:
            loops.append(self.access_log.run())
        self.background_tasks = [asyncio.create_task(loop) for loop in loops]
        limits = self.config.http
        self._server = HttpServer(
            self.dispatch,
            max_body_bytes=self.config.admission.max_body_bytes,
            on_reject=self._count_rejected,
            keepalive_timeout_s=limits.keepalive_timeout_s,
            max_url_bytes=limits.max_url_bytes,
            max_head_bytes=limits.max_head_bytes,
            max_header_line_bytes=limits.max_header_line_bytes,
            max_headers=limits.max_headers,
            head_timeout_s=limits.head_timeout_s,
            body_timeout_s=limits.body_timeout_s,
        )
        try:
            return await self._server.start(host, port)
        except BaseException:
            await self.stop()
            raise

    def _count_rejected(self, code: str) -> None:
        """The server answered a request itself (malformed HTTP, a head or body over its
        limit, a head past its deadline)."""
        self.metrics.errors.labels(_REJECT_KINDS.get(code, "bad_request")).inc()

    async def drain_requests(self, timeout_s: float) -> DrainReport | None:
        """The graceful drain (:mod:`longroute.gateway.lifecycle`): refuse new connections,
        let every request finish within ``timeout_s``, cut the rest; once (later calls
        return the first's report). None when the gateway never listened."""
        if self._server is None:
            return None
        if self._drain_report is None:
            self._drain_report = await self.drain.run(self._server, timeout_s)
        return self._drain_report

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Drains (up to ``grace_s``, unless a drain ran already), closes every connection,
        stops the monitoring loops and the backend pools."""
        if self._server is not None:
            await self.drain_requests(grace_s)
            await self._server.close(0.0)
            self._server = None
        for task in self.background_tasks:
            task.cancel()
        await asyncio.gather(*self.background_tasks, return_exceptions=True)
        self.background_tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.proxy.close()
        if self.access_log is not None:
            self.access_log.close()
        self.tracing.close()
        log.removeFilter(self.log_filter)


@dataclass(frozen=True, slots=True)
class RunningGateway:
    """A started gateway and its base URL (``http://host:port``)."""

    url: str
    gateway: Gateway


@asynccontextmanager
async def serve_gateway(
    config: GatewayConfig,
    secrets: GatewaySecrets | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
) -> AsyncIterator[RunningGateway]:
    """Runs a gateway for the ``async with`` block (port 0 picks a free one).

    ``secrets`` default to the environment (see resolve_secrets); host and port to
    the config's ``listen``.
    """
    gateway = Gateway(config, secrets if secrets is not None else resolve_secrets(config))
    bind_host = host if host is not None else config.listen.host
    addresses = await gateway.start(bind_host, port if port is not None else config.listen.port)
    try:
        bound_host, bound_port = addresses[0]
        yield RunningGateway(f"http://{bound_host}:{bound_port}", gateway)
    finally:
        await gateway.stop()


__all__ = ["Gateway", "RunningGateway", "check_content_type", "serve_gateway"]
