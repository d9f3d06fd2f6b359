"""LTR: vLLM's load balancer plus learning-to-rank shortest-job-first (Fu et al., NeurIPS 2024).

The Chimera paper's strongest baseline (seed 003, §4.2): a ranking model
orders requests by their *own* predicted output length and each engine's
local queue serves the shortest first. It has no workflow view (it ranks the
current stage, not the work left in the workflow) and no confidence: the
dispatcher is ``vllm-lb``. The score (``LengthRanker``, fitted with
``longroute fit ltr``) becomes the request's priority; run it with the
``priority`` (or ``stjf``, for aging) queue policy in the engines.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from longroute.routing.base import ROUTERS
from longroute.routing.fleet_view import FleetView
from longroute.routing.vllm_lb import DEFAULT_WAITING_WEIGHT, VllmLoadBalancer
from longroute.types import Request, RouteDecision


class LengthScorer(Protocol):
    """Higher = longer own output; ``estimators.length_rank.LengthRanker`` satisfies it."""

    def score(self, request: Request) -> float: ...


@ROUTERS.register(
    "ltr",
    description="vLLM's load balancer plus learning-to-rank shortest job first",
)
class LtrRouter(VllmLoadBalancer):
    """``vllm-lb``'s choice, with the ranker's score as priority. O(candidates) + one score."""

    name = "ltr"
    workflow_predictors = ("ranker",)

    def __init__(
        self,
        *,
        ranker: LengthScorer | str | Path,
        waiting_weight: float = DEFAULT_WAITING_WEIGHT,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(waiting_weight=waiting_weight, rng=rng)
        if isinstance(ranker, str | Path):
            from longroute.estimators.workflow_models import load_ranker

            ranker = load_ranker(Path(ranker))
        self.ranker: LengthScorer = ranker

    def queue_priority(self, request: Request) -> float:
        """The rank score, to order a request waiting in the gateway before it is routed."""
        return float(self.ranker.score(request))

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        decision = super().route(request, fleet, now_s)
        score = self.queue_priority(request)
        return replace(
            decision, reason=f"{decision.reason}; rank score {score:.3g}", priority=score
        )
