"""Human- and machine-readable reports comparing routers on one scenario.

Called once at the end of a simulator or load-generator run, with one summary
(from ``longroute.metrics.summary.summarize``) and one record list per router.
Router order is the caller's mapping order everywhere (table rows, CSV rows,
legend entries), so equal inputs give byte-identical JSON and CSV output.
Figures come from ``plots``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from operator import attrgetter
from pathlib import Path
from typing import Literal

from rich.markup import escape
from rich.table import Table

from longroute.metrics.plots import endpoint_plot, latency_cdf_plot
from longroute.metrics.records import RequestRecord
from longroute.metrics.ttca import TtcaSummary
from longroute.metrics.ttca_plots import improvement_plot, success_plot
from longroute.metrics.ttca_report import comparison_json, write_setting_csv
from longroute.types import SLO

SummaryMap = Mapping[str, Mapping[str, float | int | None]]
TtcaMap = Mapping[str, TtcaSummary]
Better = Literal["lower", "higher"] | None

MISSING = "—"
BEST_STYLE = "bold green"
_RESERVED_JSON_KEYS = frozenset({"scenario", "seed", "routers", "ttca_comparison"})


def format_seconds(value: float | int | None) -> str:
    """Durations below one second in ms (1 decimal), longer ones in s (2 decimals)."""
    if value is None:
        return MISSING
    if abs(value) < 1.0:
        return f"{value * 1000.0:.1f} ms"
    return f"{value:.2f} s"


def format_percent(value: float | int | None) -> str:
    """A ratio in [0, 1] as a percentage with one decimal."""
    return MISSING if value is None else f"{value * 100.0:.1f}%"


def format_rate(value: float | int | None) -> str:
    return MISSING if value is None else f"{value:.2f} req/s"


def format_count(value: float | int | None) -> str:
    return MISSING if value is None else f"{int(value)}"


# (header, summary key, formatter, which direction is better)
_COLUMNS: tuple[tuple[str, str, Callable[[float | int | None], str], Better], ...] = (
    ("requests", "num_requests", format_count, None),
    ("TTFT p50", "ttft_p50_s", format_seconds, "lower"),
    ("TTFT p95", "ttft_p95_s", format_seconds, "lower"),
    ("TTFT p99", "ttft_p99_s", format_seconds, "lower"),
    ("TPOT p50", "tpot_p50_s", format_seconds, "lower"),
    ("E2E p50", "e2e_p50_s", format_seconds, "lower"),
    ("E2E p95", "e2e_p95_s", format_seconds, "lower"),
    ("E2E p99", "e2e_p99_s", format_seconds, "lower"),
    ("throughput", "throughput_req_per_s", format_rate, "higher"),
    ("cache hit", "cache_hit_ratio", format_percent, "higher"),
    ("SLO", "slo_attainment", format_percent, "higher"),
    ("load conc.", "load_concentration", format_percent, "lower"),
)


def _column_value(summaries: SummaryMap, router: str, key: str) -> float | int | None:
    summary = summaries[router]
    if key not in summary:
        raise ValueError(f"summary of router {router!r} has no key {key!r}")
    return summary[key]


def _best(values: Sequence[float | int | None], better: Better) -> float | int | None:
    """Best value of a column; None if fewer than two routers have a value to compare."""
    present = [v for v in values if v is not None]
    if better is None or len(present) < 2:
        return None
    return min(present) if better == "lower" else max(present)


# TTCA columns, shown only when answers were checked
_TTCA_COLUMNS: tuple[tuple[str, str, Callable[[float | int | None], str], Better], ...] = (
    ("mean TTCA", "mean_s", format_seconds, "lower"),
    ("final success", "final_success", format_percent, "higher"),
    ("censored", "num_censored", format_count, "lower"),
)


def _ttca_value(ttca: TtcaMap, router: str, key: str) -> float | int | None:
    summary = ttca.get(router)
    if summary is None:
        return None
    value: float | int = getattr(summary, key)
    return value


def summary_table(
    summaries: SummaryMap,
    *,
    title: str,
    row_header: str = "router",
    ttca: TtcaMap | None = None,
) -> Table:
    """One row per router; the best value of each comparable column in bold green.

    Latencies and load concentration: lower is better; throughput, cache hit
    ratio and SLO attainment: higher is better. Ties are all highlighted; a
    column with fewer than two values highlights nothing. Missing data is "—".
    With ``ttca`` (non-empty), three more columns: mean TTCA, final success
    rate and censored queries.
    """
    table = Table(title=title)
    table.add_column(row_header, style="bold")
    columns = [(h, fmt, b) for h, _, fmt, b in _COLUMNS]
    if ttca:
        columns += [(h, fmt, b) for h, _, fmt, b in _TTCA_COLUMNS]
    for header, _, _ in columns:
        table.add_column(header, justify="right")
    routers = list(summaries)
    cells: dict[str, list[str]] = {router: [escape(router)] for router in routers}
    value_rows = [
        [_column_value(summaries, router, key) for router in routers] for _, key, _, _ in _COLUMNS
    ]
    if ttca:
        value_rows += [
            [_ttca_value(ttca, router, key) for router in routers] for _, key, _, _ in _TTCA_COLUMNS
        ]
    for (_, fmt, better), values in zip(columns, value_rows, strict=True):
        best = _best(values, better)
        for router, value in zip(routers, values, strict=True):
            text = fmt(value)
            is_best = best is not None and value == best
            cells[router].append(f"[{BEST_STYLE}]{text}[/]" if is_best else text)
    for router in routers:
        table.add_row(*cells[router])
    return table


def summary_json(
    scenario: str, seed: int, summaries: SummaryMap, ttca: TtcaMap | None = None
) -> str:
    """The one-line JSON printed for ``--json``; byte-identical for equal inputs.

    With ``ttca``, each such router's object gains a ``ttca`` object
    (``TtcaSummary.to_dict``), and a top-level ``ttca_comparison`` compares
    the first "laar*" router with the others (when there is one).
    """
    payload = _payload(scenario, seed, summaries, ttca)
    return json.dumps(payload, sort_keys=True, allow_nan=False)


def _payload(
    scenario: str, seed: int, summaries: SummaryMap, ttca: TtcaMap | None
) -> dict[str, object]:
    routers: dict[str, dict[str, object]] = {
        router: dict(summary) for router, summary in summaries.items()
    }
    payload: dict[str, object] = {"scenario": scenario, "seed": seed, "routers": routers}
    if ttca:
        for router, summary in ttca.items():
            routers[router]["ttca"] = summary.to_dict()
        comparison = comparison_json(ttca)
        if comparison is not None:
            payload["ttca_comparison"] = comparison
    return payload


def write_report(
    out_dir: Path,
    *,
    scenario: str,
    seed: int,
    summaries: SummaryMap,
    records_by_router: Mapping[str, Sequence[RequestRecord]],
    extra: Mapping[str, object] | None = None,
    ttca: TtcaMap | None = None,
) -> list[Path]:
    """Write summary.json, requests.csv and three PNG plots into ``out_dir``.

    ``summaries`` and ``records_by_router`` must name the same routers, and
    every record must carry the router it is filed under. ``extra`` adds
    top-level keys to summary.json (not "scenario", "seed", "routers" or
    "ttca_comparison"). With ``ttca`` (non-empty; routers named in
    ``summaries``), summary.json gains what ``summary_json`` adds, and
    ttca_by_setting.csv, ttca_success.png and (with a "laar*" router and
    another) ttca_improvement.png follow. Returns the written paths in the
    order listed above.
    """
    _check_routers(summaries, records_by_router)
    if ttca and not set(ttca) <= set(summaries):
        raise ValueError(f"ttca names routers {sorted(set(ttca) - set(summaries))} not summarized")
    payload = _payload(scenario, seed, summaries, ttca)
    if extra is not None:
        clash = sorted(_RESERVED_JSON_KEYS.intersection(extra))
        if clash:
            raise ValueError(
                f"extra keys {clash} clash with reserved keys {sorted(_RESERVED_JSON_KEYS)}"
            )
        payload.update(extra)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "summary.json"
    text = json.dumps(payload, sort_keys=True, indent=2, allow_nan=False)
    json_path.write_text(text + "\n", encoding="utf-8")
    paths = [json_path, _write_csv(out_dir / "requests.csv", records_by_router)]
    for name, metric in (("ttft", "TTFT"), ("e2e", "E2E latency")):
        path = out_dir / f"{name}_cdf.png"
        latency_s = attrgetter(f"{name}_s")
        paths.append(latency_cdf_plot(path, scenario, metric, latency_s, records_by_router))
    paths.append(endpoint_plot(out_dir / "per_endpoint.png", scenario, records_by_router))
    if ttca:
        paths.append(write_setting_csv(out_dir / "ttca_by_setting.csv", ttca))
        paths.append(success_plot(out_dir / "ttca_success.png", scenario, ttca, records_by_router))
        heat = improvement_plot(out_dir / "ttca_improvement.png", scenario, ttca)
        if heat is not None:
            paths.append(heat)
    return paths


def _check_routers(
    summaries: SummaryMap, records_by_router: Mapping[str, Sequence[RequestRecord]]
) -> None:
    """Raise before anything is written if the inputs disagree on router names."""
    if set(summaries) != set(records_by_router):
        raise ValueError(
            f"summaries name routers {sorted(summaries)} but records_by_router names "
            f"{sorted(records_by_router)}"
        )
    for router, records in records_by_router.items():
        for record in records:
            if record.router != router:
                raise ValueError(
                    f"record {record.request_id!r} of router {record.router!r} "
                    f"is filed under router {router!r}"
                )


_SLO_FIELDS = tuple(f.name for f in fields(SLO))
_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord) if f.name not in ("router", "slo"))
CSV_COLUMNS: tuple[str, ...] = (
    "router",
    *_RECORD_FIELDS,
    *(f"slo_{name}" for name in _SLO_FIELDS),
    "ttft_s",
    "tpot_s",
    "e2e_s",
)


_get_record_fields = attrgetter(*_RECORD_FIELDS)
_get_slo_fields = attrgetter(*_SLO_FIELDS)
_NO_SLO: tuple[None, ...] = (None,) * len(_SLO_FIELDS)


def _csv_row(record: RequestRecord) -> tuple[object, ...]:
    slo = record.slo
    return (
        record.router,
        *_get_record_fields(record),
        *(_NO_SLO if slo is None else _get_slo_fields(slo)),
        record.ttft_s,
        record.tpot_s,
        record.e2e_s,
    )


def _write_csv(path: Path, records_by_router: Mapping[str, Sequence[RequestRecord]]) -> Path:
    """One row per record (None as an empty cell), routers in mapping order."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for records in records_by_router.values():
            writer.writerows(map(_csv_row, records))
    return path
