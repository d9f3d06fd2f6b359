"""TTCA: the least expected time to a correct answer, everything priced in seconds.

For a request x and each candidate endpoint e serving model m::

    T(e)  = (1 + w) * (rtt(e) + ttft_engine(e)) + (out - 1) * tpot(e) + x * ext(e)
    Q(e)  = Q(m, x)                                  (capability model; 1 without one)
    E(e)  = T(e) / Q(e)                              (retry_pricing "geometric", default)
    E(e)  = T(e) + (1 - Q(e)) * R(m)                 (retry_pricing "next-model")
    R(m)  = min over untried endpoints e' of another model of T(e') / Q(e')
            (T(e) / Q(e) when no other model is a candidate)

and the request goes to argmin E. ``rtt`` is the fleet view's RTT EWMA (request
out, first token back); ``ttft_engine`` the queue wait (what is left of the prompts owed
at e once the request gets there) plus the prefill of the request's uncached tokens at e
(prefix index) with the running decodes beside it,
and ``tpot`` the decode step at e's batch once it is admitted, both from e's
runtime predictor and learned corrections (:mod:`longroute.estimators.service_time`).
``out`` is the request's expected output length (the simulator's true length; the
gateway's ``max_tokens``). ``ext`` is the externality: what the request's prefill
chunks and batch slot add to the other requests at e, weighted by ``x``
(``externality_weight``, 1). ``w`` (``ttft_weight``, 4) weighs the wait for the first
token above a second of decode: a streaming user sits idle before it and reads after
it. With w = 0 the router minimises the answer's expected completion alone and gives
up TTFT p95 for E2E p95 (on ``gorgo`` 1.11x GORGO's TTFT p95 at 0.98x its E2E p95);
w = 2 was chosen on seeds 1-3, never the evaluation seeds, with the hand-set predictor
(docs/ttca.md).

Q applies to the tasks the capability model was fitted on: a request of another task
(or of none, such as a chat turn) is priced at Q = 1 unless ``price_other_tasks``, as
the fit says nothing of it. Before this rule, on ``mixed`` the router sent chat turns
to the models best at KV lookups.

``T / Q`` (LAAR's) prices a failure as a retry on the same endpoint, a geometric
series. ``"next-model"`` is what deterministic decoding suggests instead: the same model
repeats its wrong answer and the retry goes elsewhere, so a failure costs what the best
other model takes to answer correctly (its own ``T / Q`` for what lies beyond). With one
model both agree. Measured on ``laar`` (seed 10), ``"next-model"`` gave a mean TTCA of
25.7 s against 20.0 s for ``T / Q``, so the geometric form is the default; the cause of
the gap is not established (docs/ttca.md).

**Moving** (``session_price``, off by default; docs/ttca.md, issue 35). Where one
candidate holds the longest cached prefix of a turn (its *home*), sending it elsewhere is
a move. T at the other endpoint already holds the move's one-time cost: the recompute of
the prefix it does not hold, in its TTFT and its externality. The conversation's later
turns lose nothing: after this turn the new endpoint holds its whole prefix. What T does
not hold is the KV the move duplicates: where the new endpoint's cache is full, the copy
evicts as many tokens of other prefixes, and those conversations pay the recompute once
if they come back. So T at every other endpoint adds (1 + w) x the share of the
duplicate that evicts (the endpoint's held blocks in the prefix index against its KV
capacity) x the share of cached turns that are followed by another (learned:
R(1) / (1 + R(1)), R the mean residual of the turn counts seen,
:class:`~longroute.estimators.session_turns.SessionTurns`) x the prefill, at that
endpoint, of a prefix as long as the duplicate. An earlier version charged the move the
conversation's expected later turns x that prefill, as if each of them lost its cache.

Tried models rank after untried ones, as in LAAR: a tried endpoint scores
``E * tried_penalty ** tries + (largest untried E)``; once every candidate's model
was tried ``max_tries_per_model`` times the router raises
:class:`CandidatesExhaustedError`. With ``slo_mode``, endpoints whose predicted TTFT
meets the request's TTFT deadline rank before those that do not, each group by E.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.service_time import Calibration, EndpointTimeModel, Prediction
from longroute.estimators.session_turns import SessionTurns
from longroute.routing.base import ROUTERS, BaseRouter, pick_min
from longroute.routing.fleet_view import CandidatesExhaustedError, FleetView
from longroute.routing.laar import SuccessModel, penalise_tried, success_probability
from longroute.routing.ttca_support import (
    Flight,
    HeldBlocks,
    check_params,
    endpoint_time_predictor,
    evicted_share,
    kv_capacity_tokens,
    prefer_meeting,
    reuse_share,
)
from longroute.types import Endpoint, EndpointState, Request, RouteDecision

RETRY_PRICINGS = ("geometric", "next-model")
MIN_ENGINE_SHARE = 0.5
"""A first token teaches the TTFT correction only if the predicted engine time is at least
this share of the round trip."""
SCORE_MEANING = "expected seconds to a correct answer (tried models penalised)"


@ROUTERS.register(
    "ttca",
    description="The least expected time to a correct answer, everything priced in seconds",
)
class TtcaRouter(BaseRouter):
    """Routes to the least expected time to a correct answer (see the module docstring).

    Called once per request attempt; O(candidates + prompt blocks): one prefix-index
    walk, two runtime-predictor evaluations per candidate. Keeps one
    :class:`EndpointTimeModel` per endpoint (rebuilt if the name comes back with a
    different Endpoint) and one entry per request in flight.
    """

    name = "ttca"
    needs_prefix_index = True
    needs_observed_length = True  # its TPOT calibration divides by the answer's length
    needs_language = True
    wants_capability = True

    def __init__(
        self,
        *,
        capability: SuccessModel | str | Path | None = None,
        default_probability: float | None = None,
        min_probability: float = 0.01,
        tried_penalty: float = 1000.0,
        max_tries_per_model: int | None = 1,
        calibration_alpha: float = 0.1,
        externality_weight: float = 1.0,
        retry_pricing: str = "geometric",
        slo_mode: bool = False,
        price_other_tasks: bool = False,
        session_price: bool = False,
        ttft_weight: float = 4.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        check_params(
            default_probability=default_probability,
            min_probability=min_probability,
            tried_penalty=tried_penalty,
            max_tries_per_model=max_tries_per_model,
            calibration_alpha=calibration_alpha,
            weights={"externality_weight": externality_weight, "ttft_weight": ttft_weight},
            retry_pricing=retry_pricing,
            retry_pricings=RETRY_PRICINGS,
            flags={
                "slo_mode": slo_mode,
                "price_other_tasks": price_other_tasks,
                "session_price": session_price,
            },
        )
        if isinstance(capability, str | Path):
            from longroute.estimators.capability import load_capability

            capability = load_capability(capability)
        self.capability: SuccessModel | None = capability
        self.default_probability = default_probability
        self.min_probability = float(min_probability)
        self.tried_penalty = float(tried_penalty)
        self.max_tries_per_model = max_tries_per_model
        self.calibration_alpha = float(calibration_alpha)
        self.externality_weight = float(externality_weight)
        self.ttft_weight = float(ttft_weight)
        self.retry_pricing = retry_pricing
        self.is_geometric = retry_pricing == "geometric"
        self.slo_mode = slo_mode
        self.price_other_tasks = price_other_tasks
        self.session_price = session_price
        self._tasks: frozenset[str] = frozenset(getattr(capability, "tasks", ()))
        self._models: dict[str, tuple[Endpoint, EndpointTimeModel]] = {}
        # the last route() call: its key, matched blocks and per-endpoint predictions
        self._last_key: tuple[str, int] | None = None
        self._last: dict[str, tuple[int, int, Prediction, float]] = {}
        self._flights: dict[tuple[str, int], Flight] = {}
        # endpoints timed from the prior (no profile of their own): they share corrections
        self._prior_models: list[EndpointTimeModel] = []
        self._turns = SessionTurns()  # turns per conversation: how many more to expect
        self._kv_capacity: dict[str, int] = {}  # per endpoint, tokens of KV cache
        # per endpoint, the prompts' blocks last sent there, at most its KV memory's worth
        # (LRU, as the engine evicts): a prefix the fleet's index holds but this one does
        # not has likely been evicted there, and is priced as uncached
        self._held = HeldBlocks()

    # ------------------------------------------------------------------ hot path

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        hashes = request.block_hashes
        matched = fleet.prefix_index.match(hashes) if hashes else {}
        if matched:
            matched = self._held.cut(matched, hashes)
        prompt, out = request.num_prompt_tokens, request.num_output_tokens
        block = request.block_size_tokens
        tried = request.tried_models
        q_of: dict[str, float] = {}
        model_of: dict[str, str] = {}
        times: dict[str, float] = {}
        scores: dict[str, float] = {}
        last: dict[str, tuple[int, int, Prediction, float]] = {}
        first_weight = 1.0 + self.ttft_weight
        externality_weight = self.externality_weight
        models = self._models
        home = _home(matched, candidates) if self.session_price else ""
        dup_s = 0.0  # the weight on the prefill of the KV a move duplicates (module doc)
        home_cached = 0
        if home:
            home_cached = min(matched[home] * block, prompt)
            dup_s = first_weight * reuse_share(self._turns)
        for state in candidates:
            endpoint = state.endpoint
            name = endpoint.name
            entry = models.get(name)
            model = entry[1] if entry is not None and entry[0] is endpoint else None
            if model is None:
                model = self._time_model(endpoint)
            cached = matched.get(name, 0) * block
            if cached > prompt:
                cached = prompt
            uncached = prompt - cached
            rtt_s = state.rtt_ms / 1000.0
            p = model.predict(uncached, cached, out, state.engine_num_running, now_s, rtt_s)
            t = (
                first_weight * (rtt_s + p.ttft_engine_s)
                + (out - 1) * p.tpot_s
                + externality_weight * p.externality_s
            )
            if dup_s > 0.0 and name != home:  # a move (module docstring, "Moving")
                lost = home_cached - cached
                if lost > 0:
                    held = fleet.prefix_index.num_blocks(name) * block
                    evicts = evicted_share(held, lost, self._kv_capacity.get(name, 0))
                    if evicts > 0.0:
                        t += dup_s * evicts * model.prefill_alone_s(lost, cached)
            m = endpoint.model
            q = q_of.get(m)
            if q is None:
                q = q_of[m] = self._probability(m, request)
            times[name] = t
            scores[name] = t / q  # geometric; next-model replaces it below
            last[name] = (uncached, cached, p, rtt_s)
            model_of[name] = m
        self._last_key = (request.request_id, request.attempt)
        self._last = last
        if not self.is_geometric:
            scores = self._next_model(times, q_of, model_of, tried)
        if tried:
            self._penalise(scores, model_of, request, q_of)
        if self.slo_mode and request.slo is not None and request.slo.ttft_s is not None:
            deadline_s = request.arrival_s + request.slo.ttft_s - now_s
            prefer_meeting(
                scores, {n: v[3] + v[2].ttft_engine_s for n, v in last.items()}, deadline_s
            )
        chosen = pick_min(scores)
        uncached, cached, p, rtt_s = last[chosen]
        model_name = model_of[chosen]
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=SCORE_MEANING,
            reason=(
                f"least expected time to a correct answer on {model_name}: "
                f"Q={q_of[model_name]:.3f}, T={times[chosen]:.3f} s (rtt {rtt_s * 1e3:.0f} ms, "
                f"ttft {p.ttft_engine_s * 1e3:.0f} ms for {uncached} uncached of "
                f"{uncached + cached} tokens, tpot {p.tpot_s * 1e3:.1f} ms)"
            ),
            predicted_ttft_s=rtt_s + p.ttft_engine_s,
        )

    def _next_model(
        self,
        times: dict[str, float],
        q_of: dict[str, float],
        model_of: dict[str, str],
        tried: tuple[str, ...],
    ) -> dict[str, float]:
        """E(e) = T + (1 - Q) R(m), R the best T/Q among untried endpoints of other
        models (retry_pricing "next-model"; the geometric T/Q is scored in route())."""
        best_of: dict[str, float] = {}  # per untried model, its best T/Q
        for name, t in times.items():
            m = model_of[name]
            if m not in tried:
                v = t / q_of[m]
                if v < best_of.get(m, math.inf):
                    best_of[m] = v
        ranked = sorted(best_of.items(), key=lambda item: item[1])[:2]
        scores: dict[str, float] = {}
        for name, t in times.items():
            m = model_of[name]
            q = q_of[m]
            alt = next((v for bm, v in ranked if bm != m), t / q)
            scores[name] = t + (1.0 - q) * alt
        return scores

    def _probability(self, model: str, request: Request) -> float:
        """Q(m, x) floored at ``min_probability``; 1 without a capability model, and 1
        for a request of a task the capability model was not fitted on (None included)
        unless ``price_other_tasks``."""
        if self.capability is None:
            return 1.0
        if self._tasks and request.task not in self._tasks and not self.price_other_tasks:
            return 1.0
        return success_probability(
            self.capability,
            model,
            request,
            self.default_probability,
            self.min_probability,
            router=self.name,
        )

    def _penalise(
        self,
        scores: dict[str, float],
        model_of: dict[str, str],
        request: Request,
        q_of: dict[str, float],
    ) -> None:
        """Rank tried models after untried ones (as LAAR), or stop when all were tried."""
        tried = request.tried_models
        tried_names = [(n, model_of[n]) for n in scores if model_of[n] in tried]
        if not tried_names:
            return
        limit = self.max_tries_per_model
        if (
            len(tried_names) == len(scores)
            and limit is not None
            and all(tried.count(m) >= limit for m in q_of)
        ):
            raise CandidatesExhaustedError(
                f"ttca: every candidate model already answered request "
                f"{request.request_id!r} wrongly (tried: {', '.join(tried)})"
            )
        floor = max((s for n, s in scores.items() if model_of[n] not in tried), default=0.0)
        penalise_tried(scores, tried_names, floor, tried, self.tried_penalty)

    def check_endpoints(self, endpoints: Sequence[Endpoint]) -> list[str]:
        """Every endpoint can be timed: from its profiles, or from the prior where it names
        none (one note each: it is priced from the prior until calibrated). ``ValueError``
        for an endpoint that cannot (a measured-engine file that does not load, a layout
        its model cannot split into)."""
        notes = []
        for endpoint in endpoints:
            note = self._predictor(endpoint)[1]
            if note is not None:
                notes.append(f"ttca: {note}")
        return notes

    def _predictor(self, endpoint: Endpoint) -> tuple[RuntimePredictor, str | None]:
        try:
            return endpoint_time_predictor(endpoint)
        except ValueError as exc:
            raise ValueError(
                f"ttca: cannot predict times for endpoint {endpoint.name!r} "
                f"({endpoint.model} on {endpoint.num_gpus} x {endpoint.hardware}): {exc}"
            ) from exc

    def _time_model(self, endpoint: Endpoint) -> EndpointTimeModel:
        entry = self._models.get(endpoint.name)
        if entry is None or (entry[0] is not endpoint and entry[0] != endpoint):
            predictor, note = self._predictor(endpoint)
            self._kv_capacity[endpoint.name] = kv_capacity_tokens(predictor, endpoint)
            model = EndpointTimeModel(
                predictor, endpoint.max_num_batched_tokens, self.calibration_alpha
            )
            peers = self._prior_models
            if entry is not None and entry[1] in peers:  # the name came back changed
                peers.remove(entry[1])
            entry = self._models[endpoint.name] = (endpoint, model)
            if note is not None:  # timed from the prior: starts from what its peers learned
                if peers:
                    model.share_corrections(
                        max(peers, key=lambda p: p.num_ttft_observed + p.num_tpot_observed)
                    )
                peers.append(model)
        return entry[1]

    def _share(self, learner: EndpointTimeModel) -> None:
        """A prior-timed endpoint learned: its prior-timed peers that have not yet take it."""
        if learner in self._prior_models:
            for peer in self._prior_models:
                if peer is not learner:
                    peer.share_corrections(learner)

    # ------------------------------------------------------------------ hooks

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        key = (request.request_id, request.attempt)
        if self.session_price and request.attempt == 1 and request.session_id is not None:
            self._turns.observe(request.session_id)
        entry = self._last.get(endpoint) if key == self._last_key else None
        if entry is None:  # dispatched without a route() for it: count it all as uncached
            entry = (request.num_prompt_tokens, 0, Prediction(0.0, 0.0, 0.0, 0.0), 0.0)
        uncached, cached, prediction, rtt_s = entry
        previous = self._flights.pop(key, None)
        if previous is not None:  # re-sent before completing (gateway failover)
            previous.release(now_s)
        model_entry = self._models.get(endpoint)
        if model_entry is None:  # never priced: nothing to count it against
            return
        if request.block_hashes:
            blocks = self._kv_capacity.get(endpoint, 0) // request.block_size_tokens
            self._held.add(endpoint, request.block_hashes, blocks, now_s)
        model = model_entry[1]
        # with prefills queued ahead, a first token measures the queue model as much as
        # the profile: only one that found no prompt ahead of it teaches the correction
        is_probe = model.num_pending == 0
        model.add_pending(uncached, cached, now_s)
        kv = uncached + cached + request.num_output_tokens / 2.0
        self._flights[key] = Flight(model, uncached, cached, kv, prediction, rtt_s, now_s, is_probe)

    def on_first_token(self, request: Request, endpoint: str, now_s: float) -> None:
        flight = self._flights.get((request.request_id, request.attempt))
        if flight is None or flight.first_token_s is not None:
            return
        flight.first_token_s = now_s
        model = flight.model
        model.start_decoding(
            flight.uncached, flight.cached, flight.kv_tokens, flight.remaining,
            flight.dispatch_s, now_s,
        )  # fmt: skip
        p = flight.prediction
        # a first token says little of the engine when the network dominates it: its
        # jitter and peaks would be learned as a slower engine
        if flight.is_probe and p.prefill_s > 0.0 and p.prefill_s >= MIN_ENGINE_SHARE * flight.rtt_s:
            observed = now_s - flight.dispatch_s
            model.observe_ttft(
                flight.rtt_s + p.ttft_engine_s, observed, p.prefill_s, observed - flight.rtt_s
            )
            self._share(model)

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None:
        key = (request.request_id, request.attempt)
        flight = self._flights.pop(key, None)
        if flight is None:
            return
        first_s = flight.first_token_s
        flight.release(now_s)
        out = request.num_output_tokens
        if is_ok and first_s is not None and out > 1 and flight.prediction.step_s > 0.0:
            observed = (now_s - first_s) / (out - 1)
            p = flight.prediction
            flight.model.observe_tpot(p.tpot_s, observed, p.step_s)
            self._share(flight.model)

    def adopt_state(self, old: TtcaRouter) -> None:
        """Takes over what ``old`` learned and counts (a gateway reload changed the router's
        parameters): each endpoint's time model with its calibration corrections and
        pending work, and the requests in flight, so their completions still teach and
        release. The new ``calibration_alpha`` applies from now on."""
        for _, model in old._models.values():
            model.alpha = self.calibration_alpha
        self._models.update(old._models)
        self._flights.update(old._flights)
        self._turns = old._turns
        self._kv_capacity = {**old._kv_capacity, **self._kv_capacity}
        self._held.adopt(old._held)
        self._prior_models = old._prior_models + self._prior_models

    # ------------------------------------------------------------------ reads

    @property
    def deferred_inserts(self) -> HeldBlocks:
        """The per-endpoint LRUs of the blocks sent, whose inserts the gateway may let wait
        (it sets ``defer_from_blocks`` and calls ``apply_pending`` when the loop would
        otherwise wait; every read applies them first: decisions are unchanged)."""
        return self._held

    def calibration(self) -> dict[str, Calibration]:
        """Per endpoint seen so far: learned corrections, last predicted and observed."""
        return {name: entry[1].calibration() for name, entry in self._models.items()}

    @property
    def num_inflight(self) -> int:
        return len(self._flights)


def _home(matched: dict[str, int], candidates: Sequence[EndpointState]) -> str:
    """The one candidate holding the longest cached prefix of the request, or "" (none
    cached, or two or more hold as much: no single home to stay at)."""
    if not matched:
        return ""
    best = max(matched.values())
    holders = [n for n, blocks in matched.items() if blocks == best]
    if len(holders) != 1 or best == 0:
        return ""
    (holder,) = holders
    return holder if any(s.endpoint.name == holder for s in candidates) else ""
