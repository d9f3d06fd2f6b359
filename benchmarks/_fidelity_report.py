"""Metrics, errors, rankings and tables of benchmarks/sim_fidelity.py (pure)."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from longroute.metrics.records import RequestRecord

#: the compared metrics, in table order; the first five are the goals
GOAL_METRICS = ("ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90", "cache_hit_ratio")
DIAGNOSTICS = ("tpot_p50", "busiest_share", "mean_prompt_tokens", "mean_output_tokens")
TARGET_ERROR = 0.15

Metrics = dict[str, float]


def metrics(records: Sequence[RequestRecord]) -> Metrics:
    """The compared figures of one run: latency percentiles (s), the token-weighted cache
    hit ratio (cached / prompt tokens), median TPOT (s) and mean lengths."""
    ttft = np.array([r.ttft_s for r in records])
    e2e = np.array([r.e2e_s for r in records])
    tpots = [t for r in records if (t := r.tpot_s) is not None]
    num_prompt = sum(r.num_prompt_tokens for r in records)
    per_engine: dict[str, int] = {}
    for r in records:
        per_engine[r.endpoint] = per_engine.get(r.endpoint, 0) + 1
    return {
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "e2e_p50": float(np.percentile(e2e, 50)),
        "e2e_p90": float(np.percentile(e2e, 90)),
        "cache_hit_ratio": sum(r.num_cached_tokens for r in records) / max(num_prompt, 1),
        "tpot_p50": float(np.percentile(tpots, 50)) if tpots else float("nan"),
        # the share of requests the busier engine served (0.5: balanced)
        "busiest_share": max(per_engine.values()) / len(records),
        "mean_prompt_tokens": num_prompt / len(records),
        "mean_output_tokens": statistics.mean(r.num_output_tokens for r in records),
        "num_requests": float(len(records)),
    }


def write_records(path: Path, records: Sequence[RequestRecord]) -> None:
    """Per request, for the record: id, engine, arrival, TTFT, E2E (s) and token counts."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["request_id", "session_id", "endpoint", "arrival_s", "ttft_s", "e2e_s",
                      "prompt_tokens", "cached_tokens", "output_tokens"])  # fmt: skip
        for r in sorted(records, key=lambda r: r.arrival_s):
            out.writerow([r.request_id, r.session_id, r.endpoint, f"{r.arrival_s:.4f}",
                          f"{r.ttft_s:.4f}", f"{r.e2e_s:.4f}", r.num_prompt_tokens,
                          r.num_cached_tokens, r.num_output_tokens])  # fmt: skip


def relative_errors(model: Metrics, real: Metrics) -> Metrics:
    """(model - real) / real per metric: signed, so the table says which way it is off."""
    return {k: (model[k] - real[k]) / real[k] if real[k] else float("nan") for k in real}


def median_metrics(runs: Sequence[Metrics]) -> Metrics:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def ranking(by_router: Mapping[str, Metrics], metric: str) -> list[str]:
    """Routers from best (lowest; highest for the hit ratio) to worst by ``metric``."""
    sign = -1.0 if metric == "cache_hit_ratio" else 1.0
    return sorted(by_router, key=lambda r: sign * by_router[r][metric])


def _cell(value: float, metric: str) -> str:
    if metric in ("cache_hit_ratio", "busiest_share"):
        return f"{value:.3f}"
    if metric.startswith("mean_"):
        return f"{value:.0f}"
    return f"{1000 * value:.0f}ms"


def table(
    title: str,
    real: Mapping[tuple[str, str], Metrics],
    models: Mapping[str, Mapping[tuple[str, str], Metrics]],
) -> str:
    """One row per (router, load) and metric: vLLM's value, then each model's value and
    signed relative error; within 100 columns."""
    names = list(models)
    head = f"{'router/load':<22}{'metric':<19}{'vLLM':>9}"
    for n in names:
        head += f"{n:>11}{'err':>8}"
    lines = [title, head, "-" * len(head)]
    for key in real:
        for metric in (*GOAL_METRICS, *DIAGNOSTICS):
            row = f"{'/'.join(key):<22}{metric:<19}{_cell(real[key][metric], metric):>9}"
            for n in names:
                m = models[n][key]
                err = (m[metric] - real[key][metric]) / real[key][metric]
                row += f"{_cell(m[metric], metric):>11}{100 * err:>+7.1f}%"
            lines.append(row)
    return "\n".join(lines)


def goals(
    real: Mapping[tuple[str, str], Metrics], model: Mapping[tuple[str, str], Metrics]
) -> dict[str, dict[str, object]]:
    """One goal per metric: the worst |relative error| over routers x loads <= 15%; and
    the router ranking: the same order by every goal metric at every load."""
    out: dict[str, dict[str, object]] = {}
    for metric in GOAL_METRICS:
        errs = {"/".join(k): relative_errors(model[k], real[k])[metric] for k in real}
        worst_key = max(errs, key=lambda k: abs(errs[k]))
        worst = abs(errs[worst_key])
        out[metric] = {
            "target": "<= 15%",
            "worst_error": round(worst, 4),
            "worst_at": worst_key,
            "errors": {k: round(v, 4) for k, v in errs.items()},
            "met": bool(worst <= TARGET_ERROR),
        }
    loads = sorted({load for _, load in real})
    orders: dict[str, dict[str, object]] = {}
    is_same = True
    for load in loads:
        real_load = {r: m for (r, ld), m in real.items() if ld == load}
        model_load = {r: m for (r, ld), m in model.items() if ld == load}
        for metric in GOAL_METRICS:
            a, b = ranking(real_load, metric), ranking(model_load, metric)
            orders[f"{load}/{metric}"] = {"vllm": a, "model": b, "same": a == b}
            is_same = is_same and a == b
    out["router_ranking"] = {"target": "same order", "met": is_same, "orders": orders}
    return out
