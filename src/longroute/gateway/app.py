"""The gateway application: wiring, request handlers and background tasks.

``Gateway(config, secrets)`` builds everything that needs no event loop
(router by registry name, FleetView, admission, metrics, health, one
upstream pool per backend). :meth:`Gateway.start` opens the HTTP server
(:mod:`longroute.gateway.http.server`) and the background loops (health
checks, RTT probes, engine scraping, on an ``aiohttp.ClientSession`` of their
own); :meth:`Gateway.stop` ends them. :func:`serve_gateway` does both around a
``with`` block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from longroute.clock import WallClock
from longroute.gateway.admission import Admission
from longroute.gateway.backends import build_backends
from longroute.gateway.config import GatewayConfig, GatewaySecrets, resolve_secrets
from longroute.gateway.errors import (
    SERVER_ERROR,
    GatewayError,
    bad_request,
    draining_error,
    shutdown_error,
)
from longroute.gateway.health import HealthMonitor
from longroute.gateway.http.server import Handler, HttpServer, ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpRequest, HttpResponse
from longroute.gateway.intake import ContextReuse, Job, RequestBuilder, authorize
from longroute.gateway.lifecycle import Drain, DrainReport, end_cut_stream
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.parse import ROUTES, parse_body
from longroute.gateway.priority import BackendPriorities, without_client_priority
from longroute.gateway.proxy import Proxy
from longroute.gateway.redact import RedactingFilter
from longroute.gateway.wiring import (
    build_fleet,
    build_redactor,
    build_router,
    model_map,
    models_body,
    monitors,
)

log = logging.getLogger("longroute.gateway")

# how long Gateway.stop() (tests, `serve_gateway`) lets in-flight requests finish;
# `longroute serve` drains for the config's shutdown.drain_timeout_s instead
STOP_GRACE_S = 5.0
# what a draining gateway still answers on a kept-alive connection (the rest: 503)
_OPS_PATHS = frozenset({"/health", "/ready", "/metrics", "/admin/fleet"})
# the status counted for a request whose client left before its answer (nginx's 499)
CLIENT_CLOSED_STATUS = 499
# the server's own rejections (its error code) -> longroute_errors_total{kind}
_REJECT_KINDS = {
    "request_too_large": "body_too_large",
    "uri_too_long": "head_too_large",
    "request_header_fields_too_large": "head_too_large",
    "request_timeout": "head_timeout",
}


class Gateway:
    """Everything one gateway process owns; handlers are its methods."""

    def __init__(self, config: GatewayConfig, secrets: GatewaySecrets) -> None:
        self.config = config
        self.clock = WallClock()
        self.backends = build_backends(config, secrets.backend_api_keys)
        self.client_api_keys = secrets.client_api_keys
        self.redactor = build_redactor(secrets, self.backends)
        # every gateway log record is redacted and kept on one line (see redact.py)
        self.log_filter = RedactingFilter(self.redactor)
        self.router = build_router(config, self.backends)
        self.fleet = build_fleet(config, self.backends, self.router)
        self.metrics = GatewayMetrics(
            self.fleet,
            lambda: self.admission.num_waiting,
            calibration=getattr(self.router, "calibration", None),
            is_healthy=lambda name: self.health.is_ready(name),
        )
        self.admission = Admission(
            self.fleet,
            self.router,
            {b.name: b.max_concurrency for b in self.backends.values()},
            max_queue=config.admission.max_queue,
            queue_policy=config.admission.queue_policy,
            queue_policy_params=config.admission.queue_policy_params,
            clock=self.clock,
            observe_decision_s=self.metrics.decision.observe,
        )
        self.health = HealthMonitor(self.backends, config.health, self.clock, self._health_changed)
        self.proxy = Proxy(
            self.backends,
            self.admission,
            self.health,
            self.metrics,
            config.admission,
            keepalive_s=config.backend_keepalive_s,
            redactor=self.redactor,
            priorities=BackendPriorities(config, self.clock),
        )
        self.rtt, self.scraper = monitors(config, self.backends, self.fleet, self.clock)
        self.served_models = frozenset(b.model for b in self.backends.values())
        self.models = model_map(config, self.backends)
        self._models_body = models_body(self.models)
        self.requests = RequestBuilder.for_router(config, self.clock, self.router)
        reuse = config.context_reuse
        self.context = ContextReuse(reuse, self.metrics) if reuse.enabled else None
        self.background_tasks: list[asyncio.Task[None]] = []
        self.routes = self._route_table()
        self._server: HttpServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self.drain = Drain()
        self._drain_report: DrainReport | None = None

    def _route_table(self) -> dict[tuple[str, str], Handler]:
        routes: dict[tuple[str, str], Handler] = {
            ("POST", route): self.completion_handler(route) for route in ROUTES
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
        """The server's handler: one dict lookup, then the route's handler (else a 404)."""
        handler = self.routes.get((http_request.method, http_request.path))
        if handler is None:
            message = f"Invalid URL ({http_request.method} {http_request.path})"
            return GatewayError(404, message, kind="unknown_url").response()
        if self.drain.is_draining and http_request.path not in _OPS_PATHS:
            self.drain.num_refused += 1
            self.metrics.errors.labels("draining").inc()
            return draining_error(self.config.admission.retry_after_s).response()
        return await handler(http_request, stream)

    def _health_changed(self, name: str, is_healthy: bool) -> None:
        self.fleet.set_health(name, is_healthy)
        self.admission.wake()

    # ---- completions ---------------------------------------------------------
    def completion_handler(self, route: str) -> Handler:
        async def handle(http_request: HttpRequest, stream: ResponseStream) -> HttpResponse | None:
            return await self.handle_completion(http_request, stream, route)

        return handle

    async def handle_completion(
        self, http_request: HttpRequest, stream: ResponseStream, route: str
    ) -> HttpResponse | None:
        """A whole response, or None when the answer was streamed through ``stream``."""
        started_s = time.monotonic()
        model_label = endpoint = ""
        response: HttpResponse | None
        try:
            authorize(http_request.headers, self.client_api_keys)
            check_content_type(http_request.headers.get("content-type"))
            raw = http_request.body
            raw, parsed = without_client_priority(raw, parse_body(raw, route))
            target = self.models.get(parsed.model)
            if target is None:
                raise _model_not_found(parsed.model)
            model_label = parsed.model
            if self.context is not None:  # requests with documents: plan and rewrite
                raw, parsed = self.context.apply(raw, parsed, route, target)
            job = Job(
                route,
                raw,
                parsed,
                self.requests.build(parsed, target, http_request.headers, route),
                is_alias=parsed.model not in self.served_models,
                started_s=started_s,
                timeout_s=self.config.admission.request_timeout_s,
            )
            response, endpoint = await self.proxy.forward(stream, job)
        except GatewayError as err:
            self.metrics.errors.labels(err.kind).inc()
            response = err.response()
        except RecursionError:  # e.g. re-serialising a body nested as deep as the decoder allows
            self.metrics.errors.labels("bad_request").inc()
            response = bad_request("the body's JSON is nested too deeply").response()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or not self.drain.is_cut(task):
                self._count_disconnect(route, model_label, endpoint)
                raise
            # the drain's deadline passed: end the request here (its backend connection
            # was closed by the cancellation, so the engine aborts it)
            task.uncancel()
            self.metrics.errors.labels("server_shutdown").inc()
            if stream.is_started:
                await end_cut_stream(stream)
                response = None
            else:
                response = shutdown_error(self.config.admission.retry_after_s).response()
        except ConnectionResetError:
            self._count_disconnect(route, model_label, endpoint)
            raise
        except Exception:  # a bug must still give the client an answer
            log.exception("unexpected error while serving %s", route)
            self.metrics.errors.labels("internal").inc()
            response = GatewayError(
                500,
                "internal gateway error",
                kind="internal",
                type_=SERVER_ERROR,
                code="internal_error",
            ).response()
        status = 200 if response is None else response.status
        self.metrics.count_request(route, model_label, endpoint, status)
        if status < 400:
            self.metrics.e2e.observe(time.monotonic() - started_s)
        return response

    def _count_disconnect(self, route: str, model: str, endpoint: str) -> None:
        """The client went away (the server cancels its handler, or a write found it gone):
        its work stopped there, and the backend connection was dropped with it."""
        self.metrics.errors.labels("client_disconnect").inc()
        self.metrics.count_request(route, model, endpoint, CLIENT_CLOSED_STATUS)

    # ---- everything else -----------------------------------------------------
    async def handle_models(self, http_request: HttpRequest, _: ResponseStream) -> HttpResponse:
        try:
            authorize(http_request.headers, self.client_api_keys)
        except GatewayError as err:
            return err.response()
        return HttpResponse(200, self._models_body)

    async def handle_health(self, _: HttpRequest, __: ResponseStream) -> HttpResponse:
        return HttpResponse(200, b'{"status": "ok"}')

    async def handle_ready(self, _: HttpRequest, __: ResponseStream) -> HttpResponse:
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

    async def handle_metrics(self, _: HttpRequest, __: ResponseStream) -> HttpResponse:
        from prometheus_client import CONTENT_TYPE_LATEST

        return HttpResponse(200, self.metrics.render(), CONTENT_TYPE_LATEST)

    async def handle_admin_fleet(
        self, http_request: HttpRequest, _: ResponseStream
    ) -> HttpResponse:
        try:
            authorize(http_request.headers, self.client_api_keys)
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


def check_content_type(content_type: str | None) -> None:
    """A 415 unless the body is sent as JSON: ``application/json`` or ``application/*+json``
    (parameters such as charset allowed); no Content-Type is taken as JSON, as FastAPI does."""
    if content_type is None or content_type == JSON_TYPE:
        return
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type == JSON_TYPE or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    raise GatewayError(
        415,
        f"the body must be sent as {JSON_TYPE}, not {content_type[:64]!r}",
        kind="unsupported_media_type",
        code="unsupported_media_type",
    )


def _model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model `{model}` does not exist or is not served here.",
        kind="model_not_found",
        code="model_not_found",
        param="model",
    )


__all__ = ["Gateway", "RunningGateway", "serve_gateway"]
