"""Least-load routing: the fewest queued tokens wins."""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter, pick_min
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision


@ROUTERS.register("least-load")
class LeastLoadRouter(BaseRouter):
    """Picks the candidate with the fewest queued tokens.

    Queued tokens are the prompt and expected output tokens of the requests
    the router dispatched there and that have not finished
    (``EndpointState.num_queued_tokens``). Ties go to the first candidate in
    fleet order. Called once per request attempt; O(candidates).
    """

    name = "least-load"

    def __init__(self, *, rng: random.Random | None = None) -> None:
        super().__init__(rng=rng)

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        scores = {  # EndpointState.num_queued_tokens, inlined (once per endpoint per request)
            s.endpoint.name: float(s.num_inflight_prompt_tokens + s.num_inflight_output_tokens)
            for s in fleet.candidates(request)
        }
        chosen = pick_min(scores)
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning="queued tokens (in-flight prompt + output), lower is better",
            reason=f"fewest queued tokens ({scores[chosen]:.0f})",
        )
