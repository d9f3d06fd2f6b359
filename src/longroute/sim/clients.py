"""Clients: when each session's first turn is issued.

* Open loop: sessions start by an arrival process (Poisson, gamma with a
  coefficient of variation, or the trace's own timestamps), whatever the
  fleet's state; later turns follow their predecessor's answer plus think time.
* Closed loop: ``num_users`` users each run sessions back to back, so at most
  ``num_users`` requests are in flight.

Retrying clients (only with a :class:`CorrectnessSpec`): a wrong answer is
retried at once, up to R attempts per query, with the tried models and
endpoints in the request (as the gateway's ``x-longroute-tried`` header does).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from longroute.sim.correctness import CorrectnessOracle
from longroute.types import Language, Request
from longroute.workloads.types import Session, Workload

ARRIVALS = ("poisson", "gamma", "trace")


@dataclass(frozen=True, slots=True)
class ClientSpec:
    kind: Literal["open", "closed"] = "open"
    arrival: Literal["poisson", "gamma", "trace"] = "poisson"
    rate_per_s: float | None = None
    cv: float = 1.0
    num_users: int | None = None
    think_time_s: float = 0.0
    time_scale: float = 1.0
    duration_s: float | None = None  # no session starts at or after this (started ones finish)

    def __post_init__(self) -> None:
        if self.kind not in ("open", "closed"):
            raise ValueError(f"client kind must be 'open' or 'closed', got {self.kind!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.kind == "closed" and (self.num_users is None or self.num_users < 1):
            raise ValueError("closed-loop clients need num_users >= 1")
        if self.kind == "open" and self.arrival != "trace" and not (self.rate_per_s or 0) > 0:
            raise ValueError(f"open-loop {self.arrival} arrivals need rate_per_s > 0")
        # written so that NaN fails every comparison and is rejected
        if not (self.cv > 0 and self.time_scale > 0 and self.think_time_s >= 0):
            raise ValueError("need cv > 0, time_scale > 0 and think_time_s >= 0")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")

    def is_open_at(self, t_s: float) -> bool:
        """True if a session may start at ``t_s`` (before ``duration_s``)."""
        return self.duration_s is None or t_s < self.duration_s


def open_loop_starts(
    spec: ClientSpec, workload: Workload, rng: random.Random
) -> list[tuple[float, Session]]:
    """Start time of every session under an open-loop client, sorted by time."""
    sessions = workload.sessions
    if spec.arrival == "trace":
        if not workload.is_timed:
            raise ValueError(
                f"workload {workload.name!r} has no timestamps; use poisson or gamma arrivals"
            )
        starts = [((s.start_s or 0.0) * spec.time_scale, s) for s in sessions]
        starts.sort(key=lambda item: item[0])  # stable: ties keep file order
        return [item for item in starts if spec.is_open_at(item[0])]
    assert spec.rate_per_s is not None
    rate = spec.rate_per_s
    t = 0.0
    out: list[tuple[float, Session]] = []
    shape = 1.0 / (spec.cv * spec.cv)
    for s in sessions:
        if not spec.is_open_at(t):
            break
        out.append((t, s))
        if spec.arrival == "poisson":
            t += rng.expovariate(rate)
        else:
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
    return out


@dataclass(frozen=True, slots=True)
class CorrectnessSpec:
    """Answer checking and retries: ``oracle`` judges answers, ``max_attempts`` is R."""

    oracle: CorrectnessOracle
    max_attempts: int = 10

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")


def query_id_of(session_id: str, turn_index: int) -> str:
    """The id of the user question a turn asks; every attempt at it shares the id."""
    return f"{session_id}:{turn_index}"


def query_languages(workload: Workload) -> dict[str, Language | None]:
    """Each turn's query id -> its prompt language, for the TTCA per-setting table. O(turns)."""
    return {
        query_id_of(session.session_id, index): turn.language
        for session in workload.sessions
        for index, turn in enumerate(session.turns)
    }


def check_answer(
    oracle: CorrectnessOracle, session: Session, turn_index: int, model: str, attempt: int
) -> tuple[str, bool | None]:
    """The turn's query id and whether ``model``'s answer to it is correct.

    Called by the simulator when an answer reaches its client, only when the
    run has a :class:`CorrectnessSpec`. ``None``: the turn has no task or no
    language, so there is nothing to check. O(1).
    """
    turn = session.turns[turn_index]
    query_id = query_id_of(session.session_id, turn_index)
    if turn.task is None or turn.language is None:
        return query_id, None
    is_correct = oracle.is_correct(
        query_id,
        model,
        task=turn.task,
        language=turn.language,
        num_prompt_tokens=turn.num_prompt_tokens,
        attempt=attempt,
    )
    return query_id, is_correct


def retry_request(old: Request, query_id: str, endpoint: str, model: str, now_s: float) -> Request:
    """The next attempt at ``old``'s question, issued at ``now_s`` after a wrong answer.

    Same prompt (block hashes included, so a retry on the same engine hits its
    prefix cache), expected and maximum output, session and SLO; ``attempt`` + 1;
    the endpoint and model that answered wrongly appended to ``tried_endpoints`` /
    ``tried_models``;
    request id ``"<query id>#<attempt>"``.
    """
    attempt = old.attempt + 1
    return Request(
        request_id=f"{query_id}#{attempt}",
        arrival_s=now_s,
        num_prompt_tokens=old.num_prompt_tokens,
        num_output_tokens=old.num_output_tokens,
        block_hashes=old.block_hashes,
        block_size_tokens=old.block_size_tokens,
        max_output_tokens=old.max_output_tokens,
        model=old.model,
        language=old.language,
        task=old.task,
        session_id=old.session_id,
        program_id=old.program_id,
        stage=old.stage,
        slo=old.slo,
        attempt=attempt,
        tried_endpoints=(*old.tried_endpoints, endpoint),
        tried_models=(*old.tried_models, model),
    )
