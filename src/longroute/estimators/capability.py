"""LAAR's capability model Q(m, x): P(model m answers request x correctly).

Per model, a logistic regression over one-hot features of the request:

    logit Q = intercept + language[l] + bucket[b] + task[t] + language_bucket[l][b]

``b`` is the request's length bucket (upper edge, see ``features.length``);
``language_bucket`` exists only when the model was fitted with interactions.
A language or task the model was not fitted on (or None) contributes nothing,
which gives the model's average over the languages (tasks) it has seen: the
fit centres each one-hot group around zero.
A bucket with no coefficient (no outcomes at that length) borrows the nearest
bucket that has one (ties go to the longer bucket, the cautious side, since
accuracy falls with length): a 100K-token request scored by a model fitted up
to 64K uses the 64K coefficients rather than the all-length average.

Coefficients come from :func:`longroute.estimators.capability_fit.fit_capability`
(offline, scikit-learn) and travel as JSON (:func:`save_capability`,
:func:`load_capability`). Evaluating Q is pure Python: the constructor folds
intercept, language, bucket and interaction terms into one logit per
(model, language, bucket); :meth:`CapabilityModel.probability` is a bisect,
three dict lookups and one ``math.exp`` -- O(log #buckets), no allocation.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longroute.features.length import check_bucket_edges
from longroute.types import Language

CAPABILITY_FORMAT = "longroute-capability"
CAPABILITY_VERSION = 1

_LANGUAGES = ", ".join(v.value for v in Language)


@dataclass(frozen=True, slots=True)
class ModelCoefficients:
    """One model's logistic-regression coefficients (logit scale).

    ``bucket`` and ``language_bucket`` are keyed by bucket upper edge in tokens.
    """

    intercept: float
    language: Mapping[Language, float] = field(default_factory=dict)
    bucket: Mapping[int, float] = field(default_factory=dict)
    task: Mapping[str, float] = field(default_factory=dict)
    language_bucket: Mapping[Language, Mapping[int, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CapabilityModel:
    """Q(m, x) for a set of models; immutable, built once, read on every routing call.

    ``coefficients`` maps a model name to its :class:`ModelCoefficients`; every
    bucket key must be one of ``bucket_edges_tokens``. ``is_interactions`` records
    whether the fit had language x bucket columns. Memory: one float per
    (model, language seen + 1, bucket edge), built in ``__post_init__``.
    """

    bucket_edges_tokens: tuple[int, ...]
    coefficients: Mapping[str, ModelCoefficients]
    is_interactions: bool = True
    # derived: model -> language (None = unseen) -> logit per bucket index
    _logits: dict[str, dict[Language | None, tuple[float, ...]]] = field(
        init=False, repr=False, compare=False
    )
    _task_logits: dict[str, Mapping[str, float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        edges = check_bucket_edges(self.bucket_edges_tokens)
        object.__setattr__(self, "bucket_edges_tokens", edges)
        logits: dict[str, dict[Language | None, tuple[float, ...]]] = {}
        for model, coef in self.coefficients.items():
            _check_buckets(model, coef, edges)
            logits[model] = _fold(coef, edges)
        object.__setattr__(self, "_logits", logits)
        object.__setattr__(self, "_task_logits", {m: c.task for m, c in self.coefficients.items()})

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.coefficients)

    @property
    def tasks(self) -> frozenset[str]:
        """The tasks the fit saw (a task coefficient of any model); empty if it saw none."""
        return frozenset(t for c in self.coefficients.values() for t in c.task)

    def probability(
        self, model: str, language: Language | None, num_prompt_tokens: int, task: str | None
    ) -> float | None:
        """Q(model, request); None when ``model`` is unknown to this capability model.

        Called by the LAAR router once per candidate endpoint per routing call.
        """
        by_language = self._logits.get(model)
        if by_language is None:
            return None
        row = by_language.get(language)
        if row is None:
            row = by_language[None]
        index = bisect_left(self.bucket_edges_tokens, num_prompt_tokens)
        z = row[index] if index < len(row) else row[-1]
        if task is not None:
            z += self._task_logits[model].get(task, 0.0)
        if z >= 0.0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)  # no overflow for very negative logits
        return e / (1.0 + e)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see docs/laar.md, "Capability file")."""
        return {
            "format": CAPABILITY_FORMAT,
            "version": CAPABILITY_VERSION,
            "bucket_edges_tokens": list(self.bucket_edges_tokens),
            "is_interactions": self.is_interactions,
            "models": {m: _coef_to_dict(c) for m, c in self.coefficients.items()},
        }

    @classmethod
    def from_dict(cls, data: Any, source: str) -> CapabilityModel:
        """Parse :meth:`to_dict` output; ValueError names ``source`` and the bad field."""
        try:
            return _parse(data)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None


def load_capability(path: str | Path) -> CapabilityModel:
    """Read a capability JSON file; ValueError naming the file on any bad input."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read capability file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return CapabilityModel.from_dict(data, str(path))


def save_capability(model: CapabilityModel, path: str | Path) -> None:
    """Write ``model`` as indented JSON (overwrites ``path``)."""
    Path(path).write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")


def _check_buckets(model: str, coef: ModelCoefficients, edges: tuple[int, ...]) -> None:
    keys = set(coef.bucket)
    for by_bucket in coef.language_bucket.values():
        keys.update(by_bucket)
    bad = sorted(keys.difference(edges))
    if bad:
        raise ValueError(
            f"model {model!r}: bucket(s) {bad} are not bucket edges (edges: {list(edges)})"
        )


def _nearest_fitted(edges: tuple[int, ...], fitted: Mapping[int, float]) -> list[int | None]:
    """Per edge index, the fitted edge to use: itself, else the nearest (ties: longer)."""
    fitted_indices = [i for i, e in enumerate(edges) if e in fitted]
    if not fitted_indices:
        return [None] * len(edges)
    return [edges[min(fitted_indices, key=lambda j: (abs(j - i), -j))] for i in range(len(edges))]


def _fold(
    coef: ModelCoefficients, edges: tuple[int, ...]
) -> dict[Language | None, tuple[float, ...]]:
    """Intercept + language + bucket + interaction, per language (None too) and bucket."""
    effective = _nearest_fitted(edges, coef.bucket)
    folded: dict[Language | None, tuple[float, ...]] = {}
    for language in (None, *coef.language):
        lang_term = coef.language.get(language, 0.0) if language is not None else 0.0
        inter = coef.language_bucket.get(language, {}) if language is not None else {}
        row = []
        for edge in effective:
            z = coef.intercept + lang_term
            if edge is not None:
                z += coef.bucket[edge] + inter.get(edge, 0.0)
            row.append(z)
        folded[language] = tuple(row)
    return folded


def _coef_to_dict(coef: ModelCoefficients) -> dict[str, Any]:
    return {
        "intercept": coef.intercept,
        "language": {lang.value: w for lang, w in coef.language.items()},
        "bucket": {str(edge): w for edge, w in coef.bucket.items()},
        "task": dict(coef.task),
        "language_bucket": {
            lang.value: {str(edge): w for edge, w in by_bucket.items()}
            for lang, by_bucket in coef.language_bucket.items()
        },
    }


def _parse(data: Any) -> CapabilityModel:
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object at the top level")
    if data.get("format") != CAPABILITY_FORMAT:
        raise ValueError(
            f"field 'format' must be {CAPABILITY_FORMAT!r}, got {data.get('format')!r}"
        )
    if data.get("version") != CAPABILITY_VERSION:
        raise ValueError(
            f"field 'version': unsupported version {data.get('version')!r} "
            f"(this longroute reads version {CAPABILITY_VERSION})"
        )
    raw_edges = data.get("bucket_edges_tokens")
    if not isinstance(raw_edges, list) or not all(_is_int(e) for e in raw_edges):
        raise ValueError("field 'bucket_edges_tokens' must be a list of integers")
    try:
        edges = check_bucket_edges(raw_edges)
    except ValueError as exc:
        raise ValueError(f"field 'bucket_edges_tokens': {exc}") from None
    is_interactions = data.get("is_interactions")
    if not isinstance(is_interactions, bool):
        raise ValueError("field 'is_interactions' must be true or false")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError("field 'models' must be a non-empty object (model name -> coefficients)")
    coefficients = {str(m): _parse_coef(c, f"models.{m}", edges) for m, c in models.items()}
    return CapabilityModel(edges, coefficients, is_interactions)


def _parse_coef(raw: Any, where: str, edges: tuple[int, ...]) -> ModelCoefficients:
    if not isinstance(raw, dict):
        raise ValueError(f"field '{where}' must be an object")
    unknown = sorted(set(raw) - {"intercept", "language", "bucket", "task", "language_bucket"})
    if unknown:
        raise ValueError(
            f"field '{where}': unknown key(s) {unknown} "
            "(valid: intercept, language, bucket, task, language_bucket)"
        )
    language_bucket = {
        _language(k, f"{where}.language_bucket"): _buckets(v, f"{where}.language_bucket.{k}", edges)
        for k, v in _object(raw.get("language_bucket", {}), f"{where}.language_bucket").items()
    }
    return ModelCoefficients(
        intercept=_float(raw.get("intercept"), f"{where}.intercept"),
        language={
            _language(k, f"{where}.language"): _float(v, f"{where}.language.{k}")
            for k, v in _object(raw.get("language", {}), f"{where}.language").items()
        },
        bucket=_buckets(raw.get("bucket", {}), f"{where}.bucket", edges),
        task={
            str(k): _float(v, f"{where}.task.{k}")
            for k, v in _object(raw.get("task", {}), f"{where}.task").items()
        },
        language_bucket=language_bucket,
    )


def _buckets(raw: Any, where: str, edges: tuple[int, ...]) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in _object(raw, where).items():
        edge = int(key) if key.isdigit() else None
        if edge is None or edge not in edges:
            raise ValueError(
                f"field '{where}': {key!r} is not a bucket edge (edges: {list(edges)})"
            )
        out[edge] = _float(value, f"{where}.{key}")
    return out


def _object(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"field '{where}' must be an object")
    return raw


def _language(key: str, where: str) -> Language:
    try:
        return Language(key)
    except ValueError:
        raise ValueError(
            f"field '{where}': unknown language {key!r} (valid: {_LANGUAGES})"
        ) from None


def _float(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ValueError(f"field '{where}' must be a finite number, got {raw!r}")
    return float(raw)


def _is_int(raw: Any) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool)
