"""Round-robin routing over the healthy candidates, in fleet order."""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import AUTO_MODEL, FleetView
from longroute.types import Endpoint, Request, RouteDecision


@ROUTERS.register("round-robin")
class RoundRobinRouter(BaseRouter):
    """Cycles over the candidates in fleet order, one cursor per requested model.

    The cursor is the fleet position of the last endpoint chosen for that
    model; the next pick is the first candidate after it (wrapping), so an
    endpoint that turns unhealthy is skipped and one that recovers rejoins
    at its place in the cycle. Called once per request attempt; O(candidates).
    """

    name = "round-robin"

    def __init__(self, *, rng: random.Random | None = None) -> None:
        super().__init__(rng=rng)
        self._last_position: dict[str, int] = {}
        self._positions: dict[str, int] = {}
        self._positions_of: tuple[Endpoint, ...] | None = None

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        if fleet.endpoints is not self._positions_of:
            self._positions = {e.name: i for i, e in enumerate(fleet.endpoints)}
            self._positions_of = fleet.endpoints
        positions = self._positions
        model = AUTO_MODEL if request.model is None else request.model
        last = self._last_position.get(model)
        start = 0
        if last is not None:
            for i, state in enumerate(candidates):
                if positions[state.endpoint.name] > last:
                    start = i
                    break
        chosen = candidates[start].endpoint.name
        self._last_position[model] = positions[chosen]
        n = len(candidates)
        return RouteDecision(
            endpoint=chosen,
            scores={s.endpoint.name: float((i - start) % n) for i, s in enumerate(candidates)},
            score_meaning="turns until this endpoint's turn, lower is better",
            reason=f"next in cycle of {n} candidates",
        )
