"""Parameter tables of ``agent-workflows``: workflow kinds, role shares and per-model numbers.

Read by :mod:`longroute.workloads.agent_workflows` once per call. Every number here is
ours, not a measurement: the shapes follow the Chimera paper (Appendix A.1 for the
workflows, §4.1 for output lengths, §4.3 and Figure 5 for the range of task scores);
the fitted constants (:data:`MODELS`) were found by simulation (bisection on 10^5
workflows per dataset, seed 0, default knobs) so that the generated totals land on
:data:`LENGTH_TARGETS` and the task scores on :data:`SCORE_TARGETS`.

A model's total workflow output is a mixture: a lognormal *body* (whose log is the sum
of factors shared by every model, visible in the text or hidden, plus the model's own
noise ``sigma``) and, with probability ``runaway_fraction``, a *runaway* generation that
repeats itself up to the output cap (log-uniform in [cap / 2, cap]). The small models'
heavy tails (sd 3-4x the mean) come from the runaways; the 14B has none, its sd comes
from a wider body. Changing ``stage_mix`` or the cap moves the moments off the targets.
"""

from __future__ import annotations

import math as _math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

APPS = "apps"
MATH = "math"
DATASETS = (APPS, MATH)


@dataclass(frozen=True, slots=True)
class WorkflowKind:
    """One workflow of the paper's Appendix A.1: its roles in order and each stage's
    share of the workflow's total output (the shares sum to 1). ``size_factor`` scales
    the total against the one-stage workflow (more stages write more)."""

    dataset: str
    roles: tuple[str, ...]
    shares: tuple[float, ...]
    size_factor: float

    @property
    def name(self) -> str:
        """E.g. ``"apps/planner-coder-qa-coder"``."""
        return f"{self.dataset}/{'-'.join(self.roles)}"

    @property
    def num_stages(self) -> int:
        return len(self.roles)


# Per dataset, the 1-, 2- and 4-stage workflows (the order of the ``stage_mix`` knob).
# Planners write short plans, coders/solvers the long part, qa/verifier a medium review;
# the second coder/solver pass revises and writes a little less than the first.
WORKFLOW_KINDS: Mapping[str, tuple[WorkflowKind, ...]] = MappingProxyType({
    APPS: (
        WorkflowKind(APPS, ("coder",), (1.0,), 1.0),
        WorkflowKind(APPS, ("planner", "coder"), (0.22, 0.78), 1.3),
        WorkflowKind(APPS, ("planner", "coder", "qa", "coder"), (0.12, 0.4, 0.18, 0.3), 2.2),
    ),
    MATH: (
        WorkflowKind(MATH, ("solver",), (1.0,), 1.0),
        WorkflowKind(MATH, ("planner", "solver"), (0.2, 0.8), 1.25),
        WorkflowKind(
            MATH, ("planner", "solver", "verifier", "solver"), (0.12, 0.43, 0.2, 0.25), 2.0
        ),
    ),
})  # fmt: skip

# Level 1-5 shares: MATH's test split (437, 894, 1131, 1214, 1324 of 5000 problems); APPS
# (introductory 1000, interview 3000, competition 1000 of its 5000 test problems), its
# classes spread over levels 1-2, 3-4 and 5.
LEVEL_SHARES: Mapping[str, tuple[float, ...]] = MappingProxyType({
    APPS: (0.1, 0.1, 0.3, 0.3, 0.2),
    MATH: (0.0874, 0.1788, 0.2262, 0.2428, 0.2648),
})  # fmt: skip

LONG_ROLES = frozenset({"coder", "solver"})
"""Roles whose stage takes a runaway generation (the first such stage of a workflow)."""


@dataclass(frozen=True, slots=True)
class LengthParams:
    """A model's total workflow output on one dataset: lognormal body plus runaways.

    ``median_tokens``: the body's median for a one-stage workflow of average features;
    ``sigma``: the model's own log-normal noise (on top of the shared factors);
    ``runaway_fraction``: probability that a workflow runs away on this model.
    """

    median_tokens: float
    sigma: float
    runaway_fraction: float


@dataclass(frozen=True, slots=True)
class ModelParams:
    """Built-in numbers of one model: per dataset, skill (logit) and lengths.

    ``scale``: log(parameters / 1.5B) / log(14B / 1.5B), 0 for the 1.5B and 1 for the
    14B; a topic's ``scale_gain`` adds ``scale * scale_gain`` logits to its skill.
    """

    name: str
    skill: Mapping[str, float]
    length: Mapping[str, LengthParams]
    scale: float


@dataclass(frozen=True, slots=True)
class LengthTarget:
    """Mean and standard deviation of a model's total workflow output (tokens), over the
    default mix (uniform workflow kinds), and where the figure comes from."""

    mean_tokens: float
    sd_tokens: float
    source: str


_PAPER = "Chimera §4.1"
_INTERPOLATED = "interpolated in log(parameters) between 1.5B and 14B (ours)"
# APPS 1.5B 447/1,276 and 14B 649/534; MATH 1.5B 606/2,587 and 14B 709/715 (§4.1).
# 3B and 7B: the mean linearly and the sd log-linearly in log(parameters), t = 0.31 / 0.69.
LENGTH_TARGETS: Mapping[str, Mapping[str, LengthTarget]] = MappingProxyType({
    "qwen2.5-1.5b": {APPS: LengthTarget(447, 1276, _PAPER), MATH: LengthTarget(606, 2587, _PAPER)},
    "qwen2.5-3b": {
        APPS: LengthTarget(510, 974, _INTERPOLATED), MATH: LengthTarget(638, 1736, _INTERPOLATED)
    },
    "qwen2.5-7b": {
        APPS: LengthTarget(586, 699, _INTERPOLATED), MATH: LengthTarget(677, 1066, _INTERPOLATED)
    },
    "qwen2.5-14b": {APPS: LengthTarget(649, 534, _PAPER), MATH: LengthTarget(709, 715, _PAPER)},
})  # fmt: skip

SCORE_TARGETS: Mapping[str, Mapping[str, float]] = MappingProxyType({
    "qwen2.5-1.5b": {APPS: 0.17, MATH: 0.45},
    "qwen2.5-3b": {APPS: 0.24, MATH: 0.53},
    "qwen2.5-7b": {APPS: 0.30, MATH: 0.60},
    "qwen2.5-14b": {APPS: 0.35, MATH: 0.65},
})  # fmt: skip
"""Share of workflows answered right (ours, shaped after the paper's score ranges)."""


def _model(
    name: str, billions: float, skill: tuple[float, float], apps: tuple[float, float, float],
    math: tuple[float, float, float],
) -> ModelParams:  # fmt: skip
    return ModelParams(
        name,
        MappingProxyType({APPS: skill[0], MATH: skill[1]}),
        MappingProxyType({APPS: LengthParams(*apps), MATH: LengthParams(*math)}),
        _math.log(billions / 1.5) / _math.log(14.0 / 1.5),
    )


# (skill apps, skill math), (median, sigma, runaway) apps, the same for math. Fitted per
# (model, dataset) by bisection with the constants of agent_draws (re-fit after changing
# them): the median on the mean; the runaway share on the sd (1.5B-7B, own sigma 0.45)
# or the sigma on the sd (14B, no runaways); the skill on the score, with the topics'
# scale gains (agent_tasks), by scripts/fit_agent_models.py.
MODELS: Mapping[str, ModelParams] = MappingProxyType({
    m.name: m
    for m in (
        _model("qwen2.5-1.5b", 1.5, (-1.709, 0.235), (160.9, 0.45, 0.00404),
               (153.3, 0.45, 0.01637)),
        _model("qwen2.5-3b", 3.0, (-1.334, 0.487), (203.3, 0.45, 0.002), (265.7, 0.45, 0.00713)),
        _model("qwen2.5-7b", 7.0, (-1.206, 0.582), (246.2, 0.45, 0.0007), (335.4, 0.45, 0.00221)),
        _model("qwen2.5-14b", 14.0, (-1.107, 0.618), (289.9, 0.335, 0.0), (347.1, 0.582, 0.0)),
    )
})  # fmt: skip


def model_params(names: Sequence[str]) -> tuple[ModelParams, ...]:
    """The built-in parameters of ``names``, in order.

    Raises ``ValueError`` for an empty or repeated list and for a name without built-in
    parameters, listing the models that have them.
    """
    if isinstance(names, str) or not names:
        raise ValueError(f"models must be a non-empty list of model names, got {names!r}")
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        raise ValueError(
            f"no built-in agent-workflow parameters for model(s) {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(MODELS)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"models must not repeat a name, got {list(names)}")
    return tuple(MODELS[name] for name in names)


def dataset_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` checked against :data:`DATASETS` (non-empty, known, no repeats)."""
    if isinstance(names, str) or not names:
        raise ValueError(f"datasets must be a non-empty list, valid: {', '.join(DATASETS)}")
    unknown = [name for name in names if name not in DATASETS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"datasets must be distinct names from {', '.join(DATASETS)}, got {list(names)}"
        )
    return tuple(names)
