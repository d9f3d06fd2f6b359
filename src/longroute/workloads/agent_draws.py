"""Per-(task, model) truth of ``agent-workflows``: stage output lengths and correctness.

Called once per workload by :mod:`longroute.workloads.agent_workflows`, after the task
texts. All draws are vectorised (numpy arrays over workflows) and taken in a fixed
order, for every built-in model of :data:`.agent_models.MODELS` in table order, then
the requested models are picked out: a model's truth does not depend on the others
listed. Every constant here is ours (see the module docstring of ``agent_workflows``).

Latent per task (shared by every model): a difficulty ``d`` on the logit scale (level,
topic offset, hidden noise; a model is right with probability about
``expit(skill + scale * topic.scale_gain - d)``: the larger models gain most on some
topics) and a log-length factor (workflow kind, level, topic,
statement details, hidden noise). Per model: its own log-length noise, a correctness
uniform correlated across models (Gaussian copula, shared weight ``_CORRECT_SHARED``),
and a runaway flag from one shared latent, so a task that runs away on a strong model
also runs away on the weaker ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from scipy.special import expit, ndtr

from longroute.workloads.agent_models import (
    APPS,
    LEVEL_SHARES,
    LONG_ROLES,
    MATH,
    MODELS,
    ModelParams,
    WorkflowKind,
)
from longroute.workloads.agent_tasks import TaskText

MAX_STAGES = 4
_DIFFICULTY_PER_LEVEL = 1.0  # logits per level step
# hidden per-task difficulty noise (logits): MATH's source and number words tell more
_DIFFICULTY_SIGMA = MappingProxyType({APPS: 0.8, MATH: 1.5})
_LENGTH_PER_LEVEL = 0.12  # log-length per level step
_LENGTH_PER_DETAIL = 0.1  # log-length per optional statement sentence
_LENGTH_HIDDEN_SIGMA = 0.45  # hidden per-task log-length noise
_SHARE_SHARED_SIGMA = 0.25  # per-task jitter of the stage shares (log)
_SHARE_MODEL_SIGMA = 0.15  # per-(task, model) jitter of the stage shares (log)
_CORRECT_SHARED = 0.5  # weight of the task-shared normal in the correctness copula
# runaway latent: level, hidden difficulty, own noise (weights before normalising)
_RUNAWAY_WEIGHTS = (0.4, 0.5, 0.77)


@dataclass(frozen=True, slots=True)
class WorkflowDraws:
    """Per workflow: model -> stage outputs (tokens, one per stage) and model -> correct."""

    stage_outputs_by_model: list[dict[str, list[int]]]
    is_correct_by_model: list[dict[str, bool]]


def _level_moments(dataset: str) -> tuple[float, float]:
    shares = np.asarray(LEVEL_SHARES[dataset]) / sum(LEVEL_SHARES[dataset])
    levels = np.arange(1, 6)
    mean = float(shares @ levels)
    return mean, float(math.sqrt(shares @ (levels - mean) ** 2))


def _runaway_latent(levels: np.ndarray, datasets: list[str], z_hidden: np.ndarray,
                    z_own: np.ndarray) -> np.ndarray:  # fmt: skip
    """A standard-normal-ish latent per task; it runs away on m when above m's threshold."""
    moments = {d: _level_moments(d) for d in set(datasets)}
    mean = np.asarray([moments[d][0] for d in datasets])
    sd = np.asarray([moments[d][1] for d in datasets])
    w_level, w_hidden, w_own = _RUNAWAY_WEIGHTS
    norm = math.sqrt(w_level**2 + w_hidden**2 + w_own**2)
    latent: np.ndarray = (
        w_level * (levels - mean) / sd + w_hidden * z_hidden + w_own * z_own
    ) / norm
    return latent


def _split(body: np.ndarray, shares: np.ndarray, jitter: np.ndarray) -> np.ndarray:
    """Stage outputs (n, MAX_STAGES): ``body`` over the stages by jittered shares, >= 1."""
    weights = shares * np.exp(jitter)
    weights /= weights.sum(axis=1, keepdims=True)
    return np.where(shares > 0, np.maximum(np.rint(body[:, None] * weights), 1.0), 0.0)


def _cap(stages: np.ndarray, cap: int) -> np.ndarray:
    """Take any excess over ``cap`` from each workflow's longest stage."""
    excess = np.maximum(stages.sum(axis=1) - cap, 0.0)
    rows = np.arange(len(stages))
    longest = stages.argmax(axis=1)
    stages[rows, longest] -= excess
    return stages


def draw_outcomes(
    rng: np.random.Generator, kinds: Sequence[WorkflowKind], levels: Sequence[int],
    tasks: Sequence[TaskText], params: Sequence[ModelParams], cap: int,
) -> WorkflowDraws:  # fmt: skip
    """Outputs and correctness of every workflow on every model of ``params``.

    Draw order: task normals (n, 4), runaway lengths (n), per-model length and
    correctness normals (n, B) each, share jitter (n, 4) and (n, 4, B), B = len(MODELS).
    """
    n, builtin = len(kinds), list(MODELS)
    z_task = rng.standard_normal((n, 4))
    runaway_u = rng.random(n)
    z_length = rng.standard_normal((n, len(builtin)))
    z_correct = rng.standard_normal((n, len(builtin)))
    jitter_task = rng.standard_normal((n, MAX_STAGES)) * _SHARE_SHARED_SIGMA
    jitter_model = rng.standard_normal((n, MAX_STAGES, len(builtin))) * _SHARE_MODEL_SIGMA

    datasets = [k.dataset for k in kinds]
    level = np.asarray(levels, dtype=float)
    difficulty = (
        _DIFFICULTY_PER_LEVEL * (level - 3.0)
        + np.asarray([t.topic.difficulty_offset for t in tasks])
        + np.asarray([_DIFFICULTY_SIGMA[d] for d in datasets]) * z_task[:, 0]
    )
    shared_log_length = (
        np.log([k.size_factor for k in kinds])
        + _LENGTH_PER_LEVEL * (level - 3.0)
        + np.asarray([t.topic.length_log_factor for t in tasks])
        + _LENGTH_PER_DETAIL * (np.asarray([t.num_details for t in tasks]) - 1.0)
        + _LENGTH_HIDDEN_SIGMA * z_task[:, 1]
    )
    scale_gain = np.asarray([t.topic.scale_gain for t in tasks])
    runaway_latent = _runaway_latent(level, datasets, z_task[:, 0], z_task[:, 3])
    runaway_total = cap * np.exp2(runaway_u - 1.0)  # log-uniform in [cap / 2, cap]
    shares = np.zeros((n, MAX_STAGES))
    for i, kind in enumerate(kinds):
        shares[i, : kind.num_stages] = kind.shares
    long_stage = np.asarray([next(j for j, r in enumerate(k.roles) if r in LONG_ROLES)
                             for k in kinds])  # fmt: skip
    num_stages = np.asarray([k.num_stages for k in kinds], dtype=float)
    rows = np.arange(n)

    outputs: list[dict[str, list[int]]] = [{} for _ in range(n)]
    correct: list[dict[str, bool]] = [{} for _ in range(n)]
    for model in params:
        col = builtin.index(model.name)
        median = np.asarray([model.length[d].median_tokens for d in datasets])
        sigma = np.asarray([model.length[d].sigma for d in datasets])
        fraction = np.asarray([model.length[d].runaway_fraction for d in datasets])
        skill = np.asarray([model.skill[d] for d in datasets]) + model.scale * scale_gain

        is_runaway = ndtr(runaway_latent) > 1.0 - fraction
        body = np.exp(np.log(median) + shared_log_length + sigma * z_length[:, col])
        body = np.clip(body, num_stages, cap)
        stages = _split(body, shares, jitter_task + jitter_model[:, :, col])
        others = stages.sum(axis=1) - stages[rows, long_stage]
        stretched = np.maximum(stages[rows, long_stage], np.rint(runaway_total) - others)
        stages[rows, long_stage] = np.where(is_runaway, stretched, stages[rows, long_stage])
        stages = _cap(stages, cap)

        u_correct = ndtr(_CORRECT_SHARED * z_task[:, 2]
                         + math.sqrt(1 - _CORRECT_SHARED**2) * z_correct[:, col])  # fmt: skip
        is_correct = (u_correct < expit(skill - difficulty)) & ~is_runaway
        stage_lists = stages.astype(int).tolist()
        flags = is_correct.tolist()
        for i, kind in enumerate(kinds):
            outputs[i][model.name] = stage_lists[i][: kind.num_stages]
            correct[i][model.name] = flags[i]
    return WorkflowDraws(outputs, correct)
