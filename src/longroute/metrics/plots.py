"""Figures of the reports, drawn on an explicit Agg canvas.

matplotlib is imported lazily and never through pyplot, so importing this
module has no side effects and the global matplotlib backend is left alone.
PNGs are written without a "Software" entry, so equal inputs give equal files.
Each figure has a ``*_figure`` builder (what the tests inspect) and a
``*_plot`` that writes it. Legends sit outside the axes, so they never hide
data. Each router is drawn in its own style (:mod:`.router_styles`), the same
in every figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from longroute.metrics.records import RequestRecord
from longroute.metrics.router_styles import router_styles
from longroute.metrics.summary import requests_per_endpoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Most points drawn per CDF line; more than a figure's pixel resolution.
CDF_MAX_POINTS = 4000


def new_figure(width_in: float, height_in: float, *, dpi: int = 100) -> Figure:
    """A figure on its own Agg canvas, laid out by matplotlib's constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    """Writes ``fig`` as PNG without a "Software" entry; returns ``path``."""
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def legend_outside(ax: Axes, *, title: str | None = None) -> None:
    """The axes' legend to the right of its plotting area (constrained layout makes room)."""
    ax.legend(
        loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small",
        title=title, title_fontsize="small",
    )  # fmt: skip


def plain_log_ticks(ax: Axes, *, is_y: bool = False) -> None:
    """Log-scale tick labels as plain numbers (0.1, 1, 10) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis = ax.yaxis if is_y else ax.xaxis
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def cdf_figure(
    scenario: str,
    metric: str,
    latency_s: Callable[[RequestRecord], float],
    records_by_router: Mapping[str, Sequence[RequestRecord]],
) -> Figure:
    """Empirical CDF of ``latency_s`` (named ``metric``), one step line per router, log-x."""
    import numpy as np

    fig = new_figure(9.0, 5.0)
    ax = fig.add_subplot()
    has_data = False
    styles = router_styles(records_by_router)
    for router, records in records_by_router.items():
        look = styles[router]
        color, linestyle, linewidth = look.color, look.linestyle, look.linewidth
        values = np.sort(np.fromiter(map(latency_s, records), dtype=np.float64))
        if values.size == 0:
            ax.plot(
                [], [], label=f"{router} (no data)", color=color, linestyle=linestyle,
                linewidth=linewidth,
            )  # fmt: skip
            continue
        has_data = True
        ranks = np.arange(1, values.size + 1, dtype=np.float64)
        if values.size > CDF_MAX_POINTS:  # thin out; keeps min, max and every 1/k-th rank
            keep = np.unique(np.linspace(0, values.size - 1, CDF_MAX_POINTS).round().astype(int))
            values, ranks = values[keep], ranks[keep]
        label = f"{router} (n={int(ranks[-1])})"
        ax.step(
            values, ranks / ranks[-1], where="post", label=label, color=color,
            linestyle=linestyle, linewidth=linewidth,
        )  # fmt: skip
    if has_data:
        ax.set_xscale("log")
        plain_log_ticks(ax)
    ax.set_xlabel(f"{metric} (s, log scale)")
    ax.set_ylabel("fraction of requests ≤ x")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(f"{scenario}: {metric} CDF (further left is faster)")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, title="router")
    return fig


def latency_cdf_plot(
    path: Path,
    scenario: str,
    metric: str,
    latency_s: Callable[[RequestRecord], float],
    records_by_router: Mapping[str, Sequence[RequestRecord]],
) -> Path:
    """Writes :func:`cdf_figure` to ``path``."""
    return save_png(cdf_figure(scenario, metric, latency_s, records_by_router), path)


def endpoint_figure(
    scenario: str, records_by_router: Mapping[str, Sequence[RequestRecord]]
) -> Figure:
    """Grouped bars: requests per endpoint (x), one bar per router."""
    counts = {router: requests_per_endpoint(recs) for router, recs in records_by_router.items()}
    endpoints = sorted({name for per in counts.values() for name in per})
    num_routers = max(len(counts), 1)
    width_in = min(max(9.0, 0.25 * len(endpoints) * num_routers + 3.5), 30.0)
    fig = new_figure(width_in, 5.0)
    ax = fig.add_subplot()
    bar_width = 0.8 / num_routers
    positions = list(range(len(endpoints)))
    styles = router_styles(counts)
    for i, (router, per) in enumerate(counts.items()):
        offset = (i - (num_routers - 1) / 2.0) * bar_width
        heights = [per.get(name, 0) for name in endpoints]
        look = styles[router]
        ax.bar(
            [p + offset for p in positions], heights, width=bar_width, label=router,
            color=look.color, hatch=look.hatch or None, edgecolor="0.25", linewidth=0.3,
        )  # fmt: skip
    is_crowded = len(endpoints) > 6
    ax.set_xticks(
        positions,
        endpoints,
        rotation=45 if is_crowded else 0,
        ha="right" if is_crowded else "center",
    )
    ax.set_xlabel("endpoint")
    ax.set_ylabel("requests")
    ax.set_title(f"{scenario}: requests per endpoint")
    ax.grid(True, axis="y", alpha=0.3)
    if counts:
        legend_outside(ax, title="router")
    return fig


def endpoint_plot(
    path: Path, scenario: str, records_by_router: Mapping[str, Sequence[RequestRecord]]
) -> Path:
    """Writes :func:`endpoint_figure` to ``path``."""
    return save_png(endpoint_figure(scenario, records_by_router), path)
