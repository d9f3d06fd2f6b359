"""Least-request routing: the fewest requests in flight wins."""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter, pick_min
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision


@ROUTERS.register("least-request")
class LeastRequestRouter(BaseRouter):
    """Picks the candidate with the fewest router-dispatched requests in flight.

    Ties go to the first candidate in fleet order. Called once per request
    attempt; O(candidates).
    """

    name = "least-request"

    def __init__(self, *, rng: random.Random | None = None) -> None:
        super().__init__(rng=rng)

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        scores = {
            s.endpoint.name: float(s.num_inflight_requests) for s in fleet.candidates(request)
        }
        chosen = pick_min(scores)
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning="requests in flight, lower is better",
            reason=f"fewest requests in flight ({scores[chosen]:.0f})",
        )
