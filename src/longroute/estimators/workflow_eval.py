"""Held-out quality of Chimera's predictors, as the paper's appendix B reports it.

* :func:`split_by_program` holds out whole workflows (``program_id``), so no
  stage of a held-out workflow -- nor its prompt on another model -- is seen
  at fit time.
* :func:`confidence_quality`: average precision of q[m] per model and macro
  (Table 2), beside each model's share of correct rows.
* :func:`length_quality`: Kendall-tau distance between the predicted and the
  true remaining output per model, beside two baselines (Table 3): FCFS
  (arrival order, which carries no information about length: a seeded random
  order here) and the input length (prompt tokens, shortest first).
* :func:`ranker_quality`: the same for the LTR ranker's score, against each
  request's own output (what it was trained on) and against the remaining
  output (what STJF would want).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from longroute.estimators.confidence import ConfidenceModel, mean_average_precision
from longroute.estimators.length_rank import LengthRanker
from longroute.estimators.workflow_length import RemainingLengthModel, kendall_tau_distance
from longroute.features.workflow import WorkflowFeatures
from longroute.workloads.agent_outcomes import OutcomeRow, models_of


def split_by_program(
    rows: Sequence[OutcomeRow], held_out_fraction: float, seed: int
) -> tuple[list[OutcomeRow], list[OutcomeRow]]:
    """(fit rows, held-out rows): ``ceil(fraction x programs)`` random programs held out.

    A fraction of 0 holds out nothing. Raises ``ValueError`` for a fraction
    outside [0, 1) or a split that leaves either side without a program.
    """
    if not 0.0 <= held_out_fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {held_out_fraction}")
    programs = sorted({row.program_id for row in rows})
    random.Random(seed).shuffle(programs)
    num_held_out = math.ceil(held_out_fraction * len(programs))
    if held_out_fraction > 0 and not 0 < num_held_out < len(programs):
        raise ValueError(
            f"cannot hold out {held_out_fraction:g} of {len(programs)} workflow(s) and keep "
            "some on each side: give more workflows or another fraction"
        )
    held_out = set(programs[:num_held_out])
    fit = [row for row in rows if row.program_id not in held_out]
    return fit, [row for row in rows if row.program_id in held_out]


@dataclass(frozen=True, slots=True)
class RankQuality:
    """Kendall-tau distances (0 = oracle order, 0.5 = random) of one model's held-out rows."""

    model: str
    num_rows: int
    predictor: float
    fcfs: float
    input_length: float
    predictor_vs_remaining: float | None = None


def confidence_quality(
    model: ConfidenceModel, rows: Sequence[OutcomeRow]
) -> tuple[dict[str, float], dict[str, float]]:
    """(average precision, share of correct rows), per model and ``"macro"`` (their mean).

    The share is the AP of an uninformed score: what the AP should be read against.
    """
    average_precision = mean_average_precision(model, rows)
    share: dict[str, float] = {}
    for name in models_of(rows):
        mine = [row.is_correct for row in rows if row.model == name]
        share[name] = sum(mine) / len(mine)
    share["macro"] = sum(share.values()) / len(share)
    return average_precision, share


def _rank_rows(
    rows: Sequence[OutcomeRow],
    seed: int,
    predict: Callable[[str, list[OutcomeRow]], list[float]],
    truth: Callable[[OutcomeRow], int],
    also_remaining: bool,
) -> list[RankQuality]:
    out = []
    for model in models_of(rows):
        mine = [row for row in rows if row.model == model]
        true = [truth(row) for row in mine]
        predicted = predict(model, mine)
        fcfs = list(range(len(mine)))
        random.Random(seed).shuffle(fcfs)
        remaining = [row.remaining_output_tokens for row in mine]
        out.append(
            RankQuality(
                model=model,
                num_rows=len(mine),
                predictor=kendall_tau_distance(predicted, true),
                fcfs=kendall_tau_distance(fcfs, true),
                input_length=kendall_tau_distance([r.num_prompt_tokens for r in mine], true),
                predictor_vs_remaining=(
                    kendall_tau_distance(predicted, remaining) if also_remaining else None
                ),
            )
        )
    return out


def length_quality(
    model: RemainingLengthModel, rows: Sequence[OutcomeRow], *, seed: int = 0
) -> list[RankQuality]:
    """Per model: ŷ against ``remaining_output_tokens`` and the two baselines."""

    def predict(name: str, mine: list[OutcomeRow]) -> list[float]:
        return model.predict_rows_of([WorkflowFeatures.from_row(r) for r in mine], name)

    return _rank_rows(rows, seed, predict, lambda r: r.remaining_output_tokens, False)


def ranker_quality(
    ranker: LengthRanker, rows: Sequence[OutcomeRow], *, seed: int = 0
) -> list[RankQuality]:
    """Per model: the ranker's score against each row's own ``output_tokens`` (and remaining)."""

    def predict(_: str, mine: list[OutcomeRow]) -> list[float]:
        return [ranker.score_features(WorkflowFeatures.from_row(r)) for r in mine]

    return _rank_rows(rows, seed, predict, lambda r: r.output_tokens, True)
