"""GORGO: one cost over network distance, uncached prefill and queued work (seed 001).

For every candidate replica r::

    cost(r) = rtt_weight * rtt_ms(r) + uncached_tokens(r) + queue_weight * queued_tokens(r)

and the request goes to the cheapest. ``rtt_ms`` is the fleet view's EWMA of
RTT samples (probes in the gateway, answers in the simulator);
``uncached_tokens`` is the prompt minus the leading blocks the router-side
prefix index believes ``r`` holds (what this router sent where, memory-bounded
LRU); ``queued_tokens`` is the router's own count of the work in flight at
``r``: for every request sent there and not yet completed, its uncached prompt
tokens at dispatch plus its output tokens (incremented in :meth:`on_dispatch`,
decremented in :meth:`on_complete`), plus, where the fleet view reads the
engines' global load (the gateway's ``load_source: engine``), the requests other
gateways sent there (``EndpointState.num_other_requests``), each sized as the mean
work this router dispatched, so several gateway replicas see one queue. Counting
the uncached part, not the whole
prompt, keeps a long conversation's cached history from looking like queued
work and pushing the conversation away from its cache. With
``queue_release="first-token"`` the counter is a prefill queue instead (a
reading of the seed's "queued tokens" as work waiting ahead of a new prompt,
which the paper's weights, queue_weight 0.5, suit): only the uncached prompt
tokens, released when the first token comes back (:meth:`on_first_token`,
or at completion if it never does), so no output length is assumed (a proxy
does not know it; ``num_output_tokens`` is an estimate, in the simulator as in the
gateway).
That mode needs its host to call :meth:`on_first_token`;
:attr:`num_first_tokens_seen` shows whether it does. The weights are
dimensionless (tokens per ms, tokens per queued token); they come from the
constructor, from a frozen-weights file written by ``longroute tune``, or
from the online tuner through :meth:`set_weights`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path

from longroute.routing.base import ROUTERS, BaseRouter, pick_min
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision

# The paper's weights, tuned by (1+1)-ES on its full-load window (Table 1).
PAPER_RTT_WEIGHT = 0.276
PAPER_QUEUE_WEIGHT = 0.5
WEIGHT_NAMES = ("rtt_weight", "queue_weight")
QUEUE_RELEASES = ("complete", "first-token")


@ROUTERS.register(
    "gorgo",
    description="GORGO: least cost over network distance, uncached prefill and queued work",
)
class GorgoRouter(BaseRouter):
    """Routes to argmin of ``rtt_weight*rtt_ms + uncached_tokens + queue_weight*queued_tokens``.

    Called once per request attempt; O(candidates + prompt blocks): one walk
    of the prefix index, then one multiply-add per candidate. Ties go to the
    first candidate in fleet order. Tunable: :meth:`get_weights` and
    :meth:`set_weights` expose ``rtt_weight`` and ``queue_weight``.
    """

    name = "gorgo"
    needs_prefix_index = True

    def __init__(
        self,
        *,
        rtt_weight: float | None = None,
        queue_weight: float | None = None,
        weights_file: str | None = None,
        queue_release: str = "complete",
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        if queue_release not in QUEUE_RELEASES:
            raise ValueError(
                f"gorgo: unknown queue_release {queue_release!r}; "
                f"valid: {', '.join(QUEUE_RELEASES)}"
            )
        self.queue_release = queue_release
        self.is_prefill_queue = queue_release == "first-token"
        self.num_first_tokens_seen = 0
        weights = {"rtt_weight": PAPER_RTT_WEIGHT, "queue_weight": PAPER_QUEUE_WEIGHT}
        if weights_file is not None:
            if rtt_weight is not None or queue_weight is not None:
                raise ValueError(
                    "gorgo: give the weights either as rtt_weight/queue_weight or in "
                    f"weights_file ({weights_file}), not both"
                )
            weights = _weights_from_file(Path(weights_file))
        if rtt_weight is not None:
            weights["rtt_weight"] = rtt_weight
        if queue_weight is not None:
            weights["queue_weight"] = queue_weight
        self.rtt_weight = 0.0
        self.queue_weight = 0.0
        self.set_weights(weights)
        # queued work per endpoint, and per request in flight: (endpoint, its work)
        self.queued_tokens: dict[str, int] = {}
        self._work: dict[tuple[str, int], tuple[str, int]] = {}
        # the mean work of a dispatch: the size of another gateway's request
        self._work_sum = 0
        self._num_dispatches = 0
        # the last route() call's matched blocks per endpoint, for on_dispatch
        self._last_key: tuple[str, int] | None = None
        self._last_matched: dict[str, int] = {}

    def get_weights(self) -> dict[str, float]:
        return {"rtt_weight": self.rtt_weight, "queue_weight": self.queue_weight}

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Replace some or all weights; each must be finite and >= 0."""
        unknown = sorted(set(weights) - set(WEIGHT_NAMES))
        if unknown:
            raise ValueError(
                f"gorgo has no weight {', '.join(unknown)}; valid: {', '.join(WEIGHT_NAMES)}"
            )
        for key, value in weights.items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"gorgo: {key} must be a finite number >= 0, got {value!r}")
        self.rtt_weight = float(weights.get("rtt_weight", self.rtt_weight))
        self.queue_weight = float(weights.get("queue_weight", self.queue_weight))
        self._score_meaning = (
            f"{self.rtt_weight:.4g}*rtt_ms + uncached_tokens + "
            f"{self.queue_weight:.4g}*queued_tokens, lower is better"
        )

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        hashes = request.block_hashes
        matched = fleet.prefix_index.match(hashes) if hashes else {}
        num_prompt = request.num_prompt_tokens
        block_tokens = request.block_size_tokens
        w_rtt = self.rtt_weight
        w_queue = self.queue_weight
        queued = self.queued_tokens
        scores: dict[str, float] = {}
        for state in candidates:
            name = state.endpoint.name
            uncached = num_prompt - matched.get(name, 0) * block_tokens
            if uncached < 0:  # the last block may be partial
                uncached = 0
            queue: float = queued.get(name, 0)
            others = state.num_other_requests
            if others and self._num_dispatches:
                queue += others * self._work_sum / self._num_dispatches
            scores[name] = w_rtt * state.rtt_ms + uncached + w_queue * queue
        self._last_key = (request.request_id, request.attempt)
        self._last_matched = matched
        chosen = pick_min(scores)
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=self._score_meaning,
            reason="cheapest cost",
        )

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        """Count the request's work at ``endpoint`` until it is released (see queue_release)."""
        key = (request.request_id, request.attempt)
        uncached = request.num_prompt_tokens
        if key == self._last_key:
            uncached -= self._last_matched.get(endpoint, 0) * request.block_size_tokens
            uncached = max(uncached, 0)
        work = uncached if self.is_prefill_queue else uncached + request.num_output_tokens
        previous = self._work.pop(key, None)
        if previous is not None:  # re-sent before completing (gateway failover)
            self.queued_tokens[previous[0]] -= previous[1]
        self._work[key] = (endpoint, work)
        self.queued_tokens[endpoint] = self.queued_tokens.get(endpoint, 0) + work
        self._work_sum += work
        self._num_dispatches += 1

    def on_first_token(self, request: Request, endpoint: str, now_s: float) -> None:
        """The first token reached the router: with ``queue_release="first-token"``,
        the request's prompt leaves the queue. Called once per attempt, before
        :meth:`on_complete`; a no-op with ``queue_release="complete"``."""
        if not self.is_prefill_queue:
            return
        self.num_first_tokens_seen += 1
        entry = self._work.pop((request.request_id, request.attempt), None)
        if entry is not None:
            self.queued_tokens[entry[0]] -= entry[1]

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None:
        entry = self._work.pop((request.request_id, request.attempt), None)
        if entry is not None:
            self.queued_tokens[entry[0]] -= entry[1]

    def adopt_state(self, old: GorgoRouter) -> None:
        """Takes over ``old``'s queued work per endpoint and per request in flight (a
        gateway reload changed the weights or the release rule), so the queue term stays
        right while those requests finish."""
        self.queued_tokens.update(old.queued_tokens)
        self._work.update(old._work)
        self._work_sum += old._work_sum
        self._num_dispatches += old._num_dispatches

    @property
    def num_inflight(self) -> int:
        """Requests counted in :attr:`queued_tokens` (0 after every request completed)."""
        return len(self._work)


def _weights_from_file(path: Path) -> dict[str, float]:
    """The weights of a frozen-weights file written for gorgo (``longroute tune -o``)."""
    from longroute.tuning.weights_file import load_weights

    frozen = load_weights(path)
    if frozen.router != GorgoRouter.name:
        raise ValueError(
            f"{path}: weights were tuned for router {frozen.router!r}, not {GorgoRouter.name!r}"
        )
    return dict(frozen.weights)
