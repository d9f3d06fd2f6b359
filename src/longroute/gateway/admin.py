"""The gateway's admin API (``admin_enabled``): the fleet view, reload and the tuning freeze.

``GET /admin/fleet`` shows the FleetView, circuits and scraped engine stats;
``POST /admin/reload`` reloads the config file (:mod:`longroute.gateway.reload`);
``POST /admin/tuning/freeze`` freezes live tuning (:mod:`longroute.gateway.tuning`).
A call that changes the gateway needs the admin key (``admin_api_key_env``) and is
refused when none is configured; the fleet view takes the admin key, or a client key
when there is no admin key.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from longroute.gateway.errors import GatewayError
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpRequest, HttpResponse
from longroute.gateway.intake import authorize

if TYPE_CHECKING:
    from longroute.gateway.app import Gateway, RouteHandler


class AdminRoutes:
    """The admin handlers of one gateway (read its state at each call)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def routes(self) -> dict[tuple[str, str], RouteHandler]:
        return {
            ("GET", "/admin/fleet"): self.fleet,
            ("POST", "/admin/reload"): self.reload,
            ("POST", "/admin/tuning/freeze"): self.freeze,
        }

    async def fleet(self, http_request: HttpRequest, _: ResponseStream, __: str) -> Any:
        try:
            self.authorize(http_request, is_change=False)
        except GatewayError as err:
            return err.response()
        return HttpResponse(200, json.dumps(self.fleet_snapshot()).encode(), JSON_TYPE)

    async def reload(self, http_request: HttpRequest, _: ResponseStream, __: str) -> Any:
        """Reloads the config file: 200 with what changed, or 400 with why not (the old
        config still serves)."""
        try:
            self.authorize(http_request, is_change=True)
        except GatewayError as err:
            return err.response()
        result = await self.gateway.reload()
        if not result.is_ok:
            return GatewayError(
                400, f"reload refused: {result.error}", kind="reload", code="invalid_config"
            ).response()
        body = {"status": "reloaded", "changes": list(result.changes)}
        return HttpResponse(200, json.dumps(body).encode(), JSON_TYPE)

    async def freeze(self, http_request: HttpRequest, _: ResponseStream, __: str) -> Any:
        """Freezes live tuning now: 200 with the weights and the file written."""
        try:
            self.authorize(http_request, is_change=True)
        except GatewayError as err:
            return err.response()
        if self.gateway.tuning is None:
            return GatewayError(
                409, "live tuning is off (no tuning section in the config)", kind="tuning",
                code="tuning_off",
            ).response()  # fmt: skip
        result = self.gateway.tuning.freeze("on request (POST /admin/tuning/freeze)")
        body = {
            "weights": result.weights,
            "weights_file": None if result.path is None else str(result.path),
            "error": result.error,
        }
        return HttpResponse(200, json.dumps(body).encode(), JSON_TYPE)

    def authorize(self, http_request: HttpRequest, *, is_change: bool) -> None:
        """The admin key when one is configured; without one, a change is refused and a
        read takes a client key (as the rest of the API)."""
        admin_key = self.gateway.wiring.secrets.admin_api_key
        if admin_key is not None:
            authorize(http_request.headers, frozenset({admin_key}))
        elif is_change:
            raise GatewayError(
                403,
                "this admin call changes the gateway and needs the admin key; set "
                "admin_api_key_env in the config",
                kind="auth",
                code="admin_key_not_configured",
            )
        else:
            authorize(http_request.headers, self.gateway.wiring.client_api_keys)

    def fleet_snapshot(self) -> dict[str, Any]:
        """The fleet as the router sees it, plus breaker states and scraped engine stats."""
        backends: dict[str, Any] = {}
        for name in self.gateway.backends:
            state = self.gateway.fleet.state(name)
            engine = (
                self.gateway.scraper.stats.get(name) if self.gateway.scraper is not None else None
            )
            backends[name] = {
                "model": state.endpoint.model,
                "region": state.endpoint.region,
                "circuit": self.gateway.health.breakers[name].state.value,
                "rtt_ms": state.rtt_ms,
                "num_inflight_requests": state.num_inflight_requests,
                "num_slots": self.gateway.backends[name].max_concurrency,
                "num_queued_tokens": state.num_queued_tokens,
                "engine": None if engine is None else dataclasses.asdict(engine),
            }
        return {
            "router": self.gateway.router.name,
            "queue_depth": self.gateway.admission.num_waiting,
            "backends": backends,
        }


__all__ = ["AdminRoutes"]
