"""Files of Chimera's fitted predictors: confidence, remaining length and the LTR ranker.

One joblib file holds a header and the fitted model object::

    {"header": {"format": "longroute-workflow-model", "kind": "confidence",
                "format_version": 1, "longroute_version": "0.1.0",
                "models": ["qwen2.5-1.5b", "qwen2.5-7b"],
                "layout": {"ConfidenceModel": ["models", "sketch", ...], ...}},
     "model": ConfidenceModel(...)}

``kind`` is ``confidence``, ``length`` or ``ranker``. Loading checks, before
anything is used, that the file exists, unpickles, carries this header, is of
the kind asked for, of a format version this longroute reads and of the same
class layout (field names) as this longroute's classes; each failure
raises ``FileNotFoundError`` or ``ValueError`` naming the path and what was
expected. The fitted objects hold only numpy arrays, tuples and dicts
(no scikit-learn objects), so a file outlives a scikit-learn upgrade.

joblib files are pickles: loading one runs code chosen by whoever wrote it.
Load only files you fitted yourself or otherwise trust.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from longroute import __version__
from longroute.estimators.confidence import ConfidenceModel
from longroute.estimators.flat_forest import FlatForest
from longroute.estimators.length_rank import LengthRanker
from longroute.estimators.workflow_length import LengthFeatureEncoder, RemainingLengthModel
from longroute.features.text_sketch import TfidfSketch

MODEL_FORMAT = "longroute-workflow-model"
FORMAT_VERSION = 1
"""Bumped when a fitted object's fields change; older longroutes refuse newer files."""

WorkflowModel = ConfidenceModel | RemainingLengthModel | LengthRanker

KINDS: dict[str, type] = {
    "confidence": ConfidenceModel,
    "length": RemainingLengthModel,
    "ranker": LengthRanker,
}

_PARTS = (*KINDS.values(), TfidfSketch, LengthFeatureEncoder, FlatForest)


def layout() -> dict[str, list[str]]:
    """Field names of every class a model file pickles: a file whose layout differs was
    written by another version of these classes and is refused, not misread."""
    return {cls.__name__: [f.name for f in fields(cls)] for cls in _PARTS}


def kind_of(model: WorkflowModel) -> str:
    """``confidence``, ``length`` or ``ranker``; ``TypeError`` for anything else."""
    for kind, cls in KINDS.items():
        if isinstance(model, cls):
            return kind
    raise TypeError(
        f"cannot save a {type(model).__name__}: expected one of "
        f"{', '.join(cls.__name__ for cls in KINDS.values())}"
    )


def save_model(model: WorkflowModel, path: Path) -> None:
    """Write ``model`` with its header to ``path`` (joblib, compressed); ``OSError`` passes."""
    import joblib  # type: ignore[import-untyped]

    header = {
        "format": MODEL_FORMAT,
        "kind": kind_of(model),
        "format_version": FORMAT_VERSION,
        "longroute_version": __version__,
        "models": list(model.models),
        "layout": layout(),
    }
    joblib.dump({"header": header, "model": model}, path, compress=3)


def _load(path: Path, kind: str) -> Any:
    import joblib

    expected = f"a longroute {kind} model file (`longroute fit {_COMMAND[kind]}` writes one)"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file; expected {expected}")
    try:
        payload = joblib.load(path)
    except (OSError, MemoryError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc}); expected {expected}") from None
    except Exception as exc:  # corrupt or foreign pickles fail in many ways
        raise ValueError(
            f"{path}: not a readable joblib file ({type(exc).__name__}: {exc}"[:300]
            + f"); expected {expected}"
        ) from None
    header = payload.get("header") if isinstance(payload, dict) else None
    if not isinstance(header, dict) or header.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path}: no longroute model header; expected {expected}")
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: format version {version!r} written by longroute "
            f"{header.get('longroute_version')}; this longroute ({__version__}) reads versions "
            f"up to {FORMAT_VERSION}: upgrade longroute or refit the file"
        )
    if header.get("kind") != kind:
        raise ValueError(f"{path}: holds a {header.get('kind')!r} model; expected {expected}")
    if header.get("layout") != layout():
        raise ValueError(
            f"{path}: written by longroute {header.get('longroute_version')} with other fields "
            f"in its model classes than this longroute ({__version__}) has; refit it"
        )
    model = payload.get("model")
    if not isinstance(model, KINDS[kind]):
        raise ValueError(
            f"{path}: its model is a {type(model).__name__}, not a {KINDS[kind].__name__}; "
            f"expected {expected}"
        )
    return model


_COMMAND = {"confidence": "confidence", "length": "length", "ranker": "ltr"}


def load_confidence(path: Path) -> ConfidenceModel:
    """The :class:`ConfidenceModel` in ``path`` (see the module doc for the errors)."""
    model: ConfidenceModel = _load(path, "confidence")
    return model


def load_length(path: Path) -> RemainingLengthModel:
    """The :class:`RemainingLengthModel` in ``path``."""
    model: RemainingLengthModel = _load(path, "length")
    return model


def load_ranker(path: Path) -> LengthRanker:
    """The :class:`LengthRanker` in ``path``."""
    model: LengthRanker = _load(path, "ranker")
    return model


def check_models(model: WorkflowModel, fleet_models: Iterable[str], path: Path) -> None:
    """Raise ``ValueError`` naming the fleet's models that ``model`` (read from ``path``) lacks.

    A ranker scores requests the same for every model, so it lacks none.
    """
    if isinstance(model, LengthRanker):
        return
    missing = sorted(set(fleet_models) - set(model.models))
    if missing:
        raise ValueError(
            f"{path}: the {kind_of(model)} model has no {', '.join(missing)} "
            f"(it was fitted for {', '.join(model.models)}); refit it on outcomes of every "
            "model in the fleet"
        )
