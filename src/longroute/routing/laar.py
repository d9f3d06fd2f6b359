"""Lightweight Accuracy-Aware Routing (LAAR): the least expected time to a correct answer.

For a request x and a candidate endpoint serving model m (seed 000, §5)::

    cost = L / Q,   L = c(m) * (T(x) + alpha * R),   Q = Q(m, x)

* Q(m, x): the probability that m answers x correctly, from a capability
  model (:class:`SuccessModel`, e.g. the fitted ``CapabilityModel``) on the
  request's language, task and prompt length; floored at ``min_probability``.
* T(x): the upper edge of the request's context-length bucket, in tokens
  (``bucket_edges_tokens``, by default ``features.length``'s 4K..128K).
* R: tokens the router dispatched to that endpoint and that it still owes
  (``EndpointState.num_queued_tokens``), so load spreads across replicas.
* c(m): seconds per token of the endpoint: prefill time of
  ``reference_tokens`` tokens over ``reference_tokens`` from its model and
  hardware profiles and GPU count, or ``seconds_per_token[model]`` if given.

Retries: an endpoint whose model is in ``request.tried_models`` scores
``cost * tried_penalty + (largest untried score, or 0)``, so a tried model is
never picked while an untried one is a candidate, and tried models rank among
themselves by cost. With deterministic decoding, retrying a model that just
answered wrong fails again; the penalty makes retries explore. Once every
candidate's model was tried ``max_tries_per_model`` times (1 by default, as
the paper's "at most five attempts" with five models), the router raises
:class:`CandidatesExhaustedError` so the client stops; ``None`` keeps
re-picking tried models (for sampled decoding, where a retry is a new draw).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor
from longroute.features.length import (
    DEFAULT_BUCKET_EDGES_TOKENS,
    check_bucket_edges,
    length_bucket,
)
from longroute.routing.base import ROUTERS, BaseRouter, pick_min
from longroute.routing.fleet_view import CandidatesExhaustedError, FleetView
from longroute.types import Endpoint, Language, Request, RouteDecision

DEFAULT_REFERENCE_TOKENS = 8192
SCORE_MEANING = "expected seconds to a correct answer, L/Q (tried models penalised)"


class SuccessModel(Protocol):
    """What LAAR needs from a capability model; ``CapabilityModel`` satisfies it."""

    @property
    def models(self) -> tuple[str, ...]:
        """The models it has estimates for (named in errors)."""
        ...

    def probability(
        self, model: str, language: Language | None, num_prompt_tokens: int, task: str | None
    ) -> float | None:
        """P(correct answer) in [0, 1], or None when ``model`` is unknown; O(1)."""
        ...


@ROUTERS.register(
    "laar",
    description="LAAR: least expected time to a correct answer, latency over accuracy (L/Q)",
)
class LaarRouter(BaseRouter):
    """Picks the candidate endpoint with the least L/Q (see the module docstring).

    Called once per request attempt; O(candidates): one capability lookup per
    distinct model and a few float operations per endpoint. c(m) is computed
    the first time an endpoint is seen (profile load, one predictor) and
    cached by endpoint name for the router's life (one entry per endpoint;
    an entry is rebuilt if the name comes back with a different Endpoint).
    """

    name = "laar"
    needs_prefix_index = False
    needs_language = True
    needs_capability = True

    def __init__(
        self,
        *,
        capability: SuccessModel | str | Path,
        alpha: float = 0.7,
        tried_penalty: float = 1000.0,
        default_probability: float | None = None,
        min_probability: float = 0.01,
        seconds_per_token: Mapping[str, float] | None = None,
        reference_tokens: int = DEFAULT_REFERENCE_TOKENS,
        bucket_edges_tokens: Sequence[int] = DEFAULT_BUCKET_EDGES_TOKENS,
        max_tries_per_model: int | None = 1,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        if max_tries_per_model is not None and max_tries_per_model < 1:
            raise ValueError(f"max_tries_per_model must be >= 1 or None, got {max_tries_per_model}")
        self.max_tries_per_model = max_tries_per_model
        _check_params(alpha, tried_penalty, default_probability, min_probability, reference_tokens)
        if isinstance(capability, str | Path):
            from longroute.estimators.capability import load_capability

            capability = load_capability(capability)
        self.capability: SuccessModel = capability
        self.alpha = float(alpha)
        self.tried_penalty = float(tried_penalty)
        self.default_probability = default_probability
        self.min_probability = float(min_probability)
        self.reference_tokens = reference_tokens
        self.bucket_edges_tokens = check_bucket_edges(bucket_edges_tokens)
        self.seconds_per_token = _checked_rates(seconds_per_token or {})
        self._rates: dict[str, tuple[Endpoint, float]] = {}

    # ------------------------------------------------------------------ hot path

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        size_tokens = length_bucket(request.num_prompt_tokens, self.bucket_edges_tokens)
        alpha, rates, tried = self.alpha, self._rates, request.tried_models
        q_of: dict[str, float] = {}
        scores: dict[str, float] = {}
        tried_names: list[tuple[str, str]] = []
        max_untried = 0.0
        for state in candidates:
            endpoint = state.endpoint
            name = endpoint.name
            entry = rates.get(name)
            if entry is None or entry[0] is not endpoint:
                entry = rates[name] = (endpoint, self._seconds_per_token_of(endpoint))
            model = endpoint.model
            q = q_of.get(model)
            if q is None:
                q = q_of[model] = self._probability(model, request)
            # R: state.num_queued_tokens, inlined (no property call on the hot path)
            queued = state.num_inflight_prompt_tokens + state.num_inflight_output_tokens
            cost = entry[1] * (size_tokens + alpha * queued) / q
            scores[name] = cost
            if tried and model in tried:
                tried_names.append((name, model))
            elif cost > max_untried:
                max_untried = cost
        if tried_names:
            if len(tried_names) == len(scores):
                self._check_not_exhausted(request, q_of)
            self._penalise(scores, tried_names, max_untried, tried)
        chosen = pick_min(scores)
        return self._decision(chosen, scores, fleet, request, size_tokens, q_of)

    def _probability(self, model: str, request: Request) -> float:
        """Q(m, x) floored at ``min_probability``; unknown models per ``default_probability``."""
        return success_probability(
            self.capability,
            model,
            request,
            self.default_probability,
            self.min_probability,
            router=self.name,
        )

    def _check_not_exhausted(self, request: Request, q_of: dict[str, float]) -> None:
        """Raise if every candidate model was tried ``max_tries_per_model`` times."""
        limit = self.max_tries_per_model
        if limit is None:
            return
        tried = request.tried_models
        if all(tried.count(model) >= limit for model in q_of):
            raise CandidatesExhaustedError(
                f"laar: every candidate model already answered request {request.request_id!r} "
                f"wrongly (tried: {', '.join(tried)}); with deterministic decoding a retry "
                "would repeat an answer"
            )

    def _penalise(
        self,
        scores: dict[str, float],
        tried_names: list[tuple[str, str]],
        floor: float,
        tried: Sequence[str],
    ) -> None:
        penalise_tried(scores, tried_names, floor, tried, self.tried_penalty)

    def _decision(
        self,
        chosen: str,
        scores: dict[str, float],
        fleet: FleetView,
        request: Request,
        size_tokens: int,
        q_of: dict[str, float],
    ) -> RouteDecision:
        state = fleet.state(chosen)
        model = state.endpoint.model
        q = q_of[model]
        c = self._rates[chosen][1]
        latency_s = c * (size_tokens + self.alpha * state.num_queued_tokens)
        retry = " (every candidate model already tried)" if model in request.tried_models else ""
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=SCORE_MEANING,
            reason=(
                f"least L/Q on {model}: Q={q:.3f}, L={latency_s:.3f} s "
                f"(c={c * 1e6:.2f} us/token, T={size_tokens}, R={state.num_queued_tokens}){retry}"
            ),
        )

    # ----------------------------------------------------------------- c(m) setup

    def _seconds_per_token_of(self, endpoint: Endpoint) -> float:
        """c(m) of one endpoint; called once per endpoint (then cached)."""
        rate = self.seconds_per_token.get(endpoint.model)
        if rate is not None:
            return rate
        try:
            predictor = RuntimePredictor(
                load_model_profile(endpoint.model),
                load_hardware_profile(endpoint.hardware),
                endpoint.num_gpus,
            )
        except ValueError as exc:
            raise ValueError(
                f"laar: cannot derive seconds per token for endpoint {endpoint.name!r} "
                f"({endpoint.model} on {endpoint.num_gpus} x {endpoint.hardware}): {exc}; "
                f"give seconds_per_token[{endpoint.model!r}]"
            ) from exc
        return predictor.prefill_time_s(self.reference_tokens) / self.reference_tokens


def _check_params(
    alpha: float,
    tried_penalty: float,
    default_probability: float | None,
    min_probability: float,
    reference_tokens: int,
) -> None:
    """Reject out-of-range parameters (NaN included), naming the bad value."""
    if not (alpha >= 0.0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    if not (tried_penalty >= 1.0 and math.isfinite(tried_penalty)):
        raise ValueError(f"tried_penalty must be a finite number >= 1, got {tried_penalty}")
    if not 0.0 < min_probability <= 1.0:
        raise ValueError(f"min_probability must be in (0, 1], got {min_probability}")
    if default_probability is not None and not 0.0 < default_probability <= 1.0:
        raise ValueError(
            f"default_probability must be in (0, 1] or None, got {default_probability}"
        )
    if isinstance(reference_tokens, bool) or not (
        isinstance(reference_tokens, int) and reference_tokens >= 1
    ):
        raise ValueError(f"reference_tokens must be an integer >= 1, got {reference_tokens!r}")


def _checked_rates(rates: Mapping[str, float]) -> dict[str, float]:
    """``seconds_per_token`` as floats; every value must be finite and positive."""
    checked: dict[str, float] = {}
    for model, rate in rates.items():
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise ValueError(f"seconds_per_token[{model!r}] must be a number, got {rate!r}")
        if not (rate > 0.0 and math.isfinite(rate)):
            raise ValueError(f"seconds_per_token[{model!r}] must be > 0 and finite, got {rate}")
        checked[str(model)] = float(rate)
    return checked


def success_probability(
    capability: SuccessModel,
    model: str,
    request: Request,
    default_probability: float | None,
    min_probability: float,
    *,
    router: str,
) -> float:
    """Q(m, x) floored at ``min_probability``; a model the capability model does not know
    gets ``default_probability``, or an error naming it and the known models."""
    q = capability.probability(model, request.language, request.num_prompt_tokens, request.task)
    if q is None:
        if default_probability is None:
            raise ValueError(
                f"{router}: the capability model knows nothing of model {model!r} "
                f"(it knows: {', '.join(capability.models) or 'none'}); fit it on "
                f"outcomes of {model!r} or set default_probability"
            )
        q = default_probability
    return q if q >= min_probability else min_probability


def penalise_tried(
    scores: dict[str, float],
    tried_names: Sequence[tuple[str, str]],
    floor: float,
    tried: Sequence[str],
    penalty: float,
) -> None:
    """Move tried endpoints ``(name, model)`` above every untried one (``floor``: the
    largest untried score), keeping their order by score.

    Each earlier wrong answer of the model multiplies the penalty again, so a model
    tried twice ranks after one tried once unless far cheaper.
    """
    for name, model in tried_names:
        score = scores[name] * penalty ** tried.count(model) + floor
        # a cost far below the floor's precision would tie with it: step past it
        scores[name] = score if score > floor else math.nextafter(floor, math.inf)
