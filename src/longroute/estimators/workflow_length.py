"""Chimera's length predictor: the median remaining output tokens of a workflow (§3.4).

For a request at stage i of workflow p, Chimera's scheduling priority is
``ŷ ≈ median(Y_r | φ(r), m)`` with ``Y_r`` the output tokens of stages i..N
(``OutcomeRow.remaining_output_tokens``). One quantile regression forest per
model (``quantile_forest.RandomForestQuantileRegressor``, the paper's "model
name" feature made a forest of its own) reads the paper's features:

* token counts: system (estimated), user (the rest) and full prompt;
* workflow state: the stage number (0 when unknown) and a one-hot of the
  workflow kind (all zeros for a kind not seen at fit time);
* text sketch: TF-IDF of the user text's word 1-2-grams, reduced by truncated
  SVD (``svd_components``, fewer when the vocabulary is smaller).

The forests are fitted on ``log1p(tokens)`` (splits are not dragged by the
heavy tail) and predict ``expm1`` of the forest's q-quantile, so the order of
predictions is the order of the log-space quantiles. Prediction for one
request uses no scikit-learn call: the sketch's plain-Python transform, a
precomputed SVD projection (``values @ projection[columns]``) and
:class:`~longroute.estimators.flat_forest.FlatForest`.

:func:`kendall_tau_distance` measures a prediction as the paper's Table 3
does: the fraction of request pairs a schedule by the prediction inverts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from longroute.estimators.flat_forest import FlatForest
from longroute.features.text_sketch import FloatArray, TfidfSketch, fit_vectorizer
from longroute.features.workflow import WorkflowFeatures
from longroute.types import Request
from longroute.workloads.agent_outcomes import OutcomeRow, models_of

MIN_ROWS_PER_MODEL = 10
"""Fewest rows per model :func:`fit_length` accepts."""

NUM_COUNT_FEATURES = 4
"""system, user and prompt tokens, and the stage number; then workflow one-hot, then SVD."""


@dataclass(frozen=True, slots=True, eq=False)
class LengthFeatureEncoder:
    """Turns :class:`WorkflowFeatures` into the forest's feature row (see the module doc).

    ``projection`` is the SVD's components transposed: vocabulary x components.
    """

    workflows: tuple[str, ...]
    sketch: TfidfSketch
    projection: FloatArray

    @property
    def num_features(self) -> int:
        """Length of a feature row."""
        return NUM_COUNT_FEATURES + len(self.workflows) + int(self.projection.shape[1])

    def encode(self, features: WorkflowFeatures) -> FloatArray:
        """The feature row of one request or row."""
        row = np.zeros(self.num_features, dtype=np.float64)
        row[0] = features.num_system_tokens
        row[1] = features.num_user_tokens
        row[2] = features.num_prompt_tokens
        row[3] = features.stage if features.stage is not None else 0
        if features.workflow in self.workflows:
            row[NUM_COUNT_FEATURES + self.workflows.index(features.workflow)] = 1.0
        columns, values = self.sketch.transform(features.user_text)
        if len(columns):
            row[NUM_COUNT_FEATURES + len(self.workflows) :] = values @ self.projection[columns]
        return row


@dataclass(frozen=True, slots=True, eq=False)
class RemainingLengthModel:
    """ŷ per model: the predicted ``quantile`` of the workflow's remaining output tokens."""

    models: tuple[str, ...]
    encoder: LengthFeatureEncoder
    forests: Mapping[str, FlatForest]
    quantile: float

    def __post_init__(self) -> None:
        if set(self.forests) != set(self.models):
            raise ValueError(
                f"forests for {sorted(self.forests)} do not match models {list(self.models)}"
            )

    def _forest(self, model: str) -> FlatForest:
        forest = self.forests.get(model)
        if forest is None:
            raise ValueError(
                f"the length model has no forest for model {model!r}; "
                f"it was fitted for {', '.join(self.models)}"
            )
        return forest

    def predict_features(self, features: WorkflowFeatures, model: str) -> float:
        """ŷ in tokens (>= 0) for features on ``model``."""
        forest = self._forest(model)
        return max(0.0, math.expm1(forest.predict_one(self.encoder.encode(features))))

    def predict(self, request: Request, model: str) -> float:
        """ŷ for a request about to run on ``model``: called once per request by the router."""
        return self.predict_features(WorkflowFeatures.from_request(request), model)

    def predict_many(self, requests: Sequence[Request], model: str) -> list[float]:
        """:meth:`predict` of each request on ``model``, in order (one batched forest pass)."""
        return self.predict_rows_of([WorkflowFeatures.from_request(r) for r in requests], model)

    def predict_rows_of(self, features: Sequence[WorkflowFeatures], model: str) -> list[float]:
        """ŷ of each features entry on ``model``, batched."""
        forest = self._forest(model)
        if not features:
            return []
        matrix = np.stack([self.encoder.encode(f) for f in features])
        return [max(0.0, math.expm1(float(v))) for v in forest.predict(matrix)]


def fit_encoder(
    rows: Sequence[OutcomeRow],
    *,
    seed: int,
    svd_components: int,
    max_features: int,
    min_df: int,
) -> LengthFeatureEncoder:
    """The workflow kinds, TF-IDF vocabulary and SVD projection of the rows' user text."""
    from sklearn.decomposition import TruncatedSVD

    if svd_components < 1:
        raise ValueError(f"svd_components must be >= 1, got {svd_components}")
    texts = [WorkflowFeatures.from_row(row).user_text for row in rows]
    vectorizer, matrix = fit_vectorizer(texts, max_features=max_features, min_df=min_df)
    sketch = TfidfSketch.from_vectorizer(vectorizer)
    num_components = min(svd_components, sketch.num_columns - 1)
    if num_components >= 1:
        svd = TruncatedSVD(n_components=num_components, random_state=seed)
        svd.fit(matrix)
        projection = np.ascontiguousarray(svd.components_.T, dtype=np.float64)
    else:
        projection = np.zeros((sketch.num_columns, 0), dtype=np.float64)
    workflows = tuple(sorted({row.workflow for row in rows}))
    return LengthFeatureEncoder(workflows=workflows, sketch=sketch, projection=projection)


def fit_length(
    rows: Sequence[OutcomeRow],
    *,
    seed: int = 0,
    quantile: float = 0.5,
    num_trees: int = 64,
    min_samples_leaf: int = 10,
    max_tree_depth: int = 16,
    split_feature_fraction: float = 0.5,
    svd_components: int = 24,
    max_features: int = 20_000,
    min_df: int = 2,
) -> RemainingLengthModel:
    """Fit one quantile forest per model on ``remaining_output_tokens``; deterministic per seed.

    Defaults were chosen on the ``agent-workflows`` generator (4,000 workflows,
    20% held out): 64 trees of depth <= 16, leaves of >= 10 rows and half the
    features tried per split reach a Kendall-tau distance of ~0.21, within
    0.005 of 128 unbounded trees, with 16 steps per prediction and a fit 3x
    faster. ``max_samples_leaf=1`` (the library's default) keeps one target
    per leaf, which :class:`FlatForest` needs.

    Raises ``ValueError`` for a quantile outside (0, 1), a model with fewer than
    ``MIN_ROWS_PER_MODEL`` rows (naming it) or no text at all.
    """
    from quantile_forest import (  # type: ignore[import-untyped]
        RandomForestQuantileRegressor,
    )

    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    for name, value in (
        ("num_trees", num_trees),
        ("min_samples_leaf", min_samples_leaf),
        ("max_tree_depth", max_tree_depth),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not 0.0 < split_feature_fraction <= 1.0:
        raise ValueError(f"split_feature_fraction must be in (0, 1], got {split_feature_fraction}")
    models = models_of(rows)
    if not models:
        raise ValueError("no outcome rows to fit a length model on")
    for model in models:
        count = sum(row.model == model for row in rows)
        if count < MIN_ROWS_PER_MODEL:
            raise ValueError(
                f"model {model!r}: {count} outcome rows; need at least {MIN_ROWS_PER_MODEL}"
            )
    encoder = fit_encoder(
        rows, seed=seed, svd_components=svd_components, max_features=max_features, min_df=min_df
    )
    forests: dict[str, FlatForest] = {}
    for model in models:
        mine = [row for row in rows if row.model == model]
        matrix = np.stack([encoder.encode(WorkflowFeatures.from_row(row)) for row in mine])
        target = np.log1p([row.remaining_output_tokens for row in mine])
        forest = RandomForestQuantileRegressor(
            n_estimators=num_trees,
            min_samples_leaf=min_samples_leaf,
            max_depth=max_tree_depth,
            max_features=split_feature_fraction,
            max_samples_leaf=1,
            default_quantiles=quantile,
            n_jobs=1,
            random_state=seed,
        )
        forest.fit(matrix, target)
        forests[model] = FlatForest.from_quantile_forest(forest, quantile)
    return RemainingLengthModel(models=models, encoder=encoder, forests=forests, quantile=quantile)


def kendall_tau_distance(
    predicted: Sequence[float] | npt.NDArray[Any], true: Sequence[float] | npt.NDArray[Any]
) -> float:
    """The fraction of pairs a schedule by ``predicted`` puts in the wrong order, in [0, 1].

    Over the pairs whose ``true`` values differ (a pair tied in truth is right
    in either order), a pair ordered the other way by ``predicted`` counts 1
    and a pair tied in ``predicted`` counts 1/2 (what a random tie-break
    inverts on average). 0 is the oracle order, 1/2 a random one, 1 the
    reverse. Without ties it equals ``(1 - tau) / 2`` (Kendall's tau); with
    ties it is computed from ``scipy.stats.kendalltau``'s tau-b and the tie
    counts, in O(n log n). Raises ``ValueError`` for sequences of unequal
    length or when no pair's true values differ.
    """
    from scipy.stats import kendalltau

    x = np.asarray(predicted, dtype=np.float64)
    y = np.asarray(true, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"predicted and true must be equal-length 1-D, got {x.shape}, {y.shape}")
    num_pairs = len(x) * (len(x) - 1) // 2
    x_ties, y_ties, both_ties = (_tied_pairs(*a) for a in ((x,), (y,), (x, y)))
    counted = num_pairs - y_ties  # pairs whose truth differs
    if counted == 0:
        raise ValueError(f"no pair of the {len(y)} true values differs: the order is undefined")
    predicted_ties = x_ties - both_ties  # tied in prediction, not in truth
    if x_ties == num_pairs:
        return 0.5
    tau_b = float(kendalltau(x, y, variant="b").statistic)
    concordant_minus_discordant = tau_b * math.sqrt((num_pairs - x_ties) * counted)
    discordant = (counted - predicted_ties - concordant_minus_discordant) / 2.0
    return min(1.0, max(0.0, (discordant + predicted_ties / 2.0) / counted))


def _tied_pairs(*columns: FloatArray) -> int:
    """Pairs of positions equal in every column."""
    _, counts = np.unique(np.stack(columns, axis=1), axis=0, return_counts=True)
    return int((counts * (counts - 1) // 2).sum())
