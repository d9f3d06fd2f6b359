"""Expanding a sweep spec into cells, each with its scenario fully resolved.

The order is stable (scenario, window, load scale, fleet, router variant,
seed, as written in the spec), so equal specs give the same cells in the same
order. Everything that can be checked before any simulation is checked here:
unknown scenarios, routers, windows and fleet groups, a fleet override that
makes an invalid scenario, a load scale on a trace replay, a reference that
names no router. Errors are ConfigErrors that say which part of the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from longroute.config import ConfigError, ScenarioConfig, WindowConfig
from longroute.sim.engine_variants import apply_engine
from longroute.sim.engine_variants import labels as engine_labels
from longroute.sweep.cell import Cell
from longroute.sweep.spec import SweepSpec, router_variants

BASE_FLEET = "base"
MAX_CELLS = 100_000


@dataclass(frozen=True, slots=True)
class Grid:
    """The cells of a spec, and the reference router variant each setting is set against."""

    spec: SweepSpec
    cells: tuple[Cell, ...]
    reference: str
    labels: tuple[str, ...]


def expand(spec: SweepSpec) -> Grid:
    """Every cell of ``spec``; raises ConfigError (RegistryError for unknown names) first."""
    from longroute.sim.scenario import load_scenario, resolve_routers

    fleets = spec.fleets or {BASE_FLEET: {}}
    _check_size(spec, len(fleets))
    cells: list[Cell] = []
    all_labels: list[str] = []
    for name in spec.scenarios:
        config = load_scenario(name)
        scenario = config.name
        routers = resolve_routers(config, spec.routers)
        _check_params(spec, routers)
        variants = [v for r in routers for v in _variants(spec, r)]
        runs = _engine_runs(config, variants)
        for label, *_ in runs:
            if label not in all_labels:
                all_labels.append(label)
        for window_index, window in _windows(spec, config):
            for load_scale in spec.load_scales:
                scaled = _scaled(config, window, load_scale)
                for fleet_name, override in fleets.items():
                    fleet_config = _with_fleet(scaled, fleet_name, override)
                    for label, router, params, engine in runs:
                        resolved = _with_router_params(
                            apply_engine(fleet_config, engine), router, params
                        )
                        for seed in spec.seeds:
                            cells.append(
                                Cell(
                                    scenario, None if window is None else window.name,
                                    load_scale, fleet_name, router, label,
                                    tuple(_swept_params(spec, router, params).items()),
                                    seed, _run_seed(seed, window_index, window), resolved,
                                    None if window is None else window.baseline,
                                )
                            )  # fmt: skip
    reference = spec.reference or all_labels[0]
    if reference not in all_labels:
        raise ConfigError(
            f"sweep reference {reference!r} names no router of the sweep; routers: "
            f"{', '.join(all_labels)}"
        )
    return Grid(spec, tuple(cells), reference, tuple(all_labels))


def _check_size(spec: SweepSpec, num_fleets: int) -> None:
    """Refuse a grid of more than MAX_CELLS before building it (a typo in a range must not
    fill memory); windows and unlisted routers are not known yet, so count generously:
    every router given params or named, at least one, times its variants."""
    num_variants = sum(
        len(router_variants(r, spec.router_params.get(r, {})))
        for r in (spec.routers or list(spec.router_params) or ["-"])
    )
    size = (
        len(spec.scenarios)
        * max(1, len(spec.windows or []))
        * len(spec.load_scales)
        * num_fleets
        * max(1, num_variants)
        * len(spec.seeds)
    )
    if size > MAX_CELLS:
        raise ConfigError(
            f"the sweep has at least {size:,} cells, more than {MAX_CELLS:,}; "
            "fewer seeds, loads or parameter values"
        )


def _variants(spec: SweepSpec, router: str) -> list[tuple[str, str, dict[str, Any]]]:
    params = spec.router_params.get(router, {})
    return [(label, router, p) for label, p in router_variants(router, params)]


def _engine_runs(
    config: ScenarioConfig, variants: list[tuple[str, str, dict[str, Any]]]
) -> list[tuple[str, str, dict[str, Any], str | None]]:
    """Each router variant once per engine of a scenario that names engines; labelled
    as ``longroute simulate`` labels them (the engine alone under one router variant)."""
    by_label = {label: (router, params) for label, router, params in variants}
    return [
        (label, *by_label[router_label], engine)
        for label, router_label, engine in engine_labels(config, list(by_label))
    ]


def _check_params(spec: SweepSpec, routers: list[str]) -> None:
    from longroute.routing import ROUTERS

    for router in spec.router_params:
        ROUTERS.get(router)  # an unknown name is a RegistryError naming the valid ones
        if router not in routers:
            raise ConfigError(
                f"sweep router_params.{router}: router {router!r} is not in the sweep "
                f"(routers: {', '.join(routers)})"
            )


def _swept_params(spec: SweepSpec, router: str, params: dict[str, Any]) -> dict[str, Any]:
    swept = {k for k, v in spec.router_params.get(router, {}).items() if isinstance(v, list)}
    return {k: v for k, v in params.items() if k in swept}


def _windows(spec: SweepSpec, config: ScenarioConfig) -> list[tuple[int, WindowConfig | None]]:
    from longroute.sim.windows import check_baselines

    check_baselines(config)
    if not config.windows:
        if spec.windows:
            raise ConfigError(
                f"sweep windows {spec.windows}: scenario {config.name!r} has no windows"
            )
        return [(0, None)]
    names = [w.name for w in config.windows]
    for name in spec.windows or []:
        if name not in names:
            raise ConfigError(
                f"sweep windows: scenario {config.name!r} has no window {name!r}; "
                f"windows: {', '.join(names)}"
            )
    wanted = spec.windows or names
    return [(i, w) for i, w in enumerate(config.windows) if w.name in wanted]


def _run_seed(seed: int, index: int, window: WindowConfig | None) -> int:
    from longroute.sim.windows import window_seed

    return seed if window is None else window_seed(seed, index, window)


def _scaled(
    config: ScenarioConfig, window: WindowConfig | None, load_scale: float
) -> ScenarioConfig:
    """The scenario as one run of it: the window applied, the load scaled, no windows left."""
    from longroute.sim.windows import window_scenario

    if window is None and load_scale == 1.0:
        return config
    if window is None:
        window = WindowConfig(name="all")
    scaled = window.model_copy(update={"load_scale": window.load_scale * load_scale})
    run = window_scenario(config, scaled)
    return run.model_copy(update={"windows": None, "tuning": None})


def _with_fleet(
    config: ScenarioConfig, name: str, override: dict[str, dict[str, Any]]
) -> ScenarioConfig:
    if not override:
        return config
    groups = {g.name for g in config.fleet}
    for group in override:
        if group not in groups:
            raise ConfigError(
                f"sweep fleets.{name}: scenario {config.name!r} has no fleet group {group!r}; "
                f"groups: {', '.join(sorted(groups))}"
            )
    data = config.model_dump()
    data["fleet"] = [{**g, **override.get(g["name"], {})} for g in data["fleet"]]
    return _revalidated(data, f"sweep fleets.{name} on scenario {config.name!r}")


def _with_router_params(
    config: ScenarioConfig, router: str, params: dict[str, Any]
) -> ScenarioConfig:
    if not params:
        return config
    merged = {**config.router_params.get(router, {}), **params}
    return config.model_copy(update={"router_params": {**config.router_params, router: merged}})


def _revalidated(data: dict[str, Any], where: str) -> ScenarioConfig:
    try:
        return ScenarioConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{where}: {problems}") from None


__all__ = ["BASE_FLEET", "Grid", "expand"]
