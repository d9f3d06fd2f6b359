"""Per-request records, shared by the simulator and the load generator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from longroute.fast_init import fast_init
from longroute.types import SLO, Request


@fast_init
@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request attempt, all times in seconds.

    ``arrival_s`` is when the client issued it, ``dispatch_s`` when the router
    sent it, ``first_token_s`` / ``finish_s`` when the first / last token
    reached the client (network delay included). ``query_id`` names the user
    question an attempt belongs to (retries of one question share it; ``None``
    means the request is its own query); ``is_correct`` is the checked answer,
    ``None`` where correctness is not modelled. Agent workflows: ``program_id``
    and ``stage`` name the workflow and the step (only the final stage is
    judged); ``queue_s`` is the time the request waited in the engine's queue
    before its first chunk was scheduled (simulator only; ``None`` elsewhere).
    """

    request_id: str
    session_id: str | None
    router: str
    endpoint: str
    model: str
    region: str | None  # None when the client cannot know it (load generator)
    arrival_s: float
    dispatch_s: float
    first_token_s: float
    finish_s: float
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    attempt: int = 1
    num_preemptions: int = 0
    slo: SLO | None = None
    query_id: str | None = None
    is_correct: bool | None = None
    program_id: str | None = None
    stage: int | None = None
    queue_s: float | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None for one-token outputs."""
        if self.num_output_tokens <= 1:
            return None
        return (self.finish_s - self.first_token_s) / (self.num_output_tokens - 1)

    def meets_slo(self) -> bool | None:
        """True if every objective set in ``slo`` is met; None if there is no SLO."""
        if self.slo is None:
            return None
        ok = True
        if self.slo.ttft_s is not None:
            ok = ok and self.ttft_s <= self.slo.ttft_s
        if self.slo.e2e_s is not None:
            ok = ok and self.e2e_s <= self.slo.e2e_s
        tpot = self.tpot_s
        if self.slo.tpot_s is not None and tpot is not None:
            ok = ok and tpot <= self.slo.tpot_s
        return ok


class RunObserver(Protocol):
    """Watches a run's requests (e.g. the online weight tuner).

    ``on_dispatch`` is called right after the router's ``on_dispatch`` for
    every attempt sent; ``on_record`` once per finished attempt, with its
    record. Both must be cheap: they run on the simulator's hot path.
    """

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None: ...

    def on_record(self, record: RequestRecord) -> None: ...
