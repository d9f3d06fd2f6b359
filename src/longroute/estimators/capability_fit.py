"""Offline fitting of LAAR's capability model Q(m, x) from observed outcomes.

Input: :class:`Outcome` records (one per request x model attempt, JSONL on
disk, format in docs/laar.md). Output: a :class:`CapabilityModel` (pure
Python, see ``estimators.capability``). Used by ``longroute fit capability``
and by tests/experiments; never on the routing path. scikit-learn and numpy
are imported inside :func:`fit_capability`, so importing this module is cheap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longroute.estimators.capability import CapabilityModel, ModelCoefficients
from longroute.features.length import (
    DEFAULT_BUCKET_EDGES_TOKENS,
    check_bucket_edges,
    length_bucket,
)
from longroute.types import Language

_LANGUAGES = ", ".join(v.value for v in Language)
_LANGUAGE_ORDER = {lang: i for i, lang in enumerate(Language)}

# (language, bucket edge, task) -> [num_wrong, num_correct]
_Cells = dict[tuple[Language | None, int, str | None], list[int]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Whether ``model`` answered one request correctly."""

    model: str
    language: Language | None
    num_prompt_tokens: int
    task: str | None
    is_correct: bool
    query_id: str | None = None


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """Observed rate vs fitted Q for one (model, language, length bucket) cell."""

    model: str
    language: Language | None
    bucket_edge_tokens: int
    num_outcomes: int
    observed_rate: float
    fitted_probability: float  # mean of Q over the cell's outcomes (tasks may differ)


def read_outcomes(path: str | Path) -> list[Outcome]:
    """Read a JSONL outcomes file; ValueError ``FILE:LINE: ...`` naming the bad field.

    Blank lines are skipped; keys other than the documented ones are ignored.
    """
    path = Path(path)
    outcomes: list[Outcome] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for line_number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    outcomes.append(_parse_outcome(line))
                except ValueError as exc:
                    raise ValueError(f"{path}:{line_number}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read outcomes file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not outcomes:
        raise ValueError(f"{path}: no outcomes (the file is empty; expected one JSON per line)")
    return outcomes


def write_outcomes(outcomes: Iterable[Outcome], path: str | Path) -> None:
    """Write ``outcomes`` as JSONL (overwrites ``path``); :func:`read_outcomes` reads it back."""
    with Path(path).open("w", encoding="utf-8") as out:
        for o in outcomes:
            row: dict[str, Any] = {
                "model": o.model,
                "language": o.language.value if o.language is not None else None,
                "num_prompt_tokens": o.num_prompt_tokens,
                "task": o.task,
                "is_correct": o.is_correct,
            }
            if o.query_id is not None:
                row["query_id"] = o.query_id
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def fit_capability(
    outcomes: Iterable[Outcome],
    *,
    bucket_edges_tokens: Iterable[int] = DEFAULT_BUCKET_EDGES_TOKENS,
    is_interactions: bool = True,
    regularization_c: float = 10.0,
) -> CapabilityModel:
    """Fit Q(m, x): per model, an L2 logistic regression (lbfgs, ``C=regularization_c``).

    Features are one-hot: language, length bucket (upper edge), task, and with
    ``is_interactions`` language x bucket; the intercept is not penalised.
    Each one-hot group is then centred (its mean moved into the intercept, or
    into the language term for interactions), which changes no fitted cell
    but makes an unknown or None language/task score as the average one.
    Identical feature rows are merged into weighted rows, so the fit costs
    O(#outcomes) to count plus a regression over at most 2 x #cells rows.
    A model whose outcomes are all correct (or all wrong) has nothing for a
    classifier to separate: it gets an intercept only, the logit of the
    smoothed rate (num_correct + 0.5) / (num_outcomes + 1), and no other term.
    """
    edges = check_bucket_edges(tuple(bucket_edges_tokens))
    if not (math.isfinite(regularization_c) and regularization_c > 0.0):
        raise ValueError(f"regularization_c must be a positive number, got {regularization_c}")
    by_model: dict[str, _Cells] = {}
    for o in outcomes:
        cells = by_model.setdefault(o.model, {})
        key = (o.language, length_bucket(o.num_prompt_tokens, edges), o.task)
        cells.setdefault(key, [0, 0])[1 if o.is_correct else 0] += 1
    if not by_model:
        raise ValueError("no outcomes to fit")
    coefficients = {
        model: _fit_model(cells, is_interactions, regularization_c)
        for model, cells in by_model.items()
    }
    return CapabilityModel(edges, coefficients, is_interactions)


def calibration(capability: CapabilityModel, outcomes: Iterable[Outcome]) -> list[CalibrationRow]:
    """Per (model, language, bucket) cell: count, observed rate and mean fitted Q.

    Rows are ordered by model (first appearance), language (enum order, None
    last), bucket. Outcomes of models unknown to ``capability`` are skipped.
    """
    edges = capability.bucket_edges_tokens
    sums: dict[tuple[str, Language | None, int], list[float]] = {}
    for o in outcomes:
        q = capability.probability(o.model, o.language, o.num_prompt_tokens, o.task)
        if q is None:
            continue
        acc = sums.setdefault(
            (o.model, o.language, length_bucket(o.num_prompt_tokens, edges)), [0, 0, 0]
        )
        acc[0] += 1
        acc[1] += o.is_correct
        acc[2] += q
    model_order = {m: i for i, m in enumerate(dict.fromkeys(k[0] for k in sums))}

    def order(key: tuple[str, Language | None, int]) -> tuple[int, int, int]:
        lang = len(_LANGUAGE_ORDER) if key[1] is None else _LANGUAGE_ORDER[key[1]]
        return (model_order[key[0]], lang, key[2])

    return [
        CalibrationRow(m, lang, edge, int(n), k / n, q / n)
        for (m, lang, edge), (n, k, q) in sorted(sums.items(), key=lambda kv: order(kv[0]))
    ]


def _fit_model(cells: _Cells, is_interactions: bool, c: float) -> ModelCoefficients:
    num_wrong = sum(w for w, _ in cells.values())
    num_correct = sum(k for _, k in cells.values())
    if num_wrong == 0 or num_correct == 0:
        rate = (num_correct + 0.5) / (num_correct + num_wrong + 1.0)
        return ModelCoefficients(intercept=math.log(rate / (1.0 - rate)))
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    columns: dict[tuple[Any, ...], int] = {}
    rows: list[list[int]] = []
    for language, edge, task in cells:
        active: list[tuple[Any, ...]] = [("bucket", edge)]
        if language is not None:
            active.append(("language", language))
            if is_interactions:
                active.append(("language_bucket", language, edge))
        if task is not None:
            active.append(("task", task))
        rows.append([columns.setdefault(name, len(columns)) for name in active])
    x = np.zeros((2 * len(rows), len(columns)))
    y = np.tile([0, 1], len(rows))
    weights = np.array([n for counts in cells.values() for n in counts], dtype=float)
    for i, active_columns in enumerate(rows):
        x[2 * i, active_columns] = 1.0
        x[2 * i + 1, active_columns] = 1.0
    keep = weights > 0
    fit = LogisticRegression(C=c, solver="lbfgs", max_iter=2000)
    fit.fit(x[keep], y[keep], sample_weight=weights[keep])
    return _coefficients(float(fit.intercept_[0]), fit.coef_[0].tolist(), columns, cells)


def _coefficients(
    intercept: float, weights: list[float], columns: dict[tuple[Any, ...], int], cells: _Cells
) -> ModelCoefficients:
    language: dict[Language, float] = {}
    bucket: dict[int, float] = {}
    task: dict[str, float] = {}
    language_bucket: dict[Language, dict[int, float]] = {}
    for name, index in sorted(columns.items(), key=lambda kv: _column_order(kv[0])):
        w = weights[index]
        if name[0] == "language":
            language[name[1]] = w
        elif name[0] == "bucket":
            bucket[name[1]] = w
        elif name[0] == "task":
            task[name[1]] = w
        else:
            language_bucket.setdefault(name[1], {})[name[2]] = w
    # Centre each one-hot group, moving its mean one level up. Where every row
    # has exactly one column of the group active this leaves every fitted cell
    # unchanged, and it makes "unknown language/task" mean "the average" (the
    # L2 penalty alone pins that down only loosely: lbfgs stops early).
    for lang, by_bucket in language_bucket.items():
        language[lang] += _centre(by_bucket)
    intercept += _centre(bucket)
    if all(lang is not None for lang, _, _ in cells):
        intercept += _centre(language)
    if all(t is not None for _, _, t in cells):
        intercept += _centre(task)
    return ModelCoefficients(intercept, language, bucket, task, language_bucket)


def _column_order(name: tuple[Any, ...]) -> tuple[Any, ...]:
    if name[0] in ("language", "language_bucket"):
        return (name[0], _LANGUAGE_ORDER[name[1]], *name[2:])
    return name


def _centre(group: dict[Any, float]) -> float:
    """Subtract the group's (unweighted) mean from each entry; return the mean."""
    if not group:
        return 0.0
    mean = sum(group.values()) / len(group)
    for key in group:
        group[key] -= mean
    return mean


def _parse_outcome(line: str) -> Outcome:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object")
    for name in ("model", "language", "num_prompt_tokens", "task", "is_correct"):
        if name not in raw:
            raise ValueError(f"missing field {name!r}")
    model = raw["model"]
    if not isinstance(model, str) or not model:
        raise ValueError(f"field 'model' must be a non-empty string, got {model!r}")
    tokens = raw["num_prompt_tokens"]
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"field 'num_prompt_tokens' must be an integer >= 0, got {tokens!r}")
    task = raw["task"]
    if task is not None and (not isinstance(task, str) or not task):
        raise ValueError(f"field 'task' must be a non-empty string or null, got {task!r}")
    is_correct = raw["is_correct"]
    if not isinstance(is_correct, bool):
        raise ValueError(f"field 'is_correct' must be true or false, got {is_correct!r}")
    query_id = raw.get("query_id")
    if query_id is not None and not isinstance(query_id, str):
        raise ValueError(f"field 'query_id' must be a string or null, got {query_id!r}")
    return Outcome(model, _parse_language(raw["language"]), tokens, task, is_correct, query_id)


def _parse_language(raw: Any) -> Language | None:
    if raw is None:
        return None
    try:
        return Language(raw)
    except ValueError:
        raise ValueError(
            f"field 'language': unknown language {raw!r} (valid: {_LANGUAGES}, or null)"
        ) from None
