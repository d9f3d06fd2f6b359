"""vLLM's load balancer, as the Chimera paper's baseline describes it (seed 003, §4.2).

"Its load balancer dispatches each request to the engine with the lowest
weighted sum of waiting and running requests." Waiting and running come from
the router's own in-flight counts (every request this router sent and that has
not finished), split at the endpoint's ``max_num_seqs``: the first
``max_num_seqs`` run, the rest wait. Router-side counts are exact and never
stale; an engine's scraped queue lags by a scrape interval, and balancing on a
stale count herds a burst onto one engine. Where the engine reports a longer
waiting queue than the router knows of (traffic from elsewhere), the larger
count is used.

It knows neither which model is faster nor which is more accurate: that is
the gap Chimera closes. It is also the dispatcher of the paper's MLFQ and LTR
baselines and of the oracle STJF reference (``routing.workflow_baselines``).
"""

from __future__ import annotations

import math
import random

from longroute.routing.base import ROUTERS, BaseRouter, pick_min
from longroute.routing.fleet_view import FleetView
from longroute.types import EndpointState, Request, RouteDecision

DEFAULT_WAITING_WEIGHT = 2.0
"""A waiting request counts twice a running one: it has all its work ahead of it."""


def vllm_load(state: EndpointState, waiting_weight: float) -> float:
    """waiting_weight x waiting + running for one endpoint (see the module docstring)."""
    num_seqs = state.endpoint.max_num_seqs
    inflight = state.num_inflight_requests
    running = min(inflight, num_seqs)
    waiting = inflight - running
    scraped = state.engine_num_waiting
    if scraped is not None and scraped > waiting:
        waiting = scraped
    return waiting_weight * waiting + running


def check_waiting_weight(value: float) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"waiting_weight must be a finite number >= 0, got {value!r}")
    return float(value)


@ROUTERS.register(
    "vllm-lb",
    description="vLLM's load balancer: least weighted sum of waiting and running requests",
)
class VllmLoadBalancer(BaseRouter):
    """Lowest ``waiting_weight`` x waiting + running requests; ties in fleet order.

    Called once per request attempt; O(candidates).
    """

    name = "vllm-lb"

    def __init__(
        self, *, waiting_weight: float = DEFAULT_WAITING_WEIGHT, rng: random.Random | None = None
    ) -> None:
        super().__init__(rng=rng)
        self.waiting_weight = check_waiting_weight(waiting_weight)

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        weight = self.waiting_weight
        scores = {s.endpoint.name: vllm_load(s, weight) for s in fleet.candidates(request)}
        chosen = pick_min(scores)
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=f"{weight:g} x waiting + running requests, lower is better",
            reason=f"least loaded ({scores[chosen]:.0f})",
        )
