"""AIBrix's prefix-cache-aware routing, re-implemented as a baseline (``aibrix-prefix-cache``).

Source: the pseudo-code and configuration notes of "Prefix Cache Aware" in
AIBrix's ``pkg/plugins/gateway/algorithms/README.md`` (github.com/vllm-project/aibrix),
with details checked against its Go router (``prefix_cache.go``). Our own code.
"""

from __future__ import annotations

import math
import random

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision

_RUNNING_MEANING = "requests in flight, lower is better"
_MATCH_MEANING = (
    "-(match % + 1) + running/(max running + 1) for matching pods at or under "
    "mean + load_factor*sd of running; running/(max running + 1) for the rest; lower is better"
)


def _check(name: str, value: float) -> float:
    if isinstance(value, bool) or not (
        isinstance(value, int | float) and math.isfinite(value) and value >= 0
    ):
        raise ValueError(f"aibrix-prefix-cache: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


@ROUTERS.register(
    "aibrix-prefix-cache",
    description="AIBrix's prefix-cache routing: cached prefix, unless the load is unbalanced",
)
class AibrixPrefixCacheRouter(BaseRouter):
    """AIBrix's prefix-cache router: imbalance check, prefix match %, mean + k*sd load bar.

    "Running requests" are the router's own in-flight counts over the
    candidates (AIBrix's gateway-side running count over the ready pods).

    1. Imbalance check: if ``max(running) - min(running) > imbalance_abs_count``,
       go to the pod with the fewest running requests; the prefix is not looked at.
    2. Otherwise, per pod, the match percentage = leading prompt blocks it holds
       in ``fleet.prefix_index`` * 100 // prompt blocks (integer, as AIBrix's
       index computes it). Pods holding >= 1 block are sorted by percentage
       descending, then running ascending; the first with running
       ``<= mean + load_factor * sd`` (mean and sample standard deviation of
       running over all candidates, sd 0 for one pod) wins.
    3. No match, or every matching pod over that bar: fewest running requests.
    4. AIBrix adds the prompt's blocks to the chosen pod's prefix table on
       every route; here the fleet view's owner does it on dispatch
       (``needs_prefix_index``), under its per-endpoint LRU capacity (AIBrix:
       200,000 blocks in all, idle blocks evicted after 20 minutes).

    Parameters:

    * ``imbalance_abs_count``
      (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT): the
      running-request spread above which load counts as imbalanced. The README
      states two defaults, 8 in its pseudo-code and 16 in its configuration
      table; we use 8, as did the Go code that introduced the check (later
      AIBrix versions replace it by a relative gate; we follow the README).
    * ``load_factor`` (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR): k in the
      mean + k*sd bar; default 2, the README's (the Go code defaults to 1).
      The bar is inclusive (``<=``), as in the README's configuration table
      and the Go code; the pseudo-code's strict ``<`` would refuse every
      match whenever all pods run the same count (sd 0).

    Remaining ties (same least count; same percentage and count) are broken
    uniformly at random with the injected ``rng``, as AIBrix does.

    Called once per request attempt; O(candidates log candidates + log prompt blocks).
    """

    name = "aibrix-prefix-cache"
    needs_prefix_index = True

    def __init__(
        self,
        *,
        imbalance_abs_count: float = 8,
        load_factor: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        self.imbalance_abs_count = _check("imbalance_abs_count", imbalance_abs_count)
        self.load_factor = _check("load_factor", load_factor)

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        running = {s.endpoint.name: s.num_inflight_requests for s in fleet.candidates(request)}
        low = min(running.values())
        high = max(running.values())
        if high - low > self.imbalance_abs_count:
            return self._least_running(
                running,
                f"load imbalance: running {low}..{high}, spread > {self.imbalance_abs_count:g}",
            )
        hashes = request.block_hashes
        num_blocks = len(hashes)
        matched = fleet.prefix_index.match(hashes) if num_blocks else {}
        percent = {
            name: blocks * 100 // num_blocks
            for name, blocks in matched.items()
            if blocks > 0 and name in running
        }
        if not percent:
            return self._least_running(running, f"no prefix match ({num_blocks} blocks)")
        count = len(running)
        mean = sum(running.values()) / count
        sd = (
            math.sqrt(sum((r - mean) ** 2 for r in running.values()) / (count - 1))
            if count > 1
            else 0.0
        )
        bar = mean + self.load_factor * sd
        order = list(percent)
        self.rng.shuffle(order)  # ties in (percent, running) go uniformly at random
        order.sort(key=lambda name: (-percent[name], running[name]))
        chosen = next((name for name in order if running[name] <= bar), None)
        if chosen is None:
            return self._least_running(
                running, f"every matching pod runs > mean + k*sd = {bar:.2f}"
            )
        scale = high + 1
        scores = {
            name: (
                -(percent[name] + 1) + load / scale
                if name in percent and load <= bar
                else load / scale
            )
            for name, load in running.items()
        }
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=_MATCH_MEANING,
            reason=(
                f"prefix match {percent[chosen]}% ({matched[chosen]}/{num_blocks} blocks), "
                f"running {running[chosen]} <= mean + k*sd = {bar:.2f}"
            ),
        )

    def _least_running(self, running: dict[str, int], why: str) -> RouteDecision:
        low = min(running.values())
        tied = [name for name, load in running.items() if load == low]
        chosen = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        return RouteDecision(
            endpoint=chosen,
            scores={name: float(load) for name, load in running.items()},
            score_meaning=_RUNNING_MEANING,
            reason=f"{why}; fewest running ({low})",
        )
