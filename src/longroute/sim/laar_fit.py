"""Correctness and capability for a scenario: the oracle, offline outcomes, the fitted Q(m,x).

Called once per ``run_scenario``, before any simulation, never on a hot path.

* :func:`build_oracle`: the scenario's ``correctness`` section as a
  :class:`CorrectnessOracle` (the ground truth of which answers are right).
* :func:`measure_outcomes`: the "offline measurement" of the seed paper (§3,
  §6.1): every checkable turn of a workload answered once by every model,
  single shot, judged by the oracle -- what a team would collect by running
  its fit split through each model. O(turns x models).
* :func:`build_capability`: the scenario's ``capability`` section as a
  :class:`CapabilityModel`, fitted on those outcomes with ``fit_capability``
  or read from a JSON file.
"""

from __future__ import annotations

from collections.abc import Sequence

from longroute.config import CapabilityConfig, CorrectnessConfig
from longroute.estimators.capability import CapabilityModel, load_capability
from longroute.estimators.capability_fit import Outcome, fit_capability
from longroute.sim.clients import query_id_of
from longroute.sim.correctness import AccuracyTable, CorrectnessOracle, load_accuracy_table
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.types import Workload


def build_oracle(config: CorrectnessConfig, seed: int) -> CorrectnessOracle:
    """The oracle of a ``correctness`` section; its own seed, else ``seed``."""
    table = load_accuracy_table(config.accuracy_table)
    draw_seed = seed if config.seed is None else config.seed
    return CorrectnessOracle(table, temperature=config.temperature, seed=draw_seed)


def check_table_covers(table: AccuracyTable, models: Sequence[str], workload: Workload) -> None:
    """Raise ``ValueError`` before a run if a checkable turn has no accuracy for a model.

    Checks each distinct (task, language) of the workload's turns against
    every model; the message names the table, the missing entry and what the
    table has. O(turns + distinct settings x models).
    """
    settings = {
        (turn.task, turn.language)
        for session in workload.sessions
        for turn in session.turns
        if turn.task is not None and turn.language is not None
    }
    for task, language in sorted(settings, key=lambda s: (s[0] or "", s[1] or "")):
        assert task is not None and language is not None
        for model in models:
            try:
                table.probability(task, model, language, 1)
            except KeyError as exc:
                raise ValueError(
                    f"workload {workload.name!r} asks {task!r} questions in {language.value!r} "
                    f"of model {model!r}, but {exc.args[0]}"
                ) from None


def measure_outcomes(
    workload: Workload, oracle: CorrectnessOracle, models: Sequence[str]
) -> list[Outcome]:
    """One single-shot outcome per (checkable turn, model), in workload then model order.

    A turn is checkable when it has a task and a language; others are skipped.
    The query id is the turn's (``query_id_of``), as in a simulation.
    """
    check_table_covers(oracle.table, models, workload)
    out: list[Outcome] = []
    for session in workload.sessions:
        for index, turn in enumerate(session.turns):
            if turn.task is None or turn.language is None:
                continue
            query_id = query_id_of(session.session_id, index)
            for model in models:
                is_correct = oracle.is_correct(
                    query_id,
                    model,
                    task=turn.task,
                    language=turn.language,
                    num_prompt_tokens=turn.num_prompt_tokens,
                )
                out.append(
                    Outcome(
                        model=model,
                        language=turn.language,
                        num_prompt_tokens=turn.num_prompt_tokens,
                        task=turn.task,
                        is_correct=is_correct,
                        query_id=query_id,
                    )
                )
    return out


def build_capability(
    config: CapabilityConfig,
    oracle: CorrectnessOracle | None,
    models: Sequence[str],
    seed: int,
) -> CapabilityModel:
    """Q(m,x) for a ``capability`` section: fitted on ``fit_workload`` or read from ``file``.

    ``fit_workload`` is generated with ``seed`` and answered by every model
    in ``models`` (the fleet's); it needs ``oracle``. Raises ``ValueError``
    when the fit workload has nothing to check.
    """
    if config.file is not None:
        return load_capability(config.file)
    assert config.fit_workload is not None
    if oracle is None:
        raise ValueError("capability.fit_workload needs a 'correctness' section")
    spec = config.fit_workload
    workload = WORKLOADS.build(spec.generator, spec.params, seed=seed)
    outcomes = measure_outcomes(workload, oracle, models)
    if not outcomes:
        raise ValueError(
            f"capability.fit_workload {spec.generator!r} has no turn with a task and a "
            "language: nothing to fit Q(m,x) on"
        )
    return fit_capability(outcomes)
