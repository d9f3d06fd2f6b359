"""``agent-workflows``: multi-agent workflow executions shaped after Chimera's traces.

Chimera (its Appendix A.1) runs ReAct-style workflows of one to four stages on two
datasets: APPS (programming) with planner -> coder -> qa -> coder, planner -> coder or
coder alone, and MATH (competition mathematics) with planner -> solver -> verifier ->
solver, planner -> solver or solver alone. Each session here is one workflow execution
(``session_id`` ``wf-000123`` is its program id); turn k is stage k + 1, with
:class:`~longroute.workloads.types.AgentStage` holding the text predictors read and the
per-model truth the simulator resolves after routing.

Every number is ours, not a measurement (tables in :mod:`.agent_models`):

* **Lengths.** A model's total workflow output is a lognormal body plus rare runaway
  generations (log-uniform in [cap / 2, cap], ``max_total_output_tokens``), fitted so
  that over the default mix the mean and sd are those of the paper's §4.1: APPS
  Qwen2.5-1.5B 447 / 1,276 tokens, 14B 649 / 534; MATH 1.5B 606 / 2,587, 14B 709 / 715.
  3B and 7B are not in the paper: interpolated in log(parameters) (ours). The body's log
  is a sum of factors every model shares (workflow kind, level, topic, statement detail,
  a hidden task factor) and the model's own noise, so the same task is long-ish on every
  model and the text predicts part of the length (Chimera's QRF: Kendall-tau distance
  0.12-0.27, its Table 3). A workflow's total is split over its stages by role shares
  (planner short, coder/solver long, qa/verifier medium), jittered per task and model.
* **Correctness.** A per-task latent difficulty (level, topic offset, hidden noise) and a
  per-(model, dataset) skill; the workflow is right on model m when a uniform, correlated
  across models, falls below ``sigmoid(skill_m - difficulty)`` and m did not run away.
  Skills are fitted to task scores of APPS 1.5B 17%, 3B 24%, 7B 30%, 14B 35% and MATH
  45%, 53%, 60%, 65% (ours, shaped after the ranges of the paper's Figure 5).
* **Text.** Role instructions (one fixed system prompt per dataset and role, whose blocks
  are the turn's ``block_hashes``: every request of a role shares them) and a generated
  statement (:mod:`.agent_tasks`) in which the level shows only partly and noisily.

Determinism: one ``numpy.random.default_rng(seed)`` draws everything in a fixed order;
per-model draws are taken for every built-in model (table order) and then selected, so
a model's truth on a task does not depend on which other models are listed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from types import MappingProxyType

import numpy as np

from longroute.types import PromptText
from longroute.workloads._knobs import check_int
from longroute.workloads._sampling import prompt_blocks
from longroute.workloads.agent_draws import WorkflowDraws, draw_outcomes
from longroute.workloads.agent_models import (
    APPS,
    LEVEL_SHARES,
    WORKFLOW_KINDS,
    WorkflowKind,
    dataset_names,
    model_params,
)
from longroute.workloads.agent_outcomes import OutcomeRow
from longroute.workloads.agent_tasks import TaskText, apps_task, math_task
from longroute.workloads.agent_text import Picker, count_tokens, system_prompt, user_prompt
from longroute.workloads.types import AgentStage, Session, Turn, Workload

NAME = "agent-workflows"
_TEXT_DRAWS = 32


def _check_weights(name: str, values: object, size: int) -> tuple[float, ...]:
    """``values`` as ``size`` non-negative finite floats with a positive sum."""
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) != size:
        raise ValueError(f"{name} must be a list of {size} weights, got {values!r}")
    weights = tuple(values)
    for value in weights:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError(f"{name} must hold numbers >= 0, got {values!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must hold finite numbers, got {values!r}")
    if sum(weights) <= 0:
        raise ValueError(f"{name} must have a positive sum, got {values!r}")
    return tuple(float(w) for w in weights)


def _check_time(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0 (seconds), got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _system_blocks(dataset: str, role: str, block_size_tokens: int) -> tuple[int, tuple[int, ...]]:
    """Tokens and block hashes of the role's system prompt (a source id fixed by its name)."""
    digest = hashlib.blake2b(f"{NAME}/{dataset}/{role}".encode(), digest_size=8).digest()
    num_tokens = count_tokens(system_prompt(dataset, role))
    blocks = prompt_blocks(block_size_tokens, [(int.from_bytes(digest, "big") >> 2, num_tokens)])
    return num_tokens, blocks.block_hashes()


def _session(
    index: int, kind: WorkflowKind, task: TaskText, level: int, draws: WorkflowDraws,
    systems: dict[tuple[str, str], tuple[int, tuple[int, ...]]], tool_time_s: float,
) -> Session:  # fmt: skip
    correct = MappingProxyType(draws.is_correct_by_model[index])
    outputs = draws.stage_outputs_by_model[index]
    turns: list[Turn] = []
    for stage, role in enumerate(kind.roles):
        num_system, hashes = systems[kind.dataset, role]
        user = user_prompt(kind, stage, task.statement)
        prompt = PromptText(system_prompt(kind.dataset, role), user)
        by_model = MappingProxyType({m: tokens[stage] for m, tokens in outputs.items()})
        agent = AgentStage(
            kind.name, kind.dataset, role, stage + 1, kind.num_stages, prompt, num_system,
            by_model, correct, level,
        )  # fmt: skip
        num_prompt = num_system + count_tokens(prompt.user)
        think_s = 0.0 if stage == 0 else tool_time_s
        turns.append(Turn(num_prompt, max(by_model.values()), hashes, think_s, None,
                          kind.dataset, None, None, agent))  # fmt: skip
    return Session(f"wf-{index:06d}", tuple(turns))


DEFAULT_STAGE_MIX = (1.0, 1.0, 1.0)
"""Weights of the 1-, 2- and 4-stage workflows: uniform (the length targets hold for it)."""
DEFAULT_MAX_TOTAL_OUTPUT_TOKENS = 28_672
"""Cap of a workflow's total output on any model (see :func:`agent_workflows`)."""


def draw_tasks(
    rng: np.random.Generator, size: int, datasets: Sequence[str], stage_mix: Sequence[float]
) -> tuple[list[WorkflowKind], list[int], list[TaskText]]:
    """Per workflow: its kind, difficulty level and statement (the draws before the
    outcomes; ``scripts/fit_agent_models.py`` re-draws the outcomes on them)."""
    which_dataset = (rng.random(size) * len(datasets)).astype(int).tolist()
    kind_cdf = np.cumsum(stage_mix) / sum(stage_mix)
    which_kind = np.searchsorted(kind_cdf, rng.random(size), side="right").tolist()
    level_u = rng.random(size).tolist()
    text_u = rng.random((size, _TEXT_DRAWS)).tolist()
    level_cdfs = {d: np.cumsum(LEVEL_SHARES[d]) / sum(LEVEL_SHARES[d]) for d in datasets}

    kinds: list[WorkflowKind] = []
    levels: list[int] = []
    tasks: list[TaskText] = []
    for i in range(size):
        dataset = datasets[which_dataset[i]]
        kinds.append(WORKFLOW_KINDS[dataset][min(which_kind[i], 2)])
        level = min(int(np.searchsorted(level_cdfs[dataset], level_u[i], side="right")), 4) + 1
        levels.append(level)
        tasks.append((apps_task if dataset == APPS else math_task)(Picker(text_u[i]), level))
    return kinds, levels, tasks


def agent_workflows(
    *,
    num_workflows: int,
    seed: int,
    models: Sequence[str] = ("qwen2.5-1.5b", "qwen2.5-7b"),
    datasets: Sequence[str] = ("apps", "math"),
    block_size_tokens: int = 16,
    stage_mix: Sequence[float] = DEFAULT_STAGE_MIX,
    max_total_output_tokens: int = DEFAULT_MAX_TOTAL_OUTPUT_TOKENS,
    tool_time_s: float = 0.0,
) -> Workload:
    """``num_workflows`` workflow executions; each dataset equally likely, then the 1-,
    2- and 4-stage workflow with weights ``stage_mix``.

    ``models``: the models whose truth (outputs, correctness) every stage carries; each
    needs built-in parameters (:data:`.agent_models.MODELS`). ``max_total_output_tokens``
    caps a workflow's total output on any model (runaways reach it): a stage's prompt,
    history and output add up to at most its base prompt (under 500 tokens) plus the cap,
    so the default keeps every stage within a 32,768-token context.
    ``tool_time_s`` is the pause before each later stage (tool calls, parsing).
    """
    size = check_int("num_workflows", num_workflows, 1)
    rng = np.random.default_rng(check_int("seed", seed, 0))
    params = model_params(models)
    names = dataset_names(datasets)
    block = check_int("block_size_tokens", block_size_tokens, 1)
    mix = _check_weights("stage_mix", stage_mix, 3)
    cap = check_int("max_total_output_tokens", max_total_output_tokens, 64)
    tool_s = _check_time("tool_time_s", tool_time_s)

    kinds, levels, tasks = draw_tasks(rng, size, names, mix)
    draws = draw_outcomes(rng, kinds, levels, tasks, params, cap)
    systems = {
        (kind.dataset, role): _system_blocks(kind.dataset, role, block)
        for dataset in names for kind in WORKFLOW_KINDS[dataset] for role in kind.roles
    }  # fmt: skip
    sessions = tuple(
        _session(i, kinds[i], tasks[i], levels[i], draws, systems, tool_s) for i in range(size)
    )
    return Workload(NAME, sessions, block)


def agent_outcomes(workload: Workload) -> list[OutcomeRow]:
    """The offline measurement of ``workload``: every workflow run whole on every model.

    For each session (in order), each model its stages name (in their order) and each
    stage, one :class:`OutcomeRow`: the stage's prompt as that model would see it (the
    stage's own tokens plus that model's earlier outputs), its output, the remaining
    output from this stage on and the workflow's truth on that model. O(stages x models).
    Raises ``ValueError`` naming a session whose turns are not agent stages.
    """
    rows: list[OutcomeRow] = []
    for session in workload.sessions:
        stages = [turn.agent for turn in session.turns]
        if not stages or any(stage is None for stage in stages):
            raise ValueError(f"session {session.session_id!r} is not an agent workflow")
        agents = [stage for stage in stages if stage is not None]
        for model in agents[0].output_tokens_by_model:
            outputs = [agent.output_tokens_by_model[model] for agent in agents]
            remaining, history = sum(outputs), 0
            for turn, agent, output in zip(session.turns, agents, outputs, strict=True):
                rows.append(OutcomeRow(
                    session.session_id, agent.workflow, agent.dataset, agent.stage,
                    agent.num_stages, model, agent.prompt.system, agent.prompt.user,
                    turn.num_prompt_tokens + history, output, remaining,
                    agent.is_correct_by_model[model], agent.difficulty,
                ))  # fmt: skip
                history += output
                remaining -= output
    return rows
