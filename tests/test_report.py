"""Tests for longroute.metrics.report: JSON, CSV, plots and the rich table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from rich.console import Console

from longroute.metrics.records import RequestRecord
from longroute.metrics.report import CSV_COLUMNS, summary_json, write_report
from longroute.metrics.summary import SUMMARY_KEYS, summarize
from longroute.metrics.summary_tables import summary_tables
from longroute.types import SLO

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BOLD_GREEN = "\x1b[1;32m"


def rec(
    request_id: str, router: str, endpoint: str, ttft_s: float, *, n_out: int = 4
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        session_id="s1" if request_id.endswith("0") else None,
        router=router,
        endpoint=endpoint,
        model="m",
        region="us",
        arrival_s=1.0,
        dispatch_s=1.01,
        first_token_s=1.0 + ttft_s,
        finish_s=2.0 + 2 * ttft_s,
        num_prompt_tokens=1000,
        num_cached_tokens=250,
        num_output_tokens=n_out,
        slo=SLO(ttft_s=0.5) if request_id.endswith("1") else None,
    )


def records_by_router() -> dict[str, list[RequestRecord]]:
    return {
        "round_robin": [
            rec(f"rr{i}", "round_robin", f"ep{i % 3}", 0.1 * (i + 1)) for i in range(6)
        ],
        "prefix_aware": [
            rec(f"pa{i}", "prefix_aware", "ep0" if i < 4 else "ep1", 0.05 * (i + 1), n_out=1 + i)
            for i in range(5)
        ],
    }


def summaries_of(
    by_router: dict[str, list[RequestRecord]],
) -> dict[str, dict[str, float | int | None]]:
    return {router: summarize(records) for router, records in by_router.items()}


def render(tables: list[object], *, styles: bool) -> str:
    console = Console(record=True, width=100, force_terminal=styles, color_system="standard")
    for table in tables:
        console.print(table)
    return console.export_text(styles=styles)


def test_summary_json_is_stable_and_valid() -> None:
    summaries = summaries_of(records_by_router())
    text = summary_json("chat", 7, summaries)
    data = json.loads(text)
    assert set(data) == {"scenario", "seed", "routers"}
    assert data["scenario"] == "chat"
    assert data["seed"] == 7
    assert list(data["routers"]) == ["prefix_aware", "round_robin"]
    for summary in data["routers"].values():
        assert set(summary) == set(SUMMARY_KEYS)
    assert "\n" not in text
    assert summary_json("chat", 7, summaries_of(records_by_router())) == text
    reordered = {router: summaries[router] for router in reversed(list(summaries))}
    assert summary_json("chat", 7, reordered) == text
    assert summary_json("chat", 8, summaries) != text


def test_summary_json_rejects_nan() -> None:
    summaries = {"r": {"ttft_p50_s": float("nan")}}
    with pytest.raises(ValueError):
        summary_json("chat", 1, summaries)


def test_write_report_creates_all_files(tmp_path: Path) -> None:
    by_router = records_by_router()
    by_router["idle"] = []
    summaries = summaries_of(by_router)
    out_dir = tmp_path / "nested" / "report"
    paths = write_report(
        out_dir,
        scenario="chat",
        seed=3,
        summaries=summaries,
        records_by_router=by_router,
        extra={"config": {"num_endpoints": 3}},
    )
    names = ["summary.json", "requests.csv", "ttft_cdf.png", "e2e_cdf.png", "per_endpoint.png"]
    assert paths == [out_dir / name for name in names]
    for path in paths[2:]:
        data = path.read_bytes()
        assert len(data) > 1000
        assert data.startswith(PNG_SIGNATURE)

    payload = json.loads((out_dir / "summary.json").read_text())
    assert payload["scenario"] == "chat"
    assert payload["seed"] == 3
    assert payload["config"] == {"num_endpoints": 3}
    assert payload["routers"]["idle"]["num_requests"] == 0
    assert payload["routers"]["round_robin"] == summaries["round_robin"]


def test_requests_csv_rows(tmp_path: Path) -> None:
    by_router = records_by_router()
    write_report(
        tmp_path,
        scenario="chat",
        seed=3,
        summaries=summaries_of(by_router),
        records_by_router=by_router,
    )
    with (tmp_path / "requests.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    assert header == list(CSV_COLUMNS)
    assert header[0] == "router"
    assert {"request_id", "ttft_s", "tpot_s", "e2e_s", "slo_ttft_s"} <= set(header)
    assert len(body) == 11
    col = {name: i for i, name in enumerate(header)}
    assert [row[col["request_id"]] for row in body[:2]] == ["rr0", "rr1"]
    first_pa = body[6]
    assert first_pa[col["router"]] == "prefix_aware"
    assert first_pa[col["tpot_s"]] == ""  # one output token
    assert float(first_pa[col["ttft_s"]]) == pytest.approx(0.05)
    assert first_pa[col["session_id"]] == "s1"
    assert body[1][col["slo_ttft_s"]] == "0.5"
    assert body[1][col["session_id"]] == ""


def test_write_report_is_deterministic(tmp_path: Path) -> None:
    by_router = records_by_router()
    summaries = summaries_of(by_router)
    first = write_report(
        tmp_path / "a", scenario="s", seed=1, summaries=summaries, records_by_router=by_router
    )
    second = write_report(
        tmp_path / "b", scenario="s", seed=1, summaries=summaries, records_by_router=by_router
    )
    for path_a, path_b in zip(first, second, strict=True):
        assert path_a.read_bytes() == path_b.read_bytes(), path_a.name


def test_write_report_rejects_mismatched_inputs(tmp_path: Path) -> None:
    by_router = records_by_router()
    summaries = summaries_of(by_router)
    with pytest.raises(ValueError, match="prefix_aware"):
        write_report(
            tmp_path,
            scenario="s",
            seed=1,
            summaries={"round_robin": summaries["round_robin"]},
            records_by_router=by_router,
        )
    with pytest.raises(ValueError, match="scenario"):
        write_report(
            tmp_path,
            scenario="s",
            seed=1,
            summaries=summaries,
            records_by_router=by_router,
            extra={"scenario": "other"},
        )
    misfiled = {"round_robin": by_router["prefix_aware"], "prefix_aware": by_router["round_robin"]}
    with pytest.raises(ValueError, match="filed under"):
        write_report(
            tmp_path, scenario="s", seed=1, summaries=summaries, records_by_router=misfiled
        )
    assert list(tmp_path.iterdir()) == []  # validation happens before any file is written


def test_summary_table_formats_and_names_routers() -> None:
    summaries = summaries_of(records_by_router())
    text = render(summary_tables(summaries, title="chat: 2 routers"), styles=False)
    assert "chat: 2 routers" in text
    assert "round_robin" in text
    assert "prefix_aware" in text
    # round_robin TTFTs 0.1..0.6 s -> p50 0.350 s (prefix_aware's 0.150 s sets 3 decimals)
    assert " 0.350 " in text and " 0.150 " in text
    assert " 25.0 " in text  # cache hit, in %
    assert "(req/s)" in text and "(%)" in text and "(s)" in text
    assert " ms " not in text and "%  " not in text  # units only in the headers


def test_summary_table_highlights_best_per_column() -> None:
    base = dict.fromkeys(SUMMARY_KEYS)
    fast = {
        **base,
        "num_requests": 10,
        "ttft_p50_s": 0.25,
        "cache_hit_ratio": 0.2,
        "load_concentration": 0.9,
        "e2e_p50_s": 3.0,
    }
    slow = {
        **base,
        "num_requests": 10,
        "ttft_p50_s": 2.5,
        "cache_hit_ratio": 0.8,
        "load_concentration": 0.5,
    }
    text = render(summary_tables({"fast": fast, "slow": slow}, title="t"), styles=True)
    assert f"{BOLD_GREEN}0.250" in text  # lower TTFT wins
    assert f"{BOLD_GREEN}2.500" not in text
    assert f"{BOLD_GREEN}80.0" in text  # higher cache hit wins
    assert f"{BOLD_GREEN}20.0" not in text
    assert f"{BOLD_GREEN}50.0" in text  # lower load concentration wins
    assert f"{BOLD_GREEN}90.0" not in text
    # a column with a single value has nothing to compare: no highlight
    assert f"{BOLD_GREEN}3.00" not in text
    assert "3.00" in text
    assert f"{BOLD_GREEN}10" not in text  # request count is not ranked
    assert "—" in text


def test_summary_table_escapes_markup_in_router_names() -> None:
    summaries = {"[bold]r1": dict.fromkeys(SUMMARY_KEYS)}
    text = render(summary_tables(summaries, title="t"), styles=False)
    assert "[bold]r1" in text


def test_summary_table_missing_key_raises() -> None:
    with pytest.raises(ValueError, match="ttft_p50_s"):
        summary_tables({"r": {"num_requests": 1}}, title="t")


def test_cdf_thinning_keeps_plots_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("longroute.metrics.plots.CDF_MAX_POINTS", 3)
    by_router = records_by_router()
    paths = write_report(
        tmp_path,
        scenario="s",
        seed=1,
        summaries=summaries_of(by_router),
        records_by_router=by_router,
    )
    assert (tmp_path / "ttft_cdf.png").read_bytes().startswith(PNG_SIGNATURE)
    assert len(paths) == 5
