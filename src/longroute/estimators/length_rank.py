"""The LTR baseline's ranker: shortest-job-first by a learned order of output lengths.

Fu et al. (2024, "Efficient LLM scheduling by learning to rank") schedule a
queue by a model trained to *rank* requests by their output length, not to
predict it. Chimera compares against it: the ranker sees each request alone
(its own stage's output, no workflow totals, no confidence).

Here the ranker is a linear RankNet: a logistic regression on feature
*differences* of request pairs, ``P(i longer than j) = σ(w·(x_i − x_j))``,
fitted on pairs sampled among the rows of the same model (the requests one
engine's queue would hold), pairs of equal output length left out. Linear, so
a request's score is ``w·x`` and sorting by it is the learned order. The
features are those of Chimera's length predictor that are not workflow
totals, in a form a linear model can use: log token counts (system, user,
prompt), the stage number, one-hots of the workflow kind and of (workflow
kind, stage), and the full TF-IDF of the user text (word 1-2-grams) rather
than an SVD sketch, so words that signal a long answer get their own weight.

A pairwise linear ranker was chosen over a regression on log length because
it optimises the quantity a scheduler uses (the order), is what "learning to
rank" means in Fu et al., and is cheap: :meth:`LengthRanker.score` is one
sparse dot product after the plain-Python TF-IDF transform.
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

MIN_PAIRS = 10
"""Fewest usable pairs (rows of one model with different output lengths) the fit accepts."""


@dataclass(frozen=True, slots=True, eq=False)
class LengthRanker:
    """Scores requests so that a higher score means a longer predicted own-stage output.

    Dense weights: log system, user and prompt tokens, stage, then one per
    ``workflows`` entry, then one per ``workflow_stages`` entry; ``text_weights``
    one per vocabulary column of ``sketch``. ``models`` lists the models whose
    rows it was fitted on (it scores requests the same for all of them).
    """

    models: tuple[str, ...]
    workflows: tuple[str, ...]
    workflow_stages: tuple[tuple[str, int], ...]
    sketch: TfidfSketch
    dense_weights: FloatArray
    text_weights: FloatArray

    def dense_features(self, features: WorkflowFeatures) -> FloatArray:
        """The non-text feature row of one request (see the class doc)."""
        row = np.zeros(4 + len(self.workflows) + len(self.workflow_stages), dtype=np.float64)
        row[0] = math.log1p(features.num_system_tokens)
        row[1] = math.log1p(features.num_user_tokens)
        row[2] = math.log1p(features.num_prompt_tokens)
        row[3] = features.stage if features.stage is not None else 0
        if features.workflow in self.workflows:
            row[4 + self.workflows.index(features.workflow)] = 1.0
        if features.workflow is not None and features.stage is not None:
            key = (features.workflow, features.stage)
            if key in self.workflow_stages:
                row[4 + len(self.workflows) + self.workflow_stages.index(key)] = 1.0
        return row

    def score_features(self, features: WorkflowFeatures) -> float:
        """``w·x`` of features: higher is longer."""
        columns, values = self.sketch.transform(features.user_text)
        text = float(values @ self.text_weights[columns]) if len(columns) else 0.0
        return float(self.dense_features(features) @ self.dense_weights) + text

    def score(self, request: Request) -> float:
        """The rank score of a request: higher means a longer predicted output."""
        return self.score_features(WorkflowFeatures.from_request(request))

    def score_many(self, requests: Sequence[Request]) -> list[float]:
        """:meth:`score` of each request, in order."""
        return [self.score(request) for request in requests]


def _sample_pairs(
    lengths: np.ndarray, rng: np.random.Generator, max_pairs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``max_pairs`` random (i, j) index pairs with different lengths."""
    n = len(lengths)
    first = rng.integers(0, n, size=max_pairs)
    second = rng.integers(0, n, size=max_pairs)
    keep = lengths[first] != lengths[second]
    return first[keep], second[keep]


def fit_ranker(
    rows: Sequence[OutcomeRow],
    *,
    seed: int = 0,
    regularization_c: float = 0.3,
    max_pairs_per_model: int = 20_000,
    max_features: int = 20_000,
    min_df: int = 2,
) -> LengthRanker:
    """Fit the pairwise ranker on rows' own ``output_tokens``; deterministic per seed.

    ``max_pairs_per_model`` random pairs are drawn per model (those of equal
    length dropped); on the ``agent-workflows`` generator 20,000 pairs and
    ``regularization_c`` 0.3 rank as well as 50,000 (Kendall-tau distance
    ~0.19 on held-out workflows) at a third of the fit time. Raises
    ``ValueError`` when fewer than ``MIN_PAIRS`` usable pairs exist.
    """
    from scipy.sparse import csr_matrix, hstack
    from sklearn.linear_model import LogisticRegression

    if not regularization_c > 0:
        raise ValueError(f"regularization_c must be > 0, got {regularization_c}")
    models = models_of(rows)
    if not models:
        raise ValueError("no outcome rows to fit a ranker on")
    features = [WorkflowFeatures.from_row(row) for row in rows]
    vectorizer, text_matrix = fit_vectorizer(
        [f.user_text for f in features], max_features=max_features, min_df=min_df
    )
    shell = LengthRanker(
        models=models,
        workflows=tuple(sorted({row.workflow for row in rows})),
        workflow_stages=tuple(sorted({(row.workflow, row.stage) for row in rows})),
        sketch=TfidfSketch.from_vectorizer(vectorizer),
        dense_weights=np.zeros(0),
        text_weights=np.zeros(0),
    )
    dense = csr_matrix(np.stack([shell.dense_features(f) for f in features]))
    matrix = hstack([dense, text_matrix], format="csr")
    lengths = np.asarray([row.output_tokens for row in rows], dtype=np.int64)
    row_models = np.asarray([row.model for row in rows])
    rng = np.random.default_rng(seed)
    firsts, seconds = [], []
    for model in models:
        mine = np.flatnonzero(row_models == model)
        i, j = _sample_pairs(lengths[mine], rng, max_pairs_per_model)
        firsts.append(mine[i])
        seconds.append(mine[j])
    first, second = np.concatenate(firsts), np.concatenate(seconds)
    if len(first) < MIN_PAIRS:
        raise ValueError(
            f"{len(first)} pairs of rows with different output lengths; the ranker needs "
            f"at least {MIN_PAIRS} (give more rows, or rows whose lengths differ)"
        )
    labels = (lengths[first] > lengths[second]).astype(np.int64)
    if labels.min() == labels.max():
        raise ValueError("every sampled pair has the same order; give more varied rows")
    head = LogisticRegression(
        C=regularization_c, fit_intercept=False, max_iter=2000, random_state=seed
    )
    head.fit(matrix[first] - matrix[second], labels)
    weights = np.asarray(head.coef_[0], dtype=np.float64)
    num_dense = dense.shape[1]
    return LengthRanker(
        models=shell.models,
        workflows=shell.workflows,
        workflow_stages=shell.workflow_stages,
        sketch=shell.sketch,
        dense_weights=weights[:num_dense].copy(),
        text_weights=weights[num_dense:].copy(),
    )
