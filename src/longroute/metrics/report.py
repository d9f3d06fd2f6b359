"""Human- and machine-readable reports comparing routers on one scenario.

Called once at the end of a simulator or load-generator run, with one summary
(from ``longroute.metrics.summary.summarize``) and one record list per router.
Router order is the caller's mapping order everywhere (table rows, CSV rows,
legend entries), so equal inputs give byte-identical JSON and CSV output.
Figures come from ``plots``, the console tables from ``summary_tables``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from operator import attrgetter
from pathlib import Path

from longroute.metrics.plots import endpoint_plot, latency_cdf_plot
from longroute.metrics.records import RequestRecord
from longroute.metrics.ttca import TtcaSummary
from longroute.metrics.ttca_plots import improvement_plot, success_plot
from longroute.metrics.ttca_report import comparison_json, write_setting_csv
from longroute.types import SLO

SummaryMap = Mapping[str, Mapping[str, float | int | None]]
TtcaMap = Mapping[str, TtcaSummary]

_RESERVED_JSON_KEYS = frozenset({"scenario", "seed", "routers", "ttca_comparison"})


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
