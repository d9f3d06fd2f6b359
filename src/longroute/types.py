"""Data that crosses a boundary between policy, simulator and gateway.

Every type here is a frozen, slotted dataclass: a policy never writes into a
request; only the owner of mutable state (an engine, a fleet view) changes it,
and it does so by building new snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from longroute.fast_init import fast_init


class Language(StrEnum):
    """Script family of a prompt, as found by character classes."""

    LATIN = "latin"
    CJK = "cjk"
    JAPANESE = "japanese"
    KOREAN = "korean"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives of one request, in seconds after its arrival."""

    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None


MAX_PROMPT_TEXT_CHARS = 8192
"""Longest ``PromptText`` part kept: text-feature predictors read the start of a prompt."""


@dataclass(frozen=True, slots=True)
class PromptText:
    """The text of a prompt, for predictors that read words (Chimera's router and length
    predictor). ``system`` is the role's instructions, ``user`` the rest (task, history).

    Each part is cut to ``MAX_PROMPT_TEXT_CHARS`` characters at construction, so a hostile
    client cannot make a router featurise megabytes.
    """

    system: str = ""
    user: str = ""

    def __post_init__(self) -> None:
        for name in ("system", "user"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"PromptText.{name} must be a string, got {type(value).__name__}")
            if len(value) > MAX_PROMPT_TEXT_CHARS:
                object.__setattr__(self, name, value[:MAX_PROMPT_TEXT_CHARS])


@fast_init
@dataclass(frozen=True, slots=True)
class Request:
    """One attempt of one user request, as a router sees it.

    ``block_hashes`` are chained hashes of the prompt's full token blocks
    (``block_size_tokens`` each): equal hash at position i means an identical
    prefix of ``(i + 1) * block_size_tokens`` tokens.
    ``num_output_tokens`` is the output length a router may expect: what a gateway
    knows, never the answer's true length (the simulator gives that to its engine
    model alone, except under the ``oracle_lengths`` ablation). Both the simulator and
    the gateway set it from :class:`~longroute.estimators.output_length.OutputLengthEstimator`:
    a quantile of completed requests' lengths, at most ``max_output_tokens``.
    ``max_output_tokens`` is the client's ``max_tokens`` per answer, when it gave one.

    Agent workflows: ``program_id`` names the workflow execution, ``stage`` its
    1-based step, ``workflow`` its kind (e.g. ``"apps/planner-coder"``) and
    ``prompt`` the text predictors read. ``priority`` is the scheduling key a
    router attached at dispatch (lower is served first, as vLLM's ``priority``;
    Chimera's predicted remaining output tokens); ``None`` leaves the engine's order.
    """

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    block_size_tokens: int = 512
    max_output_tokens: int | None = None
    model: str | None = None
    language: Language | None = None
    task: str | None = None
    session_id: str | None = None
    program_id: str | None = None
    stage: int | None = None
    workflow: str | None = None
    prompt: PromptText | None = None
    priority: float | None = None
    slo: SLO | None = None
    attempt: int = 1
    tried_endpoints: tuple[str, ...] = ()
    tried_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0:
            raise ValueError(
                f"request {self.request_id!r}: num_prompt_tokens must be >= 0, "
                f"got {self.num_prompt_tokens}"
            )
        if self.num_output_tokens < 1:
            raise ValueError(
                f"request {self.request_id!r}: num_output_tokens must be >= 1, "
                f"got {self.num_output_tokens}"
            )
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError(
                f"request {self.request_id!r}: max_output_tokens must be >= 1 or None, "
                f"got {self.max_output_tokens}"
            )
        if self.attempt < 1:
            raise ValueError(f"request {self.request_id!r}: attempt must be >= 1")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A serving replica: one engine process, possibly spanning several GPUs.

    ``num_gpus`` is the tensor-parallel degree (the GPUs of one TP group, usually
    one node). Medha's stream pipeline parallelism chains ``spp_degree`` such
    groups as pipeline stages, and its KV-cache parallelism runs ``kvp_degree``
    copies of that pipeline that share long sequences' KV
    (``longroute.estimators.parallel``); ``total_gpus`` counts them all.
    """

    name: str
    model: str
    hardware: str
    region: str
    num_gpus: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size_tokens: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len_tokens: int | None = None
    spp_degree: int = 1
    kvp_degree: int = 1

    def __post_init__(self) -> None:
        for name in ("spp_degree", "kvp_degree"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"endpoint {self.name!r}: {name} must be an integer >= 1, got {value!r}"
                )

    @property
    def total_gpus(self) -> int:
        """GPUs of the replica: TP x SPP x KVP."""
        return self.num_gpus * self.spp_degree * self.kvp_degree

    def can_fit(self, request: Request) -> bool:
        """True if the prompt plus the client's ``max_tokens`` (as an engine checks it), or
        without one the expected output, fit the endpoint's context limit."""
        limit = self.max_model_len_tokens
        if limit is None:
            return True
        cap = request.max_output_tokens
        out = request.num_output_tokens if cap is None else cap
        return request.num_prompt_tokens + out <= limit


@fast_init
@dataclass(frozen=True, slots=True)
class EndpointState:
    """What a router may know about one endpoint at a decision point.

    ``num_inflight_*`` are the router's own counters (dispatched, not yet
    finished), or, with the gateway's engine load source, the engine's global
    load as its owner estimates it (see ``routing/fleet_view.py``); the
    ``engine_*`` fields come from scraping the engine and may be stale by
    ``engine_stats_age_s``; ``None`` means never scraped.
    """

    endpoint: Endpoint
    rtt_ms: float
    num_inflight_requests: int = 0
    num_inflight_prompt_tokens: int = 0
    num_inflight_output_tokens: int = 0
    is_healthy: bool = True
    engine_num_waiting: int | None = None
    engine_num_running: int | None = None
    engine_kv_usage: float | None = None
    engine_stats_age_s: float | None = None
    num_other_requests: int = 0
    """Of ``num_inflight_requests``, those other clients (other gateway replicas) sent, as
    the owner estimates them from the engine's load; 0 with the local load source. For
    routers that keep load counters of their own (gorgo) and must add the others'."""

    @property
    def num_queued_tokens(self) -> int:
        """Tokens the endpoint still has to process for our in-flight requests."""
        return self.num_inflight_prompt_tokens + self.num_inflight_output_tokens


@fast_init
@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's choice and the per-endpoint scores that explain it.

    ``scores`` maps endpoint name to the router's score, and lower is always
    better (the gateway relies on it to fall back to the next-best endpoint
    when the chosen one is full or just failed); ``score_meaning`` says what
    the number is (e.g. "queued tokens").
    """

    endpoint: str
    scores: Mapping[str, float] = field(default_factory=dict)
    score_meaning: str = ""
    reason: str = ""
    priority: float | None = None
    """Scheduling key for the chosen endpoint's queue (lower first), e.g. Chimera's
    predicted remaining workflow output tokens; the owner writes it into the request it
    dispatches. ``None``: the router has no opinion."""
    predicted_ttft_s: float | None = None
    """The router's prediction of the chosen endpoint's time to first token, network
    included (``ttca``); the gateway sends it as ``x-longroute-predicted-ttft-ms``.
    ``None``: the router makes no such prediction."""
