"""What a workload is: sessions of turns, before any client or router acts.

A *session* is a conversation (or a single request, for traces). Its turns
run one after another: turn k+1 is issued ``think_time_s`` after turn k's
answer arrives. A session with ``start_s`` set starts at that time (trace
replay); otherwise the client's arrival process decides. Trace requests that
continue one conversation stay sessions of their own (each at its own
timestamp) and share a ``conversation_id`` (see
:mod:`longroute.workloads.conversations`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from longroute.types import SLO, Language, PromptText


@dataclass(frozen=True, slots=True)
class AgentStage:
    """One stage of an agent workflow (Chimera's ``r = (p, i, x_r, meta)``), with its truth.

    The session is the workflow execution (its id is the ``program_id``); turn k is stage
    ``stage`` = k + 1 of ``num_stages``. What depends on the model that serves a stage is
    given per model and resolved by the simulator after routing:

    * ``output_tokens_by_model[m]``: this stage's output length if ``m`` serves it;
    * ``is_correct_by_model[m]``: whether the workflow's final answer is right when ``m``
      produces it (the same on every stage of a workflow; the simulator judges the
      final stage's model, Chimera's S_p "score of the final output").

    The turn's ``num_prompt_tokens`` counts the role's system prompt and the user part
    before any history; the simulator adds the outputs of the earlier stages (what the
    stage reads as context) when it issues the stage. ``num_system_tokens`` is the
    system prompt's share. ``difficulty`` (1 = easiest) is for reports, not routing.
    """

    workflow: str
    dataset: str
    role: str
    stage: int
    num_stages: int
    prompt: PromptText
    num_system_tokens: int
    output_tokens_by_model: Mapping[str, int]
    is_correct_by_model: Mapping[str, bool]
    difficulty: int

    def __post_init__(self) -> None:
        if not 1 <= self.stage <= self.num_stages:
            raise ValueError(f"stage must be in [1, {self.num_stages}], got {self.stage}")
        if set(self.output_tokens_by_model) != set(self.is_correct_by_model):
            raise ValueError("output_tokens_by_model and is_correct_by_model name other models")
        if any(n < 1 for n in self.output_tokens_by_model.values()):
            raise ValueError("every output length must be >= 1 token")

    @property
    def is_final(self) -> bool:
        return self.stage == self.num_stages


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session. ``num_output_tokens`` is the answer's true length (the
    simulator's engine model reads it; routers never do, ``sim.lengths``);
    ``max_output_tokens`` is the client's ``max_tokens``, when the workload gives one."""

    num_prompt_tokens: int
    num_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    think_time_s: float = 0.0
    language: Language | None = None
    task: str | None = None
    model: str | None = None
    slo: SLO | None = None
    agent: AgentStage | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """Turns run one after another; ``conversation_id`` names the conversation when it is
    not this session alone (several trace requests of one conversation)."""

    session_id: str
    turns: tuple[Turn, ...]
    start_s: float | None = None
    conversation_id: str | None = None

    @property
    def conversation(self) -> str:
        """``conversation_id``, else ``session_id``: the session id its requests carry, which
        session-affinity routing keys on."""
        return self.session_id if self.conversation_id is None else self.conversation_id


@dataclass(frozen=True, slots=True)
class Workload:
    """A named set of sessions; ``block_size_tokens`` is the hash-block size."""

    name: str
    sessions: tuple[Session, ...]
    block_size_tokens: int

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def is_timed(self) -> bool:
        """True when every session has a start time (a trace)."""
        return all(s.start_s is not None for s in self.sessions)
