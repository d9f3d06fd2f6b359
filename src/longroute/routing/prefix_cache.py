"""Cache-aware routing in the style of SGLang's router and AIBrix's prefix-cache policy."""

from __future__ import annotations

import random

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision

LOAD_METRICS = ("requests", "tokens")
_HIT_MEANING = "minus matched prefix blocks, lower is better; ties by load"
_TREE_MEANING = "blocks held in the router's prefix tree, lower is better; ties by load"


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

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        if self.is_token_load:
            loads = {s.endpoint.name: s.num_queued_tokens for s in candidates}
        else:
            loads = {s.endpoint.name: s.num_inflight_requests for s in candidates}
        values = loads.values()
        max_load = max(values)
        min_load = min(values)
        if (
            max_load - min_load > self.abs_threshold
            and max_load > self.balance_rel_threshold * min_load
        ):
            return self._balance(loads, min_load, max_load)
        block_hashes = request.block_hashes
        num_blocks = len(block_hashes)
        index = fleet.prefix_index
        if num_blocks:
            matched = index.match(block_hashes)
            best_match = max((matched.get(name, 0) for name in loads), default=0)
            if best_match / num_blocks >= self.cache_threshold:
                return self._hit(loads, matched, best_match, num_blocks)
        else:
            best_match = 0
        tree_blocks = {name: index.num_blocks(name) for name in loads}
        chosen = min(loads, key=lambda name: (tree_blocks[name], loads[name]))
        return RouteDecision(
            endpoint=chosen,
            scores={name: float(blocks) for name, blocks in tree_blocks.items()},
            score_meaning=_TREE_MEANING,
            reason=(
                f"cache miss: best match {best_match}/{num_blocks} blocks "
                f"< {self.cache_threshold}; emptiest tree ({tree_blocks[chosen]} blocks)"
            ),
        )

    def _balance(self, loads: dict[str, int], min_load: int, max_load: int) -> RouteDecision:
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

    def _hit(
        self, loads: dict[str, int], matched: dict[str, int], best_match: int, num_blocks: int
    ) -> RouteDecision:
        chosen = min(loads, key=lambda name: (-matched.get(name, 0), loads[name]))
        return RouteDecision(
            endpoint=chosen,
            scores={name: -float(matched.get(name, 0)) for name in loads},
            score_meaning=_HIT_MEANING,
            reason=(
                f"cache hit: {best_match}/{num_blocks} blocks matched "
                f">= {self.cache_threshold}; load {loads[chosen]} ({self.load_metric})"
            ),
        )
