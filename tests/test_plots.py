"""The report figures, checked on their matplotlib Figure objects (no pixels).

What a user would see: axes with titles, legends beside the data rather than
over it, a TTCA heat map whose colour scale covers every annotated value with
readable text, and a forest plot that says what its colours mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.legend import Legend
from matplotlib.transforms import Bbox

from longroute.metrics.plots import cdf_figure, endpoint_figure
from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import summarize_ttca
from longroute.metrics.ttca import TtcaSummary
from longroute.metrics.ttca_plots import improvement_figure, improvement_norm, success_figure
from longroute.metrics.tuning_report import trajectory_figure
from longroute.sweep.plot import forest_figure
from longroute.sweep.report import ArmStats, MetricStats
from longroute.sweep.stats import Estimate, PairedRatio
from longroute.tuning import TunerStep
from longroute.types import Language

R = 4
ROUTERS = ("laar", "least-load", "session-affinity", "round-robin", "random", "prefix-cache")


def _record(router: str, endpoint: str, latency_s: float, **kw: object) -> RequestRecord:
    return RequestRecord(
        request_id=str(kw.pop("request_id", f"{router}-{endpoint}-{latency_s}")),
        session_id=None, router=router, endpoint=endpoint, model="m", region=None,
        arrival_s=0.0, dispatch_s=0.0, first_token_s=latency_s / 2, finish_s=latency_s,
        num_prompt_tokens=int(kw.pop("num_prompt_tokens", 1000)), num_cached_tokens=0,
        num_output_tokens=8, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _records() -> dict[str, list[RequestRecord]]:
    """Many requests per router and endpoint, so bars and CDF lines fill their axes."""
    return {
        router: [
            _record(router, f"endpoint-{e}", 0.01 * (1 + i) * (1 + r), request_id=f"{r}-{e}-{i}")
            for e in range(4)
            for i in range(50 + 30 * e)
        ]
        for r, router in enumerate(ROUTERS)
    }


def _drawn(fig: Figure) -> Figure:
    fig.canvas.draw()  # lays the figure out, so extents are final
    return fig


def _overlaps(legend: Legend, axes: Sequence[Axes]) -> bool:
    box = legend.get_window_extent()
    return any(Bbox.intersection(box, ax.get_window_extent()) is not None for ax in axes)


def _legends(fig: Figure) -> list[Legend]:
    found = [ax.get_legend() for ax in fig.axes]
    return [lg for lg in [*found, *fig.legends] if lg is not None]


def _assert_labelled(ax: Axes) -> None:
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


# ---- per-endpoint bars and CDFs ------------------------------------------------------


def test_endpoint_bars_have_labels_and_the_legend_is_beside_them() -> None:
    fig = _drawn(endpoint_figure("default", _records()))
    (ax,) = fig.axes
    _assert_labelled(ax)
    (legend,) = _legends(fig)
    assert [t.get_text() for t in legend.get_texts()] == list(ROUTERS)
    assert not _overlaps(legend, [ax])


def test_cdf_legend_is_beside_the_lines_and_ticks_are_plain_numbers() -> None:
    fig = _drawn(cdf_figure("default", "TTFT", lambda r: r.ttft_s, _records()))
    (ax,) = fig.axes
    _assert_labelled(ax)
    (legend,) = _legends(fig)
    assert not _overlaps(legend, [ax])
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and not any("10^" in text or "$" in text for text in labels)


# ---- TTCA figures --------------------------------------------------------------------


def _query(router: str, qid: str, tokens: int, latency_s: float) -> RequestRecord:
    return _record(
        router, "e", latency_s, request_id=qid, query_id=qid, is_correct=True,
        num_prompt_tokens=tokens,
    )  # fmt: skip


def _ttca(factors: Mapping[str, Sequence[float]]) -> tuple[dict[str, TtcaSummary], dict]:
    """TTCA summaries where laar's TTCA in setting i is ``factor[i]`` x the other's (1 s)."""
    languages = {}
    records: dict[str, list[RequestRecord]] = {"laar": []}
    for other, per_setting in factors.items():
        records[other] = []
        for i, factor in enumerate(per_setting):
            tokens = (3000, 7000, 15000)[i % 3]
            language = (Language.LATIN, Language.CJK)[i // 3]
            qid = f"q{i}"
            languages[qid] = language
            if other == next(iter(factors)):
                records["laar"].append(_query("laar", qid, tokens, factor))
            records[other].append(_query(other, qid, tokens, 1.0))
    ttca = {}
    for router, recs in records.items():
        summary = summarize_ttca(recs, R, languages=languages)
        assert summary is not None
        ttca[router] = summary
    return ttca, records


#: laar 4x faster (+75%) up to 3.62x slower (-262%), as in `simulate --scenario laar`
FACTORS = {"least-load": [0.25, 0.5, 1.0, 2.0, 3.62, 0.9], "load-aware": [1.0] * 6}


def _image_values(ax: Axes) -> list[float]:
    (image,) = [im for im in ax.get_images() if isinstance(im, AxesImage)]
    return [float(v) for v in image.get_array().compressed()]


def test_heat_map_colour_scale_covers_the_data_and_is_centred_on_zero() -> None:
    ttca, _ = _ttca(FACTORS)
    fig = improvement_figure("laar", ttca)
    assert fig is not None
    heat_maps = [ax for ax in fig.axes if ax.get_images()]
    assert len(heat_maps) == 2
    values = [v for ax in heat_maps for v in _image_values(ax)]
    assert min(values) == pytest.approx(-2.62) and max(values) == pytest.approx(0.75)
    norm = heat_maps[0].get_images()[0].norm
    assert norm.vmin is not None and norm.vmax is not None
    assert norm.vmin <= min(values) and norm.vmax >= max(values)  # nothing clipped
    assert norm(0.0) == pytest.approx(0.5)  # a tie is the middle colour
    # 4x faster and 4x slower are equally far from the middle
    assert norm(0.75) - 0.5 == pytest.approx(0.5 - norm(-3.0))
    assert float(norm(-2.62)) > 0.0 and float(norm(0.75)) < 1.0


def test_heat_map_has_axis_titles_a_colour_bar_and_readable_cells() -> None:
    ttca, _ = _ttca(FACTORS)
    fig = improvement_figure("laar", ttca)
    assert fig is not None
    heat_maps = [ax for ax in fig.axes if ax.get_images()]
    assert heat_maps[0].get_ylabel() == "language"
    assert all(ax.get_xlabel() == "context length" for ax in heat_maps)
    assert [ax.get_title() for ax in heat_maps] == ["laar vs least-load", "laar vs load-aware"]
    colour_bar = next(ax for ax in fig.axes if ax not in heat_maps)
    assert "TTCA(laar)" in colour_bar.get_ylabel()
    title = fig.get_suptitle()
    assert title.count("laar: TTCA improvement of laar") == 0 and "router laar" in title
    cells = {t.get_text(): t.get_color() for t in heat_maps[0].texts}
    assert {"+75%", "-262%", "+0%"} <= set(cells)
    assert cells["-262%"] == "white" and cells["+75%"] == "white"  # dark ends
    assert cells["+0%"] == "black"  # the pale middle


def test_improvement_norm_keeps_ties_pale_and_covers_wide_data() -> None:
    tie = improvement_norm([0.0])
    assert tie.vmin is not None and tie.vmin < 0.0 < tie.vmax  # type: ignore[operator]
    wide = improvement_norm([-9.0, 0.5])  # 10x slower
    assert wide.vmin is not None and wide.vmin <= -9.0


def test_success_figure_legend_is_outside_the_panels() -> None:
    ttca, records = _ttca(FACTORS)
    fig = _drawn(success_figure("laar", ttca, records))
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 3 and panels[0].get_ylabel()
    assert all(ax.get_xlabel() for ax in panels)
    (legend,) = _legends(fig)
    assert [t.get_text() for t in legend.get_texts()] == ["laar", "least-load", "load-aware"]
    assert not _overlaps(legend, panels)
    assert f"k = 1..{R}" in fig.get_suptitle()


# ---- the forest plot and the tuner's trajectory --------------------------------------


def _arm(label: str, low: float, median: float, high: float) -> ArmStats:
    ratio = PairedRatio((median,) * 5, Estimate(median, (low, high), 5, 0.95), num_wins=0)
    metric = MetricStats((1.0,) * 5, Estimate(1.0, (0.5, 1.5), 5, 0.95), ratio)
    return ArmStats(label, label, {}, (0, 1, 2, 3, 4), {"ttft_p95_s": metric})


def test_forest_plot_explains_its_colours_and_labels_its_axes() -> None:
    arms = [_arm("fast", 0.3, 0.5, 0.7), _arm("slow", 2.0, 3.0, 5.0), _arm("tie", 0.8, 1.0, 1.2)]
    fig = forest_figure(
        {("default", None, 1.0, "base"): arms}, ["ttft_p95_s"], reference="gorgo", confidence=0.95
    )
    assert fig is not None
    fig = _drawn(fig)
    (ax,) = fig.axes
    assert "gorgo" in ax.get_xlabel() and ax.get_ylabel() == "router"
    (legend,) = _legends(fig)
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[0].startswith("better than gorgo") and texts[1].startswith("worse than gorgo")
    assert not _overlaps(legend, [ax])


def test_tuner_trajectory_legends_are_under_the_panels() -> None:
    steps = [
        TunerStep(i, 10.0 * i, {"a": 1.0 / (i + 1), "b": 0.5}, 1.0 - 0.01 * i, 0.1, i % 2 == 0,
                  {"a": 1.0 / (i + 1), "b": 0.5}, 1.0 - 0.01 * i)
        for i in range(20)
    ]  # fmt: skip
    fig = _drawn(trajectory_figure("router r tuned on scenario s, window w", "ttft-p95", steps))
    assert len(fig.axes) == 2
    for ax in fig.axes:
        _assert_labelled(ax)
    legends = _legends(fig)
    assert len(legends) == 2 and not any(_overlaps(lg, fig.axes) for lg in legends)
