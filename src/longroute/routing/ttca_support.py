"""The ttca router's pieces that are not the decision: an attempt in flight, SLO-mode
ranking, parameter checks and the prior of an endpoint without profiles
(:mod:`longroute.routing.ttca`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from longroute.estimators.measured_engine import is_measured_engine_ref
from longroute.estimators.parallel import endpoint_predictor
from longroute.estimators.profiles import (
    hardware_profile_names,
    model_profile_names,
)
from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.service_time import EndpointTimeModel, Prediction
from longroute.estimators.session_turns import SessionTurns
from longroute.prefix.router_index import RouterPrefixIndex
from longroute.types import Endpoint

PRIOR_MODEL = "llama-3-8b"
PRIOR_HARDWARE = "a100-80g"
"""What an endpoint whose ``model`` or ``hardware`` names no bundled profile is first timed
as (a common 8B model on a common GPU, one of it): the router's self-calibration then
learns that endpoint's own TTFT and TPOT scale from its answers (docs/ttca.md)."""


def endpoint_time_predictor(endpoint: Endpoint) -> tuple[RuntimePredictor, str | None]:
    """``endpoint``'s runtime predictor and None; or, where its model or hardware names no
    bundled profile (the gateway's default hardware ``generic``, a served model name such
    as ``meta-llama/Llama-3-8B``), the prior's predictor (:data:`PRIOR_MODEL` on
    :data:`PRIOR_HARDWARE` where the name is unknown, the endpoint's own profile where it
    is known) and a note saying so. Raises ``ValueError`` for what no prior fixes: a
    measured-engine file that does not load, or a layout its known model cannot split into."""
    try:
        return endpoint_predictor(endpoint), None
    except ValueError:
        is_model_known = endpoint.model in model_profile_names()
        is_hardware_known = endpoint.hardware in hardware_profile_names()
        # a file that does not load, or known profiles in a layout the model cannot split
        # into: a configuration error that no prior fixes
        if is_measured_engine_ref(endpoint.hardware) or (is_model_known and is_hardware_known):
            raise
    prior = replace(
        endpoint,
        model=endpoint.model if is_model_known else PRIOR_MODEL,
        hardware=endpoint.hardware if is_hardware_known else PRIOR_HARDWARE,
        num_gpus=1,
        spp_degree=1,
        kvp_degree=1,
    )
    unknown = [
        f"{kind} {name!r}"
        for kind, name, known in (
            ("model", endpoint.model, is_model_known),
            ("hardware", endpoint.hardware, is_hardware_known),
        )
        if not known
    ]
    note = (
        f"endpoint {endpoint.name!r}: no profile for its {' or '.join(unknown)}; timed as "
        f"{prior.model} on {prior.num_gpus} x {prior.hardware} until its answers calibrate it "
        f"(known hardware: {', '.join(hardware_profile_names())})"
    )
    return endpoint_predictor(prior), note


class Flight:
    """One dispatched attempt: what it owes its endpoint's counters and was predicted."""

    __slots__ = (
        "cached",
        "dispatch_s",
        "first_token_s",
        "is_probe",
        "kv_tokens",
        "model",
        "prediction",
        "remaining",
        "rtt_s",
        "uncached",
    )

    def __init__(
        self,
        model: EndpointTimeModel,
        uncached: int,
        cached: int,
        kv_tokens: float,
        prediction: Prediction,
        rtt_s: float,
        dispatch_s: float,
        is_probe: bool,
    ) -> None:
        self.model = model
        self.is_probe = is_probe
        self.uncached = uncached
        self.cached = cached
        self.kv_tokens = kv_tokens
        self.remaining = kv_tokens - uncached - cached  # half the expected output
        self.prediction = prediction
        self.rtt_s = rtt_s
        self.dispatch_s = dispatch_s
        self.first_token_s: float | None = None

    def release(self, now_s: float | None = None) -> None:
        """Take this attempt's work off its endpoint's counters (at ``now_s``)."""
        if self.first_token_s is None:
            self.model.end_pending(self.uncached, self.cached, self.dispatch_s, now_s)
        else:
            self.model.end_decoding(self.kv_tokens, self.remaining)


def prefer_meeting(scores: dict[str, float], ttft_s: dict[str, float], deadline_s: float) -> None:
    """SLO mode: endpoints predicted to miss the TTFT deadline rank after those that meet it."""
    meeting = [s for n, s in scores.items() if ttft_s[n] <= deadline_s]
    if not meeting or len(meeting) == len(scores):
        return
    floor = max(meeting)
    for name, score in scores.items():
        if ttft_s[name] > deadline_s:
            scores[name] = score + floor


def check_params(
    *,
    default_probability: float | None,
    min_probability: float,
    tried_penalty: float,
    max_tries_per_model: int | None,
    calibration_alpha: float,
    weights: dict[str, float],
    retry_pricing: str,
    retry_pricings: tuple[str, ...],
    flags: dict[str, object],
) -> None:
    """Reject out-of-range parameters (NaN included), naming the bad value. ``weights``
    must be finite and >= 0; ``flags`` booleans (a quoted "false" in YAML is truthy)."""
    if not 0.0 < min_probability <= 1.0:
        raise ValueError(f"min_probability must be in (0, 1], got {min_probability}")
    if default_probability is not None and not 0.0 < default_probability <= 1.0:
        raise ValueError(
            f"default_probability must be in (0, 1] or None, got {default_probability}"
        )
    if not (tried_penalty >= 1.0 and math.isfinite(tried_penalty)):
        raise ValueError(f"tried_penalty must be a finite number >= 1, got {tried_penalty}")
    if max_tries_per_model is not None and max_tries_per_model < 1:
        raise ValueError(f"max_tries_per_model must be >= 1 or None, got {max_tries_per_model}")
    if not 0.0 <= calibration_alpha <= 1.0:
        raise ValueError(f"calibration_alpha must be in [0, 1], got {calibration_alpha}")
    for name, value in weights.items():
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if retry_pricing not in retry_pricings:
        raise ValueError(
            f"ttca: unknown retry_pricing {retry_pricing!r}; valid: {', '.join(retry_pricings)}"
        )
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be true or false, got {flag!r}")


def kv_capacity_tokens(predictor: RuntimePredictor, endpoint: Endpoint) -> int:
    """Tokens of KV cache ``endpoint`` holds by its (or its prior's) profile; 0 where the
    profile cannot say (then the move price takes its cache as full)."""
    try:
        return predictor.kv_capacity_tokens(endpoint.gpu_memory_utilization)
    except ValueError:
        return 0


def evicted_share(held_tokens: int, duplicate_tokens: int, capacity_tokens: int) -> float:
    """The share of ``duplicate_tokens`` of new KV that evicts other prefixes at an endpoint
    holding ``held_tokens`` of ``capacity_tokens`` (the prefix index's holdings; they
    include what runs there): 0 while it fits, 1 once the cache is full."""
    over = held_tokens + duplicate_tokens - capacity_tokens
    if over <= 0:
        return 0.0
    return 1.0 if over >= duplicate_tokens else over / duplicate_tokens


def reuse_share(turns: SessionTurns) -> float:
    """The share of cached conversation turns that another turn follows: R(1) / (1 + R(1)),
    R(1) the expected turns after a first (mean turns - 1). It prices an evicted prefix as
    one that comes back at that rate; evictions take the least recently used prefixes,
    which come back less often, so it errs towards staying."""
    after_first = turns.expected_remaining(1)
    return after_first / (1.0 + after_first)


MAX_PENDING_HELD_INSERTS = 64
"""Waiting LRU inserts beyond which :class:`HeldBlocks` applies them at once."""


class HeldBlocks:
    """Per endpoint, a bounded LRU of the prompts' blocks last sent there (its KV memory's
    worth: past it the engine has evicted the oldest prefixes), and the inserts still
    waiting to reach it.

    An insert costs about 1 to 2 us a block (and as much again for the blocks it evicts):
    7 to 20 ms for a 500 KB prompt. The simulator inserts at dispatch. The gateway
    (:attr:`defer_from_blocks`) lets a prompt of at least that many blocks wait, as its
    fleet prefix index does (``gateway/granting_fleet.py``), for the first of a read
    (:meth:`cut` and :meth:`adopt` apply every waiting insert first, in dispatch order,
    each with its dispatch's time and capacity, so every decision sees the LRUs it would
    see with inserts at dispatch), :data:`MAX_PENDING_HELD_INSERTS` waiting, or the
    gateway's own triggers (:meth:`apply_pending`: an answer's end, 20 ms). While one
    waits, every later insert waits behind it, so the order is kept."""

    __slots__ = ("_lrus", "_pending", "defer_from_blocks")

    def __init__(self) -> None:
        self.defer_from_blocks: int | None = None
        """Blocks from which an insert waits; None (the simulator): every insert at once."""
        self._lrus: dict[str, RouterPrefixIndex] = {}
        self._pending: list[tuple[str, Sequence[int], int, float]] = []

    @property
    def num_pending(self) -> int:
        """Inserts waiting (applies none)."""
        return len(self._pending)

    def add(self, endpoint: str, hashes: Sequence[int], capacity_blocks: int, now_s: float) -> None:
        """The prompt ``hashes`` was sent to ``endpoint``, whose KV memory holds
        ``capacity_blocks`` blocks (below 1: no LRU for it, its prefixes never cut)."""
        defer = self.defer_from_blocks
        if self._pending or (defer is not None and len(hashes) >= defer):
            self._pending.append((endpoint, hashes, capacity_blocks, now_s))
            if len(self._pending) >= MAX_PENDING_HELD_INSERTS:
                self.apply_pending()
            return
        self._insert(endpoint, hashes, capacity_blocks, now_s)

    def _insert(
        self, endpoint: str, hashes: Sequence[int], capacity_blocks: int, now_s: float
    ) -> None:
        lru = self._lrus.get(endpoint)
        if lru is None:
            if capacity_blocks < 1:
                return
            lru = self._lrus[endpoint] = RouterPrefixIndex((endpoint,), capacity_blocks)
        lru.insert(hashes, endpoint, now_s)

    def apply_pending(self) -> None:
        """Insert every waiting prompt's blocks, in dispatch order; O(their blocks)."""
        pending, self._pending = self._pending, []
        for entry in pending:
            self._insert(*entry)

    def cut(self, matched: dict[str, int], hashes: Sequence[int]) -> dict[str, int]:
        """:func:`held_matches` against these LRUs, every waiting insert applied first."""
        if self._pending:
            self.apply_pending()
        return held_matches(matched, self._lrus, hashes) if self._lrus else matched

    def adopt(self, old: HeldBlocks) -> None:
        """Take over ``old``'s LRUs (a reload); an endpoint this one already has keeps its
        own. Both apply their waiting inserts first."""
        old.apply_pending()
        self.apply_pending()
        self._lrus = {**old._lrus, **self._lrus}


def held_matches(
    matched: dict[str, int], held: Mapping[str, RouterPrefixIndex], hashes: Sequence[int]
) -> dict[str, int]:
    """The fleet's prefix ``matched`` blocks per endpoint, cut to what each endpoint's
    bounded LRU of the blocks last sent there (its KV memory's worth, ``held``) still
    holds: past its KV memory the engine has evicted the oldest prefixes. Endpoints with
    no bounded LRU keep the fleet's figure."""
    out = matched
    for name, num in matched.items():
        lru = held.get(name)
        if lru is None:
            continue
        kept = lru.match(hashes).get(name, 0)
        if kept < num:
            if out is matched:
                out = dict(matched)
            out[name] = kept
    return out
