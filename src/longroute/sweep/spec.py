"""The sweep spec: a grid over scenarios, routers, router parameters, loads, fleets and seeds.

A spec is a YAML file (documented in docs/sweeps.md) validated into
:class:`SweepSpec`; unknown keys are errors and messages name the file and
the field. ``seeds`` is a range string (``"0-9"``, ``"0-4,7"``) or a list of
integers. A router parameter whose value is a list is swept (one router
variant per combination, labelled ``gorgo(queue_weight=0.1)``); any other
value is fixed (write a list-valued fixed parameter as ``[[a, b]]``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from longroute.config import read_yaml, validate_mapping

MAX_SEEDS = 10_000
DEFAULT_METRICS = ("ttft_p95_s", "e2e_p95_s")
_RANGE = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0-4"`` -> (0, 1, 2, 3, 4); ``"0-2,7"`` -> (0, 1, 2, 7); order kept, no repeats.

    Raises ValueError naming the bad part for an empty, reversed or malformed
    range, a negative or repeated seed, or more than ``MAX_SEEDS`` seeds.
    """
    seeds: list[int] = []
    for part in text.split(","):
        match = _RANGE.match(part)
        if match is None:
            raise ValueError(f"seeds: {part.strip()!r} is not N or N-M (e.g. 0-9 or 0-4,7)")
        low = int(match.group(1))
        high = low if match.group(2) is None else int(match.group(2))
        if high < low:
            raise ValueError(f"seeds: range {part.strip()!r} is empty (high < low)")
        if high - low + len(seeds) >= MAX_SEEDS:
            raise ValueError(f"seeds: more than {MAX_SEEDS} seeds")
        seeds.extend(range(low, high + 1))
    return _unique_seeds(seeds)


def _unique_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    if not seeds:
        raise ValueError("seeds: at least one seed is needed")
    seen: set[int] = set()
    for seed in seeds:
        if seed < 0:
            raise ValueError(f"seeds: {seed} is negative (workload draws take seeds >= 0)")
        if seed in seen:
            raise ValueError(f"seeds: seed {seed} is given twice")
        seen.add(seed)
    return tuple(seeds)


class SweepSpec(BaseModel):
    """One sweep: every combination of the lists below is a cell (one simulation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("sweep", min_length=1, max_length=100, description="Report name.")
    scenarios: list[str] = Field(
        default_factory=lambda: ["default"],
        min_length=1,
        description="Built-in scenario names or scenario YAML files (relative to the spec).",
    )
    routers: list[str] | None = Field(
        None, description="Routers to compare (None = each scenario's own list, else all)."
    )
    reference: str | None = Field(
        None,
        description="Router (or variant label) the others are set against, seed by seed "
        "(None = the first router).",
    )
    seeds: tuple[int, ...] = Field((0, 1, 2, 3, 4), description='"0-9", "0-4,7" or a list.')
    windows: list[str] | None = Field(
        None, description="Windows of windowed scenarios to run (None = all of them)."
    )
    load_scales: list[float] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        description="Multiply the clients' rate_per_s (open loop) or num_users (closed).",
    )
    fleets: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description="Named fleet variants: fleet group name -> fields to override "
        "(e.g. replicas); {} = each scenario's fleet as written.",
    )
    router_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per router: parameters; a list value is swept, anything else fixed.",
    )
    metrics: list[str] = Field(
        default_factory=lambda: list(DEFAULT_METRICS),
        min_length=1,
        description="Metrics in the table and plot (summary keys, or ttca_* for TTCA).",
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="Confidence of the intervals.")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_seeds(value)
        if isinstance(value, list) and all(type(v) is int for v in value):
            return _unique_seeds(value)
        if isinstance(value, int | float):
            raise ValueError('give seeds as a range string ("0-4") or a list of integers')
        return value

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, value: list[str]) -> list[str]:
        from longroute.sweep.cell import known_metrics

        known = known_metrics()
        for name in value:
            if name not in known:
                raise ValueError(f"unknown metric {name!r}; known: {', '.join(known)}")
        return value

    @field_validator("load_scales")
    @classmethod
    def _positive_loads(cls, value: list[float]) -> list[float]:
        bad = [v for v in value if not v > 0]
        if bad:
            raise ValueError(f"every load scale must be > 0, got {bad}")
        return value

    @model_validator(mode="after")
    def _params_known(self) -> SweepSpec:
        for router, params in self.router_params.items():
            for name, values in params.items():
                if isinstance(values, list) and not values:
                    raise ValueError(f"router_params.{router}.{name}: an empty list sweeps nothing")
        return self


def router_variants(router: str, params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, params) per combination of the swept (list-valued) parameters, in spec order."""
    fixed = {k: (v[0] if _is_fixed_list(v) else v) for k, v in params.items() if not _swept(v)}
    swept = [(k, v) for k, v in params.items() if _swept(v)]
    if not swept:
        return [(router, fixed)]
    out = []
    for combo in itertools.product(*(values for _, values in swept)):
        chosen = dict(zip((k for k, _ in swept), combo, strict=True))
        label = router + "(" + ",".join(f"{k}={v}" for k, v in chosen.items()) + ")"
        out.append((label, {**fixed, **chosen}))
    return out


def _swept(value: object) -> bool:
    return isinstance(value, list) and not _is_fixed_list(value)


def _is_fixed_list(value: object) -> bool:
    """``[[a, b]]``: a fixed parameter whose value is the list [a, b]."""
    return isinstance(value, list) and len(value) == 1 and isinstance(value[0], list)


def load_spec(path: Path) -> SweepSpec:
    """Read and validate a spec file; scenario paths become relative to its folder."""
    spec = validate_mapping(read_yaml(path, "sweep spec"), SweepSpec, str(path), "sweep spec")
    scenarios = [_relative_to(path.parent, s) for s in spec.scenarios]
    return spec.model_copy(update={"scenarios": scenarios})


def _relative_to(folder: Path, scenario: str) -> str:
    if scenario.endswith((".yaml", ".yml")) or "/" in scenario:
        candidate = Path(scenario)
        return str(candidate if candidate.is_absolute() else folder / candidate)
    return scenario


def spec_from_options(
    scenario: str, routers: list[str] | None, seeds: tuple[int, ...], **fields: Any
) -> SweepSpec:
    """The spec of a one-scenario sweep from command-line options (``simulate --seeds``)."""
    data = {"scenarios": [scenario], "routers": routers, "seeds": seeds, **fields}
    return validate_mapping(data, SweepSpec, "command line", "sweep")


__all__ = [
    "DEFAULT_METRICS",
    "SweepSpec",
    "load_spec",
    "parse_seeds",
    "router_variants",
    "spec_from_options",
]
