"""Load-aware routing as llm-d's load-aware scorer does it: engine queue depth, random ties.

llm-d's inference scheduler scores each pod from the engine's waiting queue
(``vllm:num_requests_waiting``, scraped), saturating at a threshold, and its
max-score picker chooses uniformly among the best. While no engine has a
queue, every endpoint ties and the choice is random -- which is why, in the
LAAR paper's evaluation (seed 000), load-aware routing still explored other
models on retries. This router keeps those semantics so that the paper's
baseline can be reproduced; ``least-load`` is longroute's token-counting
balancer.
"""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter, NoCandidateError
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision

DEFAULT_QUEUE_THRESHOLD = 128


@ROUTERS.register("load-aware")
class LoadAwareRouter(BaseRouter):
    """Picks among the endpoints with the shortest engine queue, uniformly at random.

    Score = min(waiting, threshold) / threshold, lower is better, from the
    last scrape of the engine (``EndpointState.engine_num_waiting``); an
    endpoint never scraped counts the router's own in-flight requests beyond
    its ``max_num_seqs`` as waiting. Ties are broken with the injected RNG.
    Called once per request attempt; O(candidates).
    """

    name = "load-aware"

    def __init__(
        self, *, queue_threshold: int = DEFAULT_QUEUE_THRESHOLD, rng: random.Random | None = None
    ) -> None:
        if queue_threshold < 1:
            raise ValueError(f"queue_threshold must be >= 1, got {queue_threshold}")
        super().__init__(rng=rng)
        self.queue_threshold = queue_threshold

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        threshold = self.queue_threshold
        scores: dict[str, float] = {}
        for s in fleet.candidates(request):
            waiting = s.engine_num_waiting
            if waiting is None:
                waiting = max(0, s.num_inflight_requests - s.endpoint.max_num_seqs)
            scores[s.endpoint.name] = min(waiting, threshold) / threshold
        if not scores:
            raise NoCandidateError("no candidate endpoint to choose from")
        best = min(scores.values())
        tied = [name for name, score in scores.items() if score == best]
        chosen = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=f"engine waiting queue / {threshold} (saturating), lower is better",
            reason=f"shortest engine queue (score {best:.3f}), random among {len(tied)} tied",
        )
