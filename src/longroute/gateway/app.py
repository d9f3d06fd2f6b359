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
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from longroute.clock import WallClock
from longroute.gateway.access_log import AccessLog
from longroute.gateway.admin import AdminRoutes
from longroute.gateway.admission import Admission
from longroute.gateway.backends import Backend
from longroute.gateway.completions import CompletionHandler, check_content_type
from longroute.gateway.config import GatewayConfig
from longroute.gateway.errors import GatewayError, draining_error
from longroute.gateway.granting_fleet import GrantingFleet
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
from longroute.gateway.redact import RedactingFilter, Redactor
from longroute.gateway.reload import (
    ReloadError,
    ReloadResult,
    apply_wiring,
    describe_changes,
    prepare,
)
from longroute.gateway.secrets import GatewaySecrets, resolve_secrets
from longroute.gateway.tuning import LiveTuning
from longroute.gateway.wiring import (
    Wiring,
    build_engine_truth,
    build_fleet,
    build_tokenizer,
    monitors,
)
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

    def __init__(
        self, config: GatewayConfig, secrets: GatewaySecrets, *, config_path: Path | None = None
    ) -> None:
        """``config_path``: the file ``config`` came from, read again by :meth:`reload`."""
        self.config_path = config_path
        self.clock = WallClock()
        self.ids = RequestIds()
        self._request_numbers = itertools.count(1)  # internal ids: never restart (reloads)
        self.metrics = GatewayMetrics(
            None,
            lambda: self.admission.num_waiting,
            is_healthy=lambda name: self.health.is_ready(name),
        )
        self.wiring = Wiring(
            config,
            secrets,
            self.metrics,
            self.clock,
            self._request_numbers,
            tokenizer=build_tokenizer(config),
        )
        wiring = self.wiring
        # every gateway log record is redacted and kept on one line (see redact.py)
        self.log_filter = RedactingFilter(wiring.redactor)
        self.fleet = build_fleet(config, wiring.backends, wiring.router, GrantingFleet)
        self.metrics.watch(self.fleet, calibration=getattr(wiring.router, "calibration", None))
        self.engine_truth = build_engine_truth(config, self.fleet)
        if self.engine_truth is not None:
            from longroute.gateway.kv_metrics import KVEventsCollector

            self.metrics.registry.register(KVEventsCollector(self.engine_truth))
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
        self.proxy.engine_truth = self.engine_truth
        self.tuning: LiveTuning | None = None
        self.set_tuning(wiring)
        self.rtt, self.scraper = monitors(config, wiring.backends, self.fleet, self.clock)
        self.access_log = self.build_access_log(config)
        self.observer = RequestObserver(self.request_sinks())
        self._tasks: dict[str, asyncio.Task[None]] = {}  # background loops by name
        self.retiring: set[asyncio.Task[None]] = set()
        self._reload_lock = asyncio.Lock()
        self.routes = self.route_table()
        self._server: HttpServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self.drain = Drain()
        self._drain_report: DrainReport | None = None
        self.worker_index: int | None = None  # set by `serve --workers N` before start
        self._id_head = b"x-request-id: %s\r\n"  # + the worker's header, once it has one
        self._ops_server: HttpServer | None = None
        self.ops_addresses: list[tuple[str, int]] = []

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
    def redactor(self) -> Redactor:
        return self.wiring.redactor

    def build_access_log(self, config: GatewayConfig) -> AccessLog | None:
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

    def request_sinks(self) -> list[RequestSink]:
        # the base tracer's finish does nothing: it is a sink only when it traces
        sinks: list[RequestSink] = [] if type(self.tracing) is Tracing else [self.tracing]
        if self.config.usage_metrics:
            sinks.append(self.metrics.usage)
        if self.access_log is not None:
            sinks.append(self.access_log)
        return sinks

    def set_tuning(self, wiring: Wiring) -> None:
        """Live tuning as ``wiring`` asks: kept while neither its config nor the router
        changed (a frozen tuner stays frozen), else started over on the router in force."""
        spec = wiring.config.tuning
        current = self.tuning
        if current is not None and current.config == spec and current.router is wiring.router:
            return
        if current is not None:
            self.metrics.registry.unregister(current)
            log.info("live tuning stops: its config or its router changed")
        self.tuning = None if spec is None else LiveTuning(spec, wiring.router)
        if self.tuning is not None:
            self.metrics.registry.register(self.tuning)
            log.info("live tuning starts on router %s", wiring.router.name)
        self.proxy.tuning = self.tuning

    def route_table(self) -> dict[tuple[str, str], RouteHandler]:
        routes: dict[tuple[str, str], RouteHandler] = {
            ("POST", route): CompletionHandler(self, route) for route in ROUTES
        }
        routes[("GET", "/v1/models")] = self.handle_models
        routes[("GET", "/health")] = self.handle_health
        routes[("GET", "/ready")] = self.handle_ready
        routes[("GET", "/metrics")] = self.handle_metrics
        if self.config.admin_enabled:
            routes.update(AdminRoutes(self).routes())
        return routes

    async def dispatch(
        self, http_request: HttpRequest, stream: ResponseStream
    ) -> HttpResponse | None:
        """The server's handler: the request's id (on its response, whatever it is), one
        dict lookup, then the route's handler (else a 404)."""
        request_id = self.ids.take(http_request.headers.get(REQUEST_ID_HEADER))
        stream.extra_head = self._id_head % request_id.encode("ascii")
        handler = self.routes.get((http_request.method, http_request.path))
        if handler is None:
            message = f"Invalid URL ({http_request.method} {http_request.path})"
            return GatewayError(404, message, kind="unknown_url").response()
        if self.drain.is_draining and http_request.path not in _OPS_PATHS:
            self.drain.num_refused += 1
            self.metrics.errors.labels("draining").inc()
            return draining_error(self.config.admission.retry_after_s).response()
        return await handler(http_request, stream, request_id)

    async def dispatch_ops(
        self, http_request: HttpRequest, stream: ResponseStream
    ) -> HttpResponse | None:
        """A worker's own ops port: health, readiness, metrics and the admin API only."""
        path = http_request.path
        if path in _OPS_PATHS or path.startswith("/admin/"):
            return await self.dispatch(http_request, stream)
        message = f"the ops port serves {', '.join(sorted(_OPS_PATHS))} and /admin/* only"
        return GatewayError(404, message, kind="unknown_url").response()

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

    # ---- lifecycle -------------------------------------------------------------
    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, ops_port: int | None = None
    ) -> list[tuple[str, int]]:
        """Opens the monitoring loops, then listens; returns the bound (host, port) pairs.
        ``reuse_port``: SO_REUSEPORT (one of several workers on one port); ``ops_port``: also
        listen there (0: any free port; :attr:`ops_addresses`) for this process's own
        ``/metrics``, ``/health``, ``/ready`` and ``/admin/*``."""
        if self.worker_index is not None:
            worker = b"x-longroute-worker: %d\r\n" % self.worker_index
            self._id_head = b"x-request-id: %s\r\n" + worker
        log.addFilter(self.log_filter)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit_per_host=4,  # probes and scrapes only: the traffic has its own pools
                keepalive_timeout=self.config.backend_keepalive_s,
                ttl_dns_cache=10,  # follow DNS changes (e.g. a rescheduled pod) within seconds
            ),
            cookie_jar=aiohttp.DummyCookieJar(),  # one backend's cookies must not reach others
        )
        self._tasks["health"] = asyncio.create_task(self.health.run(self._session))
        self.sync_loops()
        truth = self.engine_truth
        if truth is not None:  # a socket that cannot bind fails the start, naming it
            await truth.set_backends(self.backends)
            self._tasks["kv_events"] = asyncio.create_task(truth.run())
        self._server = self._http_server(self.dispatch)
        try:
            addresses = await self._server.start(host, port, reuse_port=reuse_port)
            if ops_port is not None:
                self._ops_server = self._http_server(self.dispatch_ops)
                self.ops_addresses = await self._ops_server.start(host, ops_port)
        except BaseException:
            await self.stop()
            raise
        return addresses

    def _http_server(self, handler: Callable[..., Awaitable[HttpResponse | None]]) -> HttpServer:
        limits = self.config.http
        return HttpServer(
            handler,
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

    @property
    def background_tasks(self) -> list[asyncio.Task[None]]:
        """The monitoring loops running now (health, RTT probes, scrapes, log flushes)."""
        return list(self._tasks.values())

    def sync_loops(self) -> None:
        """Starts the loops the monitors in force need and stops those of monitors gone."""
        wanted = {"rtt": self.rtt, "scrape": self.scraper, "access_log": self.access_log}
        for name, monitor in wanted.items():
            task = self._tasks.get(name)
            owner = getattr(task, "longroute_owner", None)
            if task is not None and owner is not monitor:
                task.cancel()
                del self._tasks[name]
            if monitor is not None and name not in self._tasks:
                if isinstance(monitor, AccessLog):
                    task = asyncio.create_task(monitor.run())
                else:
                    assert self._session is not None
                    task = asyncio.create_task(monitor.run(self._session))
                task.longroute_owner = monitor  # type: ignore[attr-defined]
                self._tasks[name] = task

    # ---- reload --------------------------------------------------------------
    async def reload(self) -> ReloadResult:
        """Reads the config file again and swaps it in (:mod:`longroute.gateway.reload`);
        an invalid one changes nothing and the result says why. One at a time."""
        async with self._reload_lock:
            if self.config_path is None:
                result = ReloadResult("this gateway was not started from a config file")
            else:
                try:
                    wiring = prepare(
                        self.config_path, self.wiring, self.metrics, self.clock,
                        self._request_numbers,
                    )  # fmt: skip
                except ReloadError as exc:
                    result = ReloadResult(str(exc))
                else:
                    result = ReloadResult(None, describe_changes(self.config, wiring.config))
                    self.apply_wiring(wiring)
            self.metrics.reloads.labels("ok" if result.is_ok else "error").inc()
            if result.is_ok:
                log.info("config reloaded: %s", "; ".join(result.changes) or "no change")
            else:
                log.error("config reload refused, the old config still serves: %s", result.error)
            return result

    def apply_wiring(self, wiring: Wiring) -> None:
        """Swaps ``wiring`` in, in one step of the event loop (:func:`~longroute.gateway.
        reload.apply_wiring`)."""
        apply_wiring(self, wiring)

    def _count_rejected(self, code: str) -> bytes:
        """The server answered a request itself (malformed HTTP, a head or body over its
        limit, a head past its deadline): counted, logged at debug with a new request id,
        which the error's head carries (the client's own id, if any, was not read)."""
        self.metrics.errors.labels(_REJECT_KINDS.get(code, "bad_request")).inc()
        request_id = self.ids.take(None)
        log.debug("the HTTP layer answered %s itself (request %s)", code, request_id)
        return self._id_head % request_id.encode("ascii")

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
        if self._ops_server is not None:
            await self._ops_server.close(0.0)
            self._ops_server = None
        tasks = [*self._tasks.values(), *self.retiring]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self.retiring.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.proxy.close()
        if self.engine_truth is not None:
            await self.engine_truth.close()
        if self.access_log is not None:
            self.access_log.close()
        await asyncio.to_thread(self.tracing.close)  # an export may wait on a collector
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
    config_path: Path | None = None,
) -> AsyncIterator[RunningGateway]:
    """Runs a gateway for the ``async with`` block (port 0 picks a free one).

    ``secrets`` default to the environment (see resolve_secrets); host and port to
    the config's ``listen``; ``config_path``: the file to read again on a reload.
    """
    gateway = Gateway(
        config,
        secrets if secrets is not None else resolve_secrets(config),
        config_path=config_path,
    )
    bind_host = host if host is not None else config.listen.host
    addresses = await gateway.start(bind_host, port if port is not None else config.listen.port)
    try:
        bound_host, bound_port = addresses[0]
        yield RunningGateway(f"http://{bound_host}:{bound_port}", gateway)
    finally:
        await gateway.stop()


__all__ = ["Gateway", "RunningGateway", "check_content_type", "serve_gateway"]
