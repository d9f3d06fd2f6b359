"""The gateway application: wiring, request handlers and background tasks.

``create_app(config)`` builds everything that needs no event loop (router
by registry name, FleetView, admission, metrics, health); the shared
``aiohttp.ClientSession`` and the background loops (health checks, RTT
probes, engine scraping) start with the application and stop with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from longroute.clock import WallClock
from longroute.gateway.admission import Admission
from longroute.gateway.backends import Backend, build_backends
from longroute.gateway.config import GatewayConfig, GatewaySecrets, resolve_secrets
from longroute.gateway.errors import SERVER_ERROR, GatewayError
from longroute.gateway.health import HealthMonitor
from longroute.gateway.intake import ContextReuse, Job, RequestBuilder, authorize, read_body
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.parse import ROUTES, parse_body
from longroute.gateway.proxy import Proxy
from longroute.gateway.rtt_probe import RttProber
from longroute.gateway.scrape import EngineScraper
from longroute.routing import ROUTERS
from longroute.routing.fleet_view import FleetView

log = logging.getLogger("longroute.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """Everything one gateway process owns; handlers are its methods."""

    def __init__(self, config: GatewayConfig, secrets: GatewaySecrets) -> None:
        self.config = config
        self.clock = WallClock()
        self.backends = build_backends(config, secrets.backend_api_keys)
        self.client_api_keys = secrets.client_api_keys
        self.router = ROUTERS.build(
            config.router.name, config.router.params, rng=random.Random(config.router.seed)
        )
        self.fleet = FleetView(
            [b.endpoint for b in self.backends.values()],
            prefix_capacity_blocks=config.prefix_index_capacity_blocks,
            is_prefix_index_enabled=self.router.needs_prefix_index,
        )
        self.metrics = GatewayMetrics(self.fleet, lambda: self.admission.num_waiting)
        self.admission = Admission(
            self.fleet,
            self.router,
            {b.name: b.max_concurrency for b in self.backends.values()},
            max_queue=config.admission.max_queue,
            queue_policy=config.admission.queue_policy,
            clock=self.clock,
            observe_decision_s=self.metrics.decision.observe,
        )
        self.health = HealthMonitor(self.backends, config.health, self.clock, self._health_changed)
        self.proxy = Proxy(
            self.backends, self.admission, self.health, self.metrics, config.admission
        )
        self.rtt, self.scraper = _monitors(config, self.backends, self.fleet, self.clock)
        # served models map to themselves, aliases to their target (a model or "auto")
        self.served_models = frozenset(b.model for b in self.backends.values())
        self.models: dict[str, str] = {b.model: b.model for b in self.backends.values()}
        self.models.update(config.model_aliases)
        self._models_body = _models_body(self.models)
        self.requests = RequestBuilder(
            config, self.clock, is_hashing=self.router.needs_prefix_index
        )
        reuse = config.context_reuse
        self.context = ContextReuse(reuse, self.metrics) if reuse.enabled else None
        self.background_tasks: list[asyncio.Task[None]] = []

    def _health_changed(self, name: str, is_healthy: bool) -> None:
        self.fleet.set_health(name, is_healthy)
        self.admission.wake()

    # ---- completions ---------------------------------------------------------
    def completion_handler(self, route: str) -> Handler:
        async def handle(http_request: web.Request) -> web.StreamResponse:
            return await self.handle_completion(http_request, route)

        return handle

    async def handle_completion(self, http_request: web.Request, route: str) -> web.StreamResponse:
        started_s = time.monotonic()
        model_label = endpoint = ""
        try:
            authorize(http_request.headers, self.client_api_keys)
            raw = await read_body(http_request, self.config.admission.max_body_bytes)
            parsed = parse_body(raw, route)
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
                self.requests.build(parsed, target, http_request.headers),
                is_alias=parsed.model not in self.served_models,
                started_s=started_s,
                timeout_s=self.config.admission.request_timeout_s,
            )
            response, endpoint = await self.proxy.forward(http_request, job)
        except GatewayError as err:
            self.metrics.errors.labels(err.kind).inc()
            response = err.response()
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
        status = response.status
        self.metrics.requests.labels(route, model_label, endpoint, str(status)).inc()
        if status < 400:
            self.metrics.e2e.observe(time.monotonic() - started_s)
        return response

    # ---- everything else -----------------------------------------------------
    async def handle_models(self, http_request: web.Request) -> web.StreamResponse:
        try:
            authorize(http_request.headers, self.client_api_keys)
        except GatewayError as err:
            return err.response()
        return web.Response(body=self._models_body, content_type="application/json")

    async def handle_unknown(self, http_request: web.Request) -> web.StreamResponse:
        """Any other /v1 path or method: OpenAI's 404 shape instead of aiohttp's text."""
        message = f"Invalid URL ({http_request.method} {http_request.path})"
        return GatewayError(404, message, kind="unknown_url").response()

    async def handle_health(self, _: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def handle_ready(self, _: web.Request) -> web.StreamResponse:
        healthy = [n for n, b in self.health.breakers.items() if b.is_closed]
        status = 200 if healthy else 503
        body = {"status": "ready" if healthy else "no healthy backend", "healthy": healthy}
        return web.json_response(body, status=status)

    async def handle_metrics(self, _: web.Request) -> web.StreamResponse:
        from prometheus_client import CONTENT_TYPE_LATEST

        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def handle_admin_fleet(self, http_request: web.Request) -> web.StreamResponse:
        try:
            authorize(http_request.headers, self.client_api_keys)
        except GatewayError as err:
            return err.response()
        return web.json_response(self.fleet_snapshot())

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

    async def run_background(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: the shared client session and the monitoring loops."""
        limits = [b.max_concurrency for b in self.backends.values()]
        connector = aiohttp.TCPConnector(
            limit=sum(limits) + 4 * len(limits),  # admission binds first; probes have room
            limit_per_host=max(limits) + 4,
            keepalive_timeout=self.config.backend_keepalive_s,
            ttl_dns_cache=10,  # follow DNS changes (e.g. a rescheduled pod) within seconds
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(),  # each request sets its own deadline
            cookie_jar=aiohttp.DummyCookieJar(),  # one backend's cookies must not reach others
        )
        self.proxy.start(session)
        loops = [self.health.run(session)]
        loops += [m.run(session) for m in (self.rtt, self.scraper) if m is not None]
        tasks = [asyncio.create_task(loop) for loop in loops]
        self.background_tasks = tasks
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()


def _monitors(
    config: GatewayConfig, backends: Mapping[str, Backend], fleet: FleetView, clock: WallClock
) -> tuple[RttProber | None, EngineScraper | None]:
    """The RTT prober and the engine scraper, each only if its interval is set."""
    rtt = scraper = None
    if config.rtt_probe_interval_s is not None:
        rtt = RttProber(
            backends,
            fleet,
            interval_s=config.rtt_probe_interval_s,
            timeout_s=config.health.timeout_s,
        )
    if config.scrape_interval_s is not None:
        scraper = EngineScraper(
            backends,
            fleet,
            clock,
            interval_s=config.scrape_interval_s,
            timeout_s=config.health.timeout_s,
        )
    return rtt, scraper


def _models_body(models: dict[str, str]) -> bytes:
    """The /v1/models answer, built once: served models first, then aliases."""
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "longroute"}
        for name in models
    ]
    return json.dumps({"object": "list", "data": data}).encode()


def _model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model `{model}` does not exist or is not served here.",
        kind="model_not_found",
        code="model_not_found",
        param="model",
    )


GATEWAY_KEY = web.AppKey("longroute_gateway", Gateway)


def create_app(config: GatewayConfig, secrets: GatewaySecrets | None = None) -> web.Application:
    """The aiohttp application; ``secrets`` default to the environment (see resolve_secrets)."""
    gateway = Gateway(config, secrets if secrets is not None else resolve_secrets(config))
    app = web.Application(client_max_size=config.admission.max_body_bytes)
    app[GATEWAY_KEY] = gateway
    for route in ROUTES:
        app.router.add_post(route, gateway.completion_handler(route))
    app.router.add_get("/v1/models", gateway.handle_models)
    app.router.add_route("*", "/v1/{tail:.*}", gateway.handle_unknown)
    app.router.add_get("/health", gateway.handle_health)
    app.router.add_get("/ready", gateway.handle_ready)
    app.router.add_get("/metrics", gateway.handle_metrics)
    if config.admin_enabled:
        app.router.add_get("/admin/fleet", gateway.handle_admin_fleet)
    app.cleanup_ctx.append(gateway.run_background)
    return app


__all__ = ["GATEWAY_KEY", "Gateway", "create_app"]
