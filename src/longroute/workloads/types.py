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

from dataclasses import dataclass

from longroute.types import SLO, Language


@dataclass(frozen=True, slots=True)
class Turn:
    num_prompt_tokens: int
    num_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    think_time_s: float = 0.0
    language: Language | None = None
    task: str | None = None
    model: str | None = None
    slo: SLO | None = None


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
