"""Cache-aware routing in the style of SGLang's router and AIBrix's prefix-cache policy."""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import EndpointState, Request, RouteDecision

LOAD_METRICS = ("requests", "tokens")


@ROUTERS.register("prefix-cache")
class PrefixCacheRouter(BaseRouter):
    """Sends a prompt where its prefix is cached, unless the fleet is out of balance.

    Three branches, tried in order:

    1. Imbalance guard: with load = requests in flight (``load_metric=
       "requests"``) or queued tokens (``"tokens"``), if ``max - min >
       abs_threshold`` and ``max > balance_rel_threshold * min`` over the
       candidates, go to the least loaded one. ``abs_threshold`` is
       ``balance_abs_threshold`` (requests) or ``balance_abs_threshold_tokens``.
    2. Cache hit: with ``fleet.prefix_index.match``, if the best matched
       fraction of the prompt's blocks is >= ``cache_threshold``, go to the
       longest match (ties: lower load, then fleet order).
    3. Otherwise go to the endpoint whose tree holds the fewest blocks, i.e.
       the most free cache (ties: lower load, then fleet order).

    Called once per request attempt; O(candidates + prompt blocks).
    """

    name = "prefix-cache"
    needs_prefix_index = True

    def __init__(
        self,
        *,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_abs_threshold_tokens: int = 262_144,
        balance_rel_threshold: float = 1.1,
        load_metric: str = "requests",
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}")
        if balance_abs_threshold_tokens < 0:
            raise ValueError(
                f"balance_abs_threshold_tokens must be >= 0, got {balance_abs_threshold_tokens}"
            )
        if balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {balance_rel_threshold}")
        if load_metric not in LOAD_METRICS:
            raise ValueError(
                f"load_metric must be one of {', '.join(LOAD_METRICS)}, got {load_metric!r}"
            )
        self.cache_threshold = cache_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.load_metric = load_metric
        self.is_token_load = load_metric == "tokens"
        self.abs_threshold = (
            balance_abs_threshold_tokens if self.is_token_load else balance_abs_threshold
        )

    def _load(self, state: EndpointState) -> int:
        if self.is_token_load:
            return state.num_queued_tokens
        return state.num_inflight_requests

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        loads = {s.endpoint.name: self._load(s) for s in candidates}
        max_load = max(loads.values())
        min_load = min(loads.values())
        if (
            max_load - min_load > self.abs_threshold
            and max_load > self.balance_rel_threshold * min_load
        ):
            chosen = min(loads, key=loads.__getitem__)  # first minimum in fleet order
            return RouteDecision(
                endpoint=chosen,
                scores={name: float(load) for name, load in loads.items()},
                score_meaning=f"load ({self.load_metric}), lower is better",
                reason=(
                    f"imbalance guard: load spread {min_load}..{max_load} exceeds "
                    f"abs {self.abs_threshold} and rel {self.balance_rel_threshold}"
                ),
            )
        num_blocks = len(request.block_hashes)
        matched = fleet.prefix_index.match(request.block_hashes) if num_blocks else {}
        best_match = max((matched.get(name, 0) for name in loads), default=0)
        if num_blocks and best_match / num_blocks >= self.cache_threshold:
            chosen = min(loads, key=lambda name: (-matched.get(name, 0), loads[name]))
            return RouteDecision(
                endpoint=chosen,
                scores={name: -float(matched.get(name, 0)) for name in loads},
                score_meaning="minus matched prefix blocks, lower is better; ties by load",
                reason=(
                    f"cache hit: {best_match}/{num_blocks} blocks matched "
                    f">= {self.cache_threshold}; load {loads[chosen]} ({self.load_metric})"
                ),
            )
        index = fleet.prefix_index
        tree_blocks = {name: index.num_blocks(name) for name in loads}
        chosen = min(loads, key=lambda name: (tree_blocks[name], loads[name]))
        return RouteDecision(
            endpoint=chosen,
            scores={name: float(blocks) for name, blocks in tree_blocks.items()},
            score_meaning="blocks held in the router's prefix tree, lower is better; ties by load",
            reason=(
                f"cache miss: best match {best_match}/{num_blocks} blocks "
                f"< {self.cache_threshold}; emptiest tree ({tree_blocks[chosen]} blocks)"
            ),
        )
