"""Chimera's semantic router: q[m](prompt), the chance that model m answers a workflow right.

The paper (§3.3, appendix B.1) fine-tunes ModernBERT with a multi-label head:
one sigmoid logit per model, trained with binary cross-entropy on offline
traces labelled by correctness. Here the encoder is a TF-IDF of word 1-2-grams
(sublinear tf, L2-normalised) of the prompt's system and user text, and the
head is one L2-regularised logistic regression per model -- the same loss (BCE
per model) on a bag-of-n-grams instead of a transformer's pooled state, fitted
in seconds on a CPU. Model m's head is fitted on the rows answered by m, whose
label is whether m's workflow ended with a correct answer (the same label on
every stage of a workflow).

Scoring one request (:meth:`ConfidenceModel.scores`) is the plain-Python
transform of :class:`~longroute.features.text_sketch.TfidfSketch` and one
small matrix product (``values @ weights[columns]``, all models at once): no
scikit-learn call at routing time. Memory: vocabulary x models floats.

Quality is reported as average precision per model and its macro mean
(:func:`mean_average_precision`), the paper's threshold-free measure (its
Table 2: 0.595-0.631 with ModernBERT on APPS and MATH).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longroute.features.text_sketch import FloatArray, TfidfSketch, fit_vectorizer
from longroute.features.workflow import WorkflowFeatures
from longroute.types import Request
from longroute.workloads.agent_outcomes import OutcomeRow, models_of

MIN_ROWS_PER_MODEL = 10
"""Fewest rows per model (with both outcomes present) :func:`fit_confidence` accepts."""


def _sigmoid(z: float) -> float:
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True, slots=True, eq=False)
class ConfidenceModel:
    """q[m] in [0, 1] for each fitted model; immutable, read once per workflow by the router.

    ``weights`` has one row per vocabulary column and one column per model
    (in ``models`` order); ``intercepts`` one logit offset per model.
    """

    models: tuple[str, ...]
    sketch: TfidfSketch
    weights: FloatArray
    intercepts: FloatArray

    def __post_init__(self) -> None:
        expected = (self.sketch.num_columns, len(self.models))
        if self.weights.shape != expected or self.intercepts.shape != (len(self.models),):
            raise ValueError(
                f"confidence weights {self.weights.shape} / intercepts {self.intercepts.shape} "
                f"do not fit {expected[0]} vocabulary columns x {expected[1]} models"
            )

    def logits(self, features: WorkflowFeatures) -> FloatArray:
        """One logit per model (``models`` order) for the features' system + user text."""
        columns, values = self.sketch.transform(features.full_text)
        result: FloatArray = values @ self.weights[columns] + self.intercepts
        return result

    def scores_of(self, features: WorkflowFeatures) -> dict[str, float]:
        """q[m] for every model, from features (fit-time rows or routing-time requests)."""
        logits = self.logits(features)
        return {m: _sigmoid(float(z)) for m, z in zip(self.models, logits, strict=True)}

    def scores(self, request: Request) -> dict[str, float]:
        """q[m] for every model: called once per workflow by Chimera's router."""
        return self.scores_of(WorkflowFeatures.from_request(request))

    def scores_many(self, requests: Sequence[Request]) -> list[dict[str, float]]:
        """:meth:`scores` of each request, in order."""
        return [self.scores(request) for request in requests]


def _check_labels(rows: Sequence[OutcomeRow], model: str) -> None:
    num_correct = sum(row.is_correct for row in rows)
    if len(rows) < MIN_ROWS_PER_MODEL:
        raise ValueError(
            f"model {model!r}: {len(rows)} outcome rows; need at least {MIN_ROWS_PER_MODEL}"
        )
    if num_correct in (0, len(rows)):
        state = "correct" if num_correct else "wrong"
        raise ValueError(
            f"model {model!r}: all {len(rows)} outcome rows are {state}; a confidence head "
            "needs both correct and wrong answers"
        )


def fit_confidence(
    rows: Sequence[OutcomeRow],
    *,
    seed: int = 0,
    regularization_c: float = 0.5,
    max_features: int = 50_000,
    min_df: int = 2,
) -> ConfidenceModel:
    """Fit one logistic head per model on the rows' text; label ``is_correct``.

    ``regularization_c`` (inverse L2 strength) 0.5 gave the best held-out
    macro AP among 0.05-16 on a draft of the ``agent-workflows`` generator
    (0.636 against 0.613 at 4 and 0.597 at 16); not re-tuned on the final one.
    Deterministic: the vectorizer and lbfgs
    involve no randomness (``seed`` goes to scikit-learn's ``random_state`` for
    a uniform signature with the other fits). Raises ``ValueError`` naming the
    model with too few rows or with only one outcome, and for a non-positive
    ``regularization_c``.
    """
    from sklearn.linear_model import LogisticRegression

    if not regularization_c > 0:
        raise ValueError(f"regularization_c must be > 0, got {regularization_c}")
    models = models_of(rows)
    if not models:
        raise ValueError("no outcome rows to fit a confidence model on")
    features = [WorkflowFeatures.from_row(row) for row in rows]
    vectorizer, matrix = fit_vectorizer(
        [f.full_text for f in features], max_features=max_features, min_df=min_df
    )
    sketch = TfidfSketch.from_vectorizer(vectorizer)
    weights = np.zeros((sketch.num_columns, len(models)), dtype=np.float64)
    intercepts = np.zeros(len(models), dtype=np.float64)
    row_models = np.asarray([row.model for row in rows])
    labels = np.asarray([row.is_correct for row in rows], dtype=np.int64)
    for k, model in enumerate(models):
        mine = np.flatnonzero(row_models == model)
        _check_labels([rows[int(i)] for i in mine], model)
        head = LogisticRegression(C=regularization_c, max_iter=2000, random_state=seed)
        head.fit(matrix[mine], labels[mine])
        weights[:, k] = head.coef_[0]
        intercepts[k] = head.intercept_[0]
    return ConfidenceModel(models=models, sketch=sketch, weights=weights, intercepts=intercepts)


def mean_average_precision(model: ConfidenceModel, rows: Sequence[OutcomeRow]) -> dict[str, float]:
    """Average precision of q[m] against ``is_correct`` per model, plus ``"macro"``, their mean.

    Each model is scored on the rows it answered. A model the confidence model
    does not know, or with no correct row (precision undefined), raises
    ``ValueError`` naming it.
    """
    from sklearn.metrics import average_precision_score

    result: dict[str, float] = {}
    for name in models_of(rows):
        if name not in model.models:
            raise ValueError(
                f"rows name model {name!r}; the confidence model knows {', '.join(model.models)}"
            )
        mine = [row for row in rows if row.model == name]
        labels = [row.is_correct for row in mine]
        if not any(labels):
            raise ValueError(
                f"model {name!r}: none of its {len(mine)} rows is correct; "
                "average precision is undefined"
            )
        scores = [model.scores_of(WorkflowFeatures.from_row(row))[name] for row in mine]
        result[name] = float(average_precision_score(labels, scores))
    result["macro"] = float(np.mean(list(result.values())))
    return result
