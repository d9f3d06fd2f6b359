"""`longroute sweep SPEC.yaml`, and the multi-seed half of `longroute simulate --seeds`.

Exit status: 0 when every cell finished, 1 when any failed (listed), 2 for
bad input (nothing run), 130 on Ctrl-C (finished cells kept; rerun to resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from longroute.errors import ConfigError
from longroute.registry import RegistryError
from longroute.sweep.present import fail, run_and_report

if TYPE_CHECKING:
    from longroute.sweep.executors import Executor
    from longroute.sweep.grid import Grid
    from longroute.sweep.spec import SweepSpec

LOCAL_RAY = "local"
_ERRORS = (ConfigError, RegistryError, ValueError, LookupError)


def make_executor(jobs: int | None, ray: str | None) -> Executor:
    """``--ray [ADDRESS]`` (``local`` starts one here), else ``--jobs`` (1 = in this process)."""
    from longroute.sweep.executors import PoolExecutor, RayExecutor, SerialExecutor

    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if ray is not None:
        try:
            import ray as _ray  # noqa: F401
        except ImportError:
            raise ConfigError(
                '--ray needs Ray: pip install -e ".[ray]" (or pip install "ray>=2.9")'
            ) from None
        return RayExecutor(None if ray == LOCAL_RAY else ray, num_cpus=jobs)
    if jobs == 1:
        return SerialExecutor()
    return PoolExecutor(jobs)


def build_grid(spec: SweepSpec) -> Grid:
    from longroute.sweep.grid import expand

    try:
        return expand(spec)
    except _ERRORS as exc:
        raise fail(str(exc)) from None


def sweep_command(
    spec_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="SPEC.yaml", help="Sweep spec (docs/sweeps.md); none = --scenario alone."
        ),
    ] = None,
    scenario: Annotated[
        str | None, typer.Option(help="Without a spec: sweep this scenario (name or file).")
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help='Seeds, e.g. "0-9" or "0-4,7" (overrides the spec).')
    ] = None,
    routers: Annotated[
        str | None, typer.Option(help="Comma-separated routers (overrides the spec).")
    ] = None,
    reference: Annotated[
        str | None, typer.Option(help="Router the others are set against (default: the first).")
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(help="Comma-separated metrics for the statistics (overrides the spec)."),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Worker processes (default: every core; 1 = in-process).")
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            metavar="[ADDRESS]",
            help="Run the cells as Ray tasks: alone, on a local Ray started here; with an "
            "address (auto, ray://HOST:10001, HOST:6379), on that cluster.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Report and cell-cache folder (default: reports/sweeps/<name>)."),
    ] = None,
    fresh: Annotated[
        bool,
        typer.Option("--fresh", help="Recompute every cell (ignore and do not use the cache)."),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout, nothing else.")
    ] = False,
) -> None:
    """Run a grid of simulations (scenarios x routers x params x loads x fleets x seeds)."""
    from longroute.sweep.spec import SweepSpec, load_spec, parse_seeds

    try:
        if spec_file is not None:
            if scenario is not None:
                raise ConfigError("give a spec file or --scenario, not both")
            spec = load_spec(spec_file)
        else:
            name = scenario or "default"
            if name.endswith((".yaml", ".yml")):
                name = Path(name).stem  # the report folder is named after the file
            spec = SweepSpec(scenarios=[scenario or "default"], name=name)
        update: dict[str, object] = {}
        if seeds is not None:
            update["seeds"] = parse_seeds(seeds)
        if routers is not None:
            update["routers"] = _router_list(routers)
        if reference is not None:
            update["reference"] = reference
        if metrics is not None:
            update["metrics"] = metric_list(metrics)
        from longroute.config import validate_mapping

        spec = validate_mapping({**spec.model_dump(), **update}, SweepSpec, "command line", "sweep")
        executor = make_executor(jobs, ray)
    except _ERRORS as exc:
        raise fail(str(exc)) from None
    grid = build_grid(spec)
    folder = out or Path("reports") / "sweeps" / _safe_name(spec.name)
    run_and_report(grid, executor, out=folder, json_output=json_output, fresh=fresh)


def metric_list(text: str) -> list[str]:
    """``--metrics a,b``: names checked against the summary keys and the TTCA metrics."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise ConfigError("--metrics names no metric; give a comma-separated list")
    return names


def _router_list(text: str) -> list[str]:
    names = [r.strip() for r in text.split(",") if r.strip()]
    if not names:
        raise ConfigError("--routers names no router; give a comma-separated list")
    return names


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "sweep"


@dataclass(frozen=True, slots=True)
class SeedOptions:
    reference: str | None
    metrics: str | None
    weights: Path | None
    jobs: int | None
    ray: str | None


def simulate_seeds(
    scenario: str,
    routers: str | None,
    seeds: str,
    options: SeedOptions,
    out: Path | None,
    json_output: bool,
) -> None:
    """``simulate --seeds``: a one-scenario sweep through the sweep's executors and report."""
    from longroute.sim.scenario import load_scenario, resolve_routers
    from longroute.sweep.spec import parse_seeds, spec_from_options

    try:
        config = load_scenario(scenario)
        names = resolve_routers(config, None if routers is None else _router_list(routers))
        frozen = None
        if options.weights is not None:
            from longroute.tuning import load_weights

            frozen = load_weights(options.weights)
        params = {}
        if frozen is not None:
            if frozen.router not in names:
                raise ConfigError(
                    f"the weights were tuned for router {frozen.router!r}, which this run does "
                    f"not include; routers: {', '.join(names)}"
                )
            params = {frozen.router: dict(frozen.weights)}
        spec = spec_from_options(
            scenario,
            names,
            parse_seeds(seeds),
            name=f"{config.name}-seeds",
            reference=options.reference,
            router_params=params,
            **({"metrics": metric_list(options.metrics)} if options.metrics else {}),
        )
        executor = make_executor(options.jobs, options.ray)
    except (ConfigError, RegistryError, ValueError) as exc:
        raise fail(str(exc)) from None
    folder = out or Path("reports") / f"{config.name}-seeds"
    run_and_report(build_grid(spec), executor, out=folder, json_output=json_output, fresh=False)


def normalize_ray_flag(argv: list[str]) -> list[str]:
    """``--ray`` with no address (last, or before another option or a .yaml) -> ``--ray local``."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--ray":
            following = argv[i + 1] if i + 1 < len(argv) else None
            if (
                following is None
                or following.startswith("-")
                or following.endswith((".yaml", ".yml"))
            ):
                out.append(LOCAL_RAY)
    return out


__all__ = [
    "SeedOptions",
    "make_executor",
    "normalize_ray_flag",
    "run_and_report",
    "simulate_seeds",
    "sweep_command",
]
