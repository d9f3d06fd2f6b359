"""One cell of a sweep: one scenario variant, one router, one seed; and running it.

A :class:`Cell` carries its scenario fully resolved (window, load scale, fleet
override and router parameters already applied), so a worker process needs
nothing else: :func:`execute_cell` simulates that router alone on that seed
(the same run ``longroute simulate`` makes for it: each router's random
streams derive from the seed and its name only) and returns the summary
metrics. A cell that raises comes back as a failed result carrying the error,
never as an exception; a worker that dies is the executor's to report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from longroute.config import ScenarioConfig

Metrics = dict[str, float | int | None]
CellStatus = Literal["ok", "failed"]
MAX_ERROR_CHARS = 2_000

#: TTCA figures added to a cell's metrics when its scenario checks answers
TTCA_METRICS = ("mean_s", "p50_s", "p95_s", "final_success", "num_censored")


def known_metrics() -> list[str]:
    """Every metric a cell can report: the summary keys, the ``ttca_*`` and ``wf_*`` ones."""
    from longroute.metrics.summary import SUMMARY_KEYS
    from longroute.metrics.workflows import WORKFLOW_KEYS

    return [*SUMMARY_KEYS, *(f"ttca_{k}" for k in TTCA_METRICS), *WORKFLOW_KEYS]


@dataclass(frozen=True, slots=True)
class Cell:
    """What one simulation runs, and the labels it is reported under.

    ``seed`` is the sweep's seed; ``run_seed`` the one the simulation uses
    (a window adds its offset, as ``longroute simulate`` does). ``label`` is
    the router variant (``gorgo`` or ``gorgo(queue_weight=0.1)``); ``params``
    its swept parameter values, already merged into ``config.router_params``;
    ``baseline`` the window a windowed scenario sets this one against (e.g.
    the same draw without context reuse).
    """

    scenario: str
    window: str | None
    load_scale: float
    fleet: str
    router: str
    label: str
    params: tuple[tuple[str, Any], ...]
    seed: int
    run_seed: int
    config: ScenarioConfig
    baseline: str | None = None  # the window this cell's window is set against, if any

    def setting(self) -> tuple[str, str | None, float, str]:
        """The comparison this cell belongs to: (scenario, window, load scale, fleet)."""
        return (self.scenario, self.window, self.load_scale, self.fleet)

    def describe(self) -> str:
        """``default/full x0.5 fleet=big gorgo seed 3``: for messages."""
        where = self.scenario + (f"/{self.window}" if self.window else "")
        load = "" if self.load_scale == 1.0 else f" x{self.load_scale:g}"
        fleet = "" if self.fleet == "base" else f" fleet={self.fleet}"
        return f"{where}{load}{fleet} {self.label} seed {self.seed}"

    def labels(self) -> dict[str, Any]:
        """The cell's coordinates as plain JSON values (report rows and CSV columns)."""
        return {
            "scenario": self.scenario,
            "window": self.window,
            "load_scale": self.load_scale,
            "fleet": self.fleet,
            "router": self.router,
            "label": self.label,
            "params": dict(self.params),
            "seed": self.seed,
        }


@dataclass(frozen=True, slots=True)
class CellResult:
    """A cell's outcome: metrics when ``status == "ok"``, else the error that stopped it."""

    status: CellStatus
    metrics: Metrics
    error: str | None
    elapsed_s: float
    is_cached: bool = False

    @property
    def is_ok(self) -> bool:
        return self.status == "ok"


def failed(error: str, elapsed_s: float = 0.0) -> CellResult:
    return CellResult("failed", {}, error[:MAX_ERROR_CHARS], elapsed_s)


def execute_cell(cell: Cell) -> CellResult:
    """Simulate the cell; any exception becomes a failed result ("Type: message")."""
    start = time.perf_counter()
    try:
        metrics = simulate_cell(cell)
    except Exception as exc:  # a cell's fault is recorded, the sweep goes on
        return failed(f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
    return CellResult("ok", metrics, None, time.perf_counter() - start)


def simulate_cell(cell: Cell) -> Metrics:
    """The cell's summary metrics (``summarize`` keys, plus ``ttca_*`` with answer checking
    and ``wf_*`` for agent workflows)."""
    from longroute.metrics.summary import summarize
    from longroute.metrics.workflows import has_workflows, summarize_workflows
    from longroute.sim.scenario import run_scenario

    run = run_scenario(cell.config, seed=cell.run_seed, routers=[cell.router])
    result = run.results[cell.router]
    metrics: Metrics = dict(summarize(result.records, num_rejected=result.num_rejected))
    ttca = run.ttca().get(cell.router)
    if ttca is not None:
        values = ttca.to_dict()
        for key in TTCA_METRICS:
            metrics[f"ttca_{key}"] = values[key]
    if has_workflows(result.records):
        metrics.update(summarize_workflows(result.records))
    return metrics


__all__ = [
    "Cell",
    "CellResult",
    "Metrics",
    "execute_cell",
    "failed",
    "known_metrics",
    "simulate_cell",
]
