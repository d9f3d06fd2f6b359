"""Evaluation windows: the same fleet under several loads, each its own workload draw.

A scenario with ``windows`` (e.g. GORGO's full, half and a third of the load,
30 minutes each) is simulated once per window and router. Window ``i`` draws
its workload with seed ``seed + i`` (or ``seed + seed_offset`` when it sets
one), so by default every window sees different requests (a held-out window
shares no sessions with the tuning window), and scales the clients:
``rate_per_s`` (open loop) or ``num_users`` (closed loop) times its
``load_scale``, or a trace replay's timestamps divided by it (``time_scale``);
its ``duration_s`` stops new sessions (started ones drain).
Its ``workload_params`` are merged over the generator's params, so two
windows with one ``seed_offset`` can run the same draw with one knob changed
(e.g. the ``rag`` scenario: context reuse off and on; ``baseline`` pairs them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longroute.config import ConfigError, ScenarioConfig, WindowConfig
from longroute.sim.scenario import PrepareRouter, ScenarioRun, run_scenario


@dataclass(frozen=True, slots=True)
class WindowRun:
    """One window's results; ``is_tuning_window`` marks the in-sample one."""

    window: WindowConfig
    run: ScenarioRun
    is_tuning_window: bool


def windows_of(config: ScenarioConfig) -> list[WindowConfig]:
    """The scenario's windows, or one full-load window named "all" when it has none."""
    return list(config.windows) if config.windows else [WindowConfig(name="all")]


def window_scenario(config: ScenarioConfig, window: WindowConfig) -> ScenarioConfig:
    """The scenario as run in ``window``: scaled clients, the window's duration."""
    clients = config.clients
    update: dict[str, object] = {}
    if clients.kind == "open" and clients.arrival == "trace":
        # a replay is scaled by spacing its timestamps: half the load, twice the gaps
        update["time_scale"] = clients.time_scale / window.load_scale
    elif clients.kind == "open":
        if clients.rate_per_s is None:
            raise ConfigError(
                f"window {window.name!r}: load_scale needs open-loop clients with rate_per_s "
                "(trace replay has no rate to scale)"
            )
        update["rate_per_s"] = clients.rate_per_s * window.load_scale
    else:
        if clients.num_users is None:
            raise ConfigError(f"window {window.name!r}: closed-loop clients need num_users")
        update["num_users"] = max(1, round(clients.num_users * window.load_scale))
    if window.duration_s is not None:
        update["duration_s"] = window.duration_s
    changes: dict[str, object] = {"clients": clients.model_copy(update=update)}
    if window.workload_params:
        workload = config.workload
        if workload.generator is None:
            raise ConfigError(
                f"window {window.name!r}: workload_params need a generator workload "
                f"(this scenario replays the trace {workload.trace!r})"
            )
        params = {**workload.params, **window.workload_params}
        changes["workload"] = workload.model_copy(update={"params": params})
    return config.model_copy(update=changes)


def window_seed(seed: int, index: int, window: WindowConfig) -> int:
    """The workload seed of window number ``index``: seed + its seed_offset, else + index."""
    return seed + (index if window.seed_offset is None else window.seed_offset)


def check_baselines(config: ScenarioConfig) -> None:
    """Raise ConfigError for a window whose ``baseline`` names no window of the scenario."""
    names = [w.name for w in windows_of(config)]
    for window in windows_of(config):
        if window.baseline is not None and window.baseline not in names:
            raise ConfigError(
                f"window {window.name!r}: unknown baseline {window.baseline!r}; "
                f"windows: {', '.join(names)}"
            )


def window_index(config: ScenarioConfig, name: str) -> int:
    names = [w.name for w in windows_of(config)]
    if name not in names:
        raise ConfigError(f"unknown window {name!r}; windows: {', '.join(names)}")
    return names.index(name)


def run_windows(
    config: ScenarioConfig,
    *,
    seed: int | None = None,
    routers: list[str] | None = None,
    only: list[str] | None = None,
    prepare_router: PrepareRouter | None = None,
    on_router_done: Callable[[str, str], None] | None = None,
) -> list[WindowRun]:
    """Every window (or those named in ``only``), every router; results in window order."""
    seed = config.seed if seed is None else seed
    windows = windows_of(config)
    check_baselines(config)
    if only is not None:
        for name in only:
            window_index(config, name)  # fail on an unknown name before any work
    tuning_window = config.tuning.window if config.tuning is not None else None
    out = []
    for i, window in enumerate(windows):
        if only is not None and window.name not in only:
            continue
        run = run_scenario(
            window_scenario(config, window) if config.windows else config,
            seed=window_seed(seed, i, window),
            routers=routers,
            prepare_router=prepare_router,
            on_router_done=_tagged(on_router_done, window.name),
        )
        out.append(WindowRun(window, run, window.name == tuning_window))
    return out


def _tagged(
    callback: Callable[[str, str], None] | None, window: str
) -> Callable[[str], None] | None:
    """``callback`` with the window name bound as its first argument."""
    if callback is None:
        return None
    return lambda router: callback(window, router)
