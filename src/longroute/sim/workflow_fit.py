"""Chimera's and LTR's predictors for a scenario: fitted offline once, or read from files.

Called once per ``run_scenario`` for the routers that declare
``workflow_predictors`` (chimera: confidence and length; ltr: ranker), never
on a hot path. With ``fit_workload`` the section's generator is run with the
section's fixed ``seed`` and the fleet's models, every workflow is measured on
every model (``agent_outcomes``) and the asked-for predictors are fitted with
that seed, so every run and every seed of a sweep uses the same predictors,
trained on draws the evaluation never sees. Fits are cached per process by
the section's content and the models (a sweep's cells share them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from longroute.config import WorkflowPredictorsConfig
from longroute.routing import ROUTERS

KINDS = ("confidence", "length", "ranker")


def predictor_kinds(router: str) -> tuple[str, ...]:
    """The predictors a registered router asks for (``workflow_predictors``), maybe none."""
    return tuple(getattr(ROUTERS.get(router), "workflow_predictors", ()))


def build_workflow_predictors(
    config: WorkflowPredictorsConfig, models: Sequence[str], kinds: Sequence[str]
) -> dict[str, Any]:
    """``kind -> predictor`` for ``kinds``; each checked to know every model of the fleet."""
    from longroute.estimators.workflow_models import check_models

    wanted = tuple(k for k in KINDS if k in kinds)
    if config.fit_workload is None:
        out = {kind: _load(config, kind) for kind in wanted}
    else:
        section = json.dumps(config.model_dump(mode="json"), sort_keys=True)
        out = dict(zip(wanted, _fitted(section, tuple(sorted(models)), wanted), strict=True))
    for kind, model in out.items():
        if kind != "ranker":
            check_models(model, models, Path(getattr(config, kind) or f"<fitted {kind}>"))
    return out


def _load(config: WorkflowPredictorsConfig, kind: str) -> Any:
    from longroute.estimators import workflow_models

    path = getattr(config, kind)
    if path is None:
        raise ValueError(
            f"workflow_predictors: a router here needs a {kind} model, but the section names "
            f"no '{kind}' file (or give fit_workload)"
        )
    loader = getattr(workflow_models, f"load_{kind}")
    return loader(Path(path))


@lru_cache(maxsize=8)
def _fitted(section_json: str, models: tuple[str, ...], kinds: tuple[str, ...]) -> tuple[Any, ...]:
    from longroute.estimators.confidence import fit_confidence
    from longroute.estimators.length_rank import fit_ranker
    from longroute.estimators.workflow_length import fit_length
    from longroute.workloads.agent_workflows import agent_outcomes
    from longroute.workloads.registry import WORKLOADS

    config = WorkflowPredictorsConfig.model_validate(json.loads(section_json))
    spec = config.fit_workload
    assert spec is not None
    params = dict(spec.params)
    params.setdefault("models", list(models))
    workload = WORKLOADS.build(spec.generator, params, seed=config.seed)
    rows = agent_outcomes(workload)
    if not rows:
        raise ValueError(f"workflow_predictors.fit_workload {spec.generator!r} has no workflows")
    fits: dict[str, Callable[..., Any]] = {
        "confidence": fit_confidence,
        "length": fit_length,
        "ranker": fit_ranker,
    }
    return tuple(fits[kind](rows, seed=config.seed) for kind in kinds)
