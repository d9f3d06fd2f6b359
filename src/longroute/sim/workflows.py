"""Agent workflows in the simulator: stage requests, resolution after routing, judging.

A session whose turns carry :class:`AgentStage` is one workflow execution; its
session id is the ``program_id``. What a stage looks like depends on where the
earlier stages ran, and what it produces on the model that serves it, so:

* :meth:`WorkflowTracker.request` builds stage i's request when the client
  issues it: the prompt is the stage's base (role system prompt + user part)
  plus every earlier stage's actual output (the history it reads);
  ``num_output_tokens`` is what the caller passes: the expected length
  (``sim.lengths``), or under the ``oracle_lengths`` ablation the turn's
  placeholder, the largest any model would produce, since the model is not
  known yet;
* :func:`resolve` runs after routing: the router's priority is written in (or,
  for a router marked ``priority_oracle``, the true remaining output of the
  workflow on that model: this stage and every later one), and under the
  ``oracle_lengths`` ablation the output length becomes the chosen model's;
* :func:`true_output_tokens` is the stage's true length on the chosen model,
  which only the engine model reads;
* :func:`judge` says whether the final stage's answer is right (the workflow's
  truth for the model that produced it); earlier stages are not judged.

O(1) per stage except the oracle's O(stages).
"""

from __future__ import annotations

from dataclasses import replace

from longroute.types import SLO, Request
from longroute.workloads.types import AgentStage, Session


class WorkflowTracker:
    """Output tokens of each running workflow's finished stages (its history).

    One entry per workflow between its first stage's issue and its final
    stage's end (or its abandonment, which :meth:`forget` handles).
    """

    __slots__ = ("_history",)

    def __init__(self) -> None:
        self._history: dict[str, int] = {}

    def request(
        self,
        session: Session,
        turn_index: int,
        now_s: float,
        block_size_tokens: int,
        default_slo: SLO | None,
        num_output_tokens: int,
    ) -> Request:
        """Stage ``turn_index`` of ``session`` as issued at ``now_s``, expecting
        ``num_output_tokens`` (module docstring)."""
        turn = session.turns[turn_index]
        agent = turn.agent
        assert agent is not None, "only for turns of an agent workflow"
        history = self._history.get(session.session_id, 0) if turn_index else 0
        return Request(
            request_id=f"{session.session_id}:{turn_index}",
            arrival_s=now_s,
            num_prompt_tokens=turn.num_prompt_tokens + history,
            num_output_tokens=num_output_tokens,
            block_hashes=turn.block_hashes,
            block_size_tokens=block_size_tokens,
            task=turn.task,
            session_id=session.conversation,
            program_id=session.session_id,
            stage=agent.stage,
            workflow=agent.workflow,
            prompt=agent.prompt,
            slo=turn.slo or default_slo,
        )

    def finish(self, session: Session, turn_index: int, num_output_tokens: int) -> None:
        """A stage's answer arrived: the next stage reads it; the last one ends the entry."""
        key = session.session_id
        if turn_index + 1 >= len(session.turns):
            self._history.pop(key, None)
        else:
            self._history[key] = self._history.get(key, 0) + num_output_tokens

    def forget(self, session: Session) -> None:
        """The workflow ended early (its request was rejected)."""
        self._history.pop(session.session_id, None)

    def __len__(self) -> int:
        return len(self._history)


def _output_tokens(agent: AgentStage, model: str, program_id: str) -> int:
    try:
        return agent.output_tokens_by_model[model]
    except KeyError:
        known = ", ".join(sorted(agent.output_tokens_by_model))
        raise ValueError(
            f"workflow {program_id!r} stage {agent.stage} was routed to model {model!r}, but "
            f"the workload has outputs only for {known}: generate it with the fleet's models"
        ) from None


def true_remaining_tokens(session: Session, turn_index: int, model: str) -> int:
    """This stage's and every later stage's output on ``model``: the oracle's ŷ."""
    total = 0
    for turn in session.turns[turn_index:]:
        assert turn.agent is not None
        total += _output_tokens(turn.agent, model, session.session_id)
    return total


def true_output_tokens(session: Session, turn_index: int, model: str) -> int:
    """The turn's true output length when ``model`` serves it (the engine's to read)."""
    turn = session.turns[turn_index]
    if turn.agent is None:
        return turn.num_output_tokens
    return _output_tokens(turn.agent, model, session.session_id)


def resolve(
    request: Request,
    session: Session,
    turn_index: int,
    model: str,
    priority: float | None,
    oracle: str | None,
    *,
    is_oracle_lengths: bool,
) -> Request:
    """``request`` as dispatched to ``model``: its priority and, only under the
    ``oracle_lengths`` ablation, an agent stage's true output length.

    ``oracle`` is the router's ``priority_oracle`` ("workflow", "stage") or None: such a
    router's priority is the truth (this stage's, or the workflow's remaining) either way.
    """
    if oracle not in (None, "workflow", "stage"):
        raise ValueError(f"priority_oracle must be 'workflow' or 'stage', got {oracle!r}")
    agent = session.turns[turn_index].agent
    if oracle == "workflow" and agent is not None:
        priority = float(true_remaining_tokens(session, turn_index, model))
    elif oracle is not None:
        priority = float(true_output_tokens(session, turn_index, model))
    if agent is not None and is_oracle_lengths:
        num_output = _output_tokens(agent, model, session.session_id)
        return replace(request, num_output_tokens=num_output, priority=priority)
    return request if priority is None else replace(request, priority=priority)


def judge(session: Session, turn_index: int, model: str) -> bool | None:
    """The workflow's correctness if this is its final stage, else None."""
    agent = session.turns[turn_index].agent
    if agent is None or not agent.is_final:
        return None
    return agent.is_correct_by_model.get(model)
