"""Every result table fits 100 columns, names routers in full and puts units in its headers."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from longroute.bench.options import BenchResult, Target, TargetResult
from longroute.bench.report import print_result
from longroute.cli import app
from longroute.demo.cli import _fleet_table
from longroute.metrics.summary import SUMMARY_KEYS
from longroute.metrics.summary_tables import summary_tables
from longroute.metrics.tables import TABLE_WIDTH, format_column, format_number, header
from longroute.metrics.ttca import SettingTtca, TtcaSummary
from longroute.metrics.ttca_tables import setting_tables
from longroute.metrics.tuning_report import tuning_summary, tuning_table
from longroute.metrics.window_report import WindowSummary
from longroute.metrics.window_tables import comparison_tables, window_tables
from longroute.tune_cli import _weights_line
from longroute.tuning import FrozenWeights, TunerStep
from longroute.types import Language
from sweep_helpers import write_tiny

ROUTERS = ("gorgo", "least-load", "least-request", "load-aware", "prefix-cache", "random",
           "round-robin", "session-affinity")  # fmt: skip
# the default scenario's figures, seed 0 (TTFT p95 from 1.67 to 250.83 s)
TTFT_P95_S = (2.12, 1.67, 5.32, 6.27, 13.49, 66.02, 250.83, 155.38)


def render(tables: list[Table], width: int = TABLE_WIDTH) -> str:
    console = Console(width=width, record=True, color_system=None)
    for table in tables:
        console.print(table)
    return console.export_text()


def assert_readable(text: str, names: tuple[str, ...] = ROUTERS, width: int = TABLE_WIDTH) -> None:
    """Within ``width`` columns, nothing cut ("…"), every name in full, on one line."""
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line.rstrip()) > width]
    assert not too_wide, f"{len(too_wide)} lines over {width} columns:\n" + "\n".join(too_wide)
    assert "…" not in text, text
    for name in names:
        assert any(name in line for line in lines), f"{name!r} is not in full on a line:\n{text}"


def assert_no_units_in_cells(text: str) -> None:
    body = [line for line in text.splitlines() if "│" in line and "┼" not in line]
    assert body
    for line in body:
        assert " ms " not in line and " s " not in line and "%" not in line, line
        assert "req/s" not in line, line


def summary(i: int) -> dict[str, float | int | None]:
    values: dict[str, float | int | None] = dict.fromkeys(SUMMARY_KEYS, 0.5)
    values.update(
        num_requests=4000,
        ttft_p50_s=0.1143 + 0.02 * i,
        ttft_p95_s=TTFT_P95_S[i],
        ttft_p99_s=3 * TTFT_P95_S[i],
        tpot_p50_s=0.0108,
        e2e_p99_s=352.23 - i,
        throughput_req_per_s=4.61,
    )
    return values


def ttca_summary(scale: float) -> TtcaSummary:
    settings = tuple(
        SettingTtca(edge, language, 50, scale * edge / 1000.0, 0.9, 1.5)
        for edge in (4096, 8192, 16384, 32768, 65536)
        for language in (Language.CJK, Language.JAPANESE, Language.LATIN)
    )
    return TtcaSummary(10, 750, 19.51 * scale, 12.0, 72.1, 75, (0.5,) * 9 + (0.9,),
                       (1.0,) * 10, 2.5, settings)  # fmt: skip


def test_simulate_tables_fit_100_columns_with_units_in_the_headers() -> None:
    summaries = {router: summary(i) for i, router in enumerate(ROUTERS)}
    text = render(summary_tables(summaries, title="default (seed 0, 4000 requests)"))
    assert_readable(text)
    assert_no_units_in_cells(text)
    for unit in ("(s)", "(ms)", "(req/s)", "(%)"):
        assert unit in text
    assert "TTFT p95" in text and "SLO met" in text and "load conc.:" in text  # caption
    # one number of decimals per column, enough for the smallest value: 1.67 -> 2
    assert " 250.83 " in text and " 1.67 " in text and " 10.8 " in text  # TPOT in ms


def test_tables_stay_legible_at_80_columns() -> None:
    summaries = {router: summary(i) for i, router in enumerate(ROUTERS)}
    windows = [_window("full", 1.0), _window("multi-session-contextpilot", 0.3333, "full")]
    names = ("laar", "load-aware", "session-affinity", "least-load")
    ttca = {name: ttca_summary(1.0 + i) for i, name in enumerate(names)}
    tables = [
        *summary_tables(summaries, title="t"),
        *window_tables(windows, reference="gorgo"),
        *comparison_tables(windows),
        *setting_tables(ttca),
    ]
    assert_readable(render(tables, width=80), (*ROUTERS, *names), width=80)


def test_ttca_tables_fit_and_name_each_router() -> None:
    names = ("laar", "load-aware", "session-affinity", "least-load")
    ttca = {name: ttca_summary(1.0 + i) for i, name in enumerate(names)}
    summaries = {name: summary(i) for i, name in enumerate(names)}
    text = render([*summary_tables(summaries, title="laar", ttca=ttca), *setting_tables(ttca)])
    assert_readable(text, names)
    assert "mean TTCA" in text and "(tokens)" in text and "laar /" in text
    assert "0.50×" in text  # laar over load-aware, per setting


def _window(name: str, scale: float, baseline: str | None = None) -> WindowSummary:
    routers = {router: summary(i) for i, router in enumerate(ROUTERS)}
    return WindowSummary(name, scale, 1800.0, name == "full", 20467, routers, baseline)


def test_window_tables_fit_and_explain_the_load_scale() -> None:
    windows = [_window("full", 1.0), _window("third", 0.3333)]
    text = render(window_tables(windows, reference="gorgo", is_tuned=True))
    assert_readable(text, (*ROUTERS, "gorgo / best"))
    assert_no_units_in_cells(text)
    assert "window third: load ×0.333, 1800 s, 20467 requests, held out" in text
    assert "in-sample" in text and "load ×k: the window's arrival rate is k times" in text
    assert "x0.3333" not in text
    untuned = render(window_tables(windows, reference="gorgo", is_tuned=False))
    assert "held out" not in untuned and "in-sample" not in untuned


def test_window_comparison_tables_fit() -> None:
    windows = [_window("multi-session-off", 1.0), _window("multi-session-contextpilot", 1.0,
                                                          "multi-session-off")]  # fmt: skip
    text = render(comparison_tables(windows))
    assert_readable(text)
    assert "(tokens)" in text and "baseline" in text and "ratio" in text


def test_weights_line_says_untuned_and_rounds_frozen_weights() -> None:
    from longroute.sim.scenario import load_scenario

    config = load_scenario("gorgo")
    assert "gorgo untuned" in _weights_line(config, None)
    assert "default" not in _weights_line(config, None)
    frozen = FrozenWeights(
        "gorgo", {"rtt_weight": 0.012345678, "queue_weight": 0.10647390347240392},
        tuned_on={"window": "full"},
    )  # fmt: skip
    line = _weights_line(config, frozen)
    assert "rtt_weight 0.0123, queue_weight 0.106, tuned on window full" in line
    assert "0.1064739" not in line and "{" not in line


def test_tuning_table_rounds_the_weights_and_names_the_objective() -> None:
    start = {"rtt_weight": 1.0, "queue_weight": 1.0}
    tuned = {"rtt_weight": 0.18271234, "queue_weight": 0.10647390347240392}
    trajectory = [
        TunerStep(0, 10.0, start, 2.5, 0.3, True, start, 2.5),
        TunerStep(1, 20.0, tuned, 0.53, 0.3, True, tuned, 0.53),
    ]
    on = {"scenario": "gorgo", "window": "full", "num_requests": 20467, "window_requests": 64}
    frozen = FrozenWeights("gorgo", tuned, objective="ttft-p95", tuned_on=on)
    text = render([tuning_table(frozen, trajectory)])
    assert_readable(text, ("rtt_weight", "queue_weight", "ttft-p95 (s)"))
    rows = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    assert "queue_weight 1.00 0.106" in rows and "ttft-p95 (s) 2.50 0.530" in rows
    assert "0.1064739" not in text
    line = tuning_summary(frozen, trajectory)
    assert line.startswith("gorgo tuned on gorgo/full: 20467 requests, 2 judging windows of 64")


def test_bench_and_demo_tables_fit() -> None:
    def target(label: str, i: int) -> TargetResult:
        return TargetResult(Target("http://127.0.0.1:8000", label), "m", (), (), summary(i), 1.0,
                            True, ttca_summary(1.0 + i))  # fmt: skip

    result = BenchResult("kv-lookup", 0, {"prefix-cache": target("prefix-cache", 0),
                                          "round-robin": target("round-robin", 1)})  # fmt: skip
    console = Console(width=TABLE_WIDTH, record=True, color_system=None)
    console.print(_fleet_table(10.0))
    print_result(console, result)
    text = console.export_text()
    assert_readable(text, ("prefix-cache", "round-robin", "output tokens/s"))
    assert "(ms, emulated)" in text and "TTCA mean" in text and "round-robin /" in text


def test_header_and_number_formats() -> None:
    assert header("TTFT p95", "s") == "TTFT p95\n(s)" and header("requests") == "requests"
    assert format_column([0.1143, 2.12, 250.83]) == ["0.114", "2.120", "250.830"]
    assert format_column([1.67, 250.83, None]) == ["1.67", "250.83", "—"]
    assert format_column([0.0813, 1.9638]) == ["0.081", "1.964"]  # at most 3 decimals
    assert format_number(0.10647390347240392) == "0.106" and format_number(0) == "0"


@pytest.fixture
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI lays tables out for $COLUMNS when set; these tests want the default, 100."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.mark.usefixtures("no_columns")
def test_simulate_output_fits_100_columns(tmp_path: Path) -> None:
    tiny = write_tiny(tmp_path)
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(tiny), "--no-report"])
    assert result.exit_code == 0, result.output
    assert_readable(result.stdout)
    assert_no_units_in_cells(result.stdout)


@pytest.mark.usefixtures("no_columns")
def test_sweep_output_fits_100_columns(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: t\nscenarios: [tiny.yaml]\nseeds: 0-1\nload_scales: [0.5, 1.0]\n"
        "routers: [least-load, least-request, session-affinity, gorgo]\n"
        "router_params: {gorgo: {rtt_weight: [0.1, 0.5]}}\n"
        "metrics: [ttft_p95_s, throughput_req_per_s, slo_attainment]\n",
        encoding="utf-8",
    )
    args = ["sweep", str(spec), "--jobs", "1", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    names = ("least-load", "least-request", "session-affinity", "gorgo(rtt_weight=0.1)")
    assert_readable(result.stdout, names)
    assert "(s, 95% CI)" in result.stdout and "(req/s, 95% CI)" in result.stdout
    assert "x0.5 in a setting: half the scenario's load" in result.stdout
