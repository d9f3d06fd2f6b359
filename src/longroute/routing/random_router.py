"""Uniform random routing: the baseline every other router must beat."""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision


@ROUTERS.register("random")
class RandomRouter(BaseRouter):
    """Picks a healthy candidate uniformly at random from the injected RNG.

    Called once per request attempt; state: none beyond the RNG.
    """

    name = "random"

    def __init__(self, *, rng: random.Random | None = None) -> None:
        super().__init__(rng=rng)

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        chosen = candidates[self.rng.randrange(len(candidates))].endpoint.name
        return RouteDecision(
            endpoint=chosen,
            scores={s.endpoint.name: 0.0 for s in candidates},
            score_meaning="none: every candidate is equally likely",
            reason=f"uniform random among {len(candidates)} candidates",
        )
