"""Frozen router weights as a small YAML file, written after tuning and read for evaluation.

File shape::

    router: gorgo
    weights: {rtt_weight: 0.276, queue_weight: 0.5}
    objective: mix
    tuned_on: {scenario: gorgo, window: full, seed: 0, num_steps: 40}

Read once at start-up; never on a request path.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from longroute.errors import yaml_error_message

_KEYS = ("router", "weights", "objective", "tuned_on")


class WeightsFileError(ValueError):
    """A weights file is missing, malformed or holds invalid weights; the message names the file."""


@dataclass(frozen=True, slots=True)
class FrozenWeights:
    """Weights of one router, fixed after tuning, and how they were obtained.

    ``tuned_on`` is free-form provenance (scenario, window, seed, num_steps,
    bounds, ...) and must hold only YAML-safe values.
    """

    router: str
    weights: dict[str, float]
    objective: str | None = None
    tuned_on: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.router, str) or not self.router:
            raise ValueError(f"router must be a non-empty string, got {self.router!r}")
        if not self.weights:
            raise ValueError(f"router {self.router!r}: weights are empty")
        for name, value in self.weights.items():
            _check_weight(name, value)


def _check_weight(name: object, value: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"weight name must be a non-empty string, got {name!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"weight {name!r} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"weight {name!r} must be finite and > 0, got {value!r}")


def save_weights(frozen: FrozenWeights, path: Path) -> None:
    """Write ``frozen`` to ``path`` as YAML, atomically (parent folders are created)."""
    data: dict[str, Any] = {
        "router": frozen.router,
        "weights": {name: float(value) for name, value in frozen.weights.items()},
        "objective": frozen.objective,
        "tuned_on": dict(frozen.tuned_on),
    }
    try:
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    except yaml.YAMLError as exc:
        raise WeightsFileError(f"{path}: tuned_on holds a value YAML cannot store: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    # atomically: a reader (a gateway reloading, a simulate --weights) sees the old file
    # or the new one, never half of one
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load_weights(path: Path) -> FrozenWeights:
    """Read a weights file; :class:`WeightsFileError` naming the file and the problem."""
    if not path.is_file():
        raise WeightsFileError(f"{path}: weights file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise WeightsFileError(yaml_error_message(path, exc)) from exc
    if not isinstance(data, dict):
        raise WeightsFileError(
            f"{path}: expected a mapping at top level, got {type(data).__name__}"
        )
    unknown = sorted(str(key) for key in data if key not in _KEYS)
    if unknown:
        raise WeightsFileError(f"{path}: unknown keys {unknown}; valid keys: {list(_KEYS)}")
    for key in ("router", "weights"):
        if key not in data:
            raise WeightsFileError(f"{path}: missing required key {key!r}")
    weights = data["weights"]
    if not isinstance(weights, dict):
        raise WeightsFileError(f"{path}: 'weights' must be a mapping of name to number")
    objective = data.get("objective")
    if objective is not None and not isinstance(objective, str):
        raise WeightsFileError(f"{path}: 'objective' must be a string, got {objective!r}")
    tuned_on = data.get("tuned_on")
    if tuned_on is None:
        tuned_on = {}
    if not isinstance(tuned_on, dict):
        raise WeightsFileError(f"{path}: 'tuned_on' must be a mapping, got {tuned_on!r}")
    try:
        return FrozenWeights(
            router=data["router"],
            weights={name: float(value) for name, value in _checked(weights).items()},
            objective=objective,
            tuned_on=tuned_on,
        )
    except ValueError as exc:
        raise WeightsFileError(f"{path}: {exc}") from exc


def _checked(weights: dict[Any, Any]) -> dict[Any, Any]:
    for name, value in weights.items():
        _check_weight(name, value)
    return weights
