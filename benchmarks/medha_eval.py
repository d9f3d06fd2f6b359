"""Medha's capacity and ablation experiments on the simulator (issue 15).

Runs the built-in scenario ``medha`` (Llama-3-8B-1M on 16 A100s, TP8 x SPP2,
ShareGPT-like chat with 5% requests of 128K-1M tokens) once per engine
scheduler, seed and load, exactly as ``longroute simulate --scenario medha
--seed S`` runs it (the same ``run_scenario`` on the same config), and reports
short- and long-request TTFT, decode TPOT and long-request completions per
engine: medians over seeds with 95% bootstrap CIs, and paired per-seed ratios
against Sarathi-FCFS with 2048-token chunks.

    python benchmarks/medha_eval.py                 # 0.75 QPS, seeds 0-4 (~5 min on 2 cores)
    python benchmarks/medha_eval.py --loads 0.25,0.75,1.25,1.75   # the load sweep
    python benchmarks/medha_eval.py --hardware h100 --engines lars,medha   # on H100s

Goals (issue 15), at 0.75 QPS: Medha's short-request TTFT p50 >= 10x and p90
>= 20x lower than Sarathi-FCFS-2048's (median of per-seed ratios); its decode
TPOT p99 (per-request mean TPOT) within t_target + 10%; every long request
completes in every seed; its long-request TTFT p50 at most 1.5x Sarathi-2048's.
Issue 34, item 4 (``item4`` in the JSON, and a short table): Medha's multi-prefill
gain over LARS without it (LARS / Medha short TTFT p50 and p90 per seed: median, 95%
CI, seeds where Medha is lower) at every load, and what a short prefill riding with a
late chunk of a long one costs in the predictor and gets from the packer
(``medha_slack_probe.py``; docs/medha.md explains both).

The last line is one JSON object with every figure and the goals.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Any

from longroute.config import ScenarioConfig
from longroute.estimators.profiles import ProfileError, load_hardware_profile
from longroute.metrics.length_classes import DEFAULT_LONG_MIN_TOKENS, summarize_by_length
from longroute.sim.engine_variants import apply_engine
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sweep.spec import parse_seeds
from longroute.sweep.stats import median_estimate, paired_ratio
from medha_slack_probe import slack_answer

REFERENCE = "sarathi-2048"
MEDHA = "medha"
GOAL_LOAD = 0.75
Job = tuple[float, str, int, int]  # (rate per s, engine, seed, num_sessions)
HARDWARE: str | None = None  # --hardware: every endpoint of the scenario on this GPU
Runs = dict[tuple[float, str], list[dict[str, Any]]]  # (load, engine) -> per-seed metrics


def _config(rate: float, num_sessions: int) -> ScenarioConfig:
    config = load_scenario("medha")
    params = {**config.workload.params, "num_sessions": num_sessions}
    update: dict[str, Any] = {
        "clients": config.clients.model_copy(update={"rate_per_s": rate}),
        "workload": config.workload.model_copy(update={"params": params}),
    }
    if HARDWARE is not None:
        update["fleet"] = [e.model_copy(update={"hardware": HARDWARE}) for e in config.fleet]
    return config.model_copy(update=update)


def run_job(job: Job) -> tuple[Job, dict[str, Any]]:
    """One (load, engine, seed): the scenario's run and its short/long figures."""
    rate, engine, seed, num_sessions = job
    config = apply_engine(_config(rate, num_sessions), engine)
    start = time.perf_counter()
    run = run_scenario(config, seed=seed)
    elapsed_s = time.perf_counter() - start
    (result,) = run.results.values()
    metrics: dict[str, Any] = dict(summarize_by_length(result.records))
    num_long_sent = sum(
        t.num_prompt_tokens >= DEFAULT_LONG_MIN_TOKENS
        for s in run.workload.sessions
        for t in s.turns
    )
    last_arrival_s = max(r.arrival_s for r in result.records)
    metrics["num_long_sent"] = num_long_sent
    metrics["num_long_done_in_window"] = sum(
        r.num_prompt_tokens >= DEFAULT_LONG_MIN_TOKENS and r.finish_s <= last_arrival_s
        for r in result.records
    )
    metrics["num_rejected"] = result.num_rejected
    metrics["num_preemptions"] = result.num_preemptions
    metrics["wall_s"] = elapsed_s
    return job, metrics


def _t_target_s(engine: str) -> float | None:
    params = (load_scenario("medha").engines or {})[engine].batch_packer_params
    value = params.get("t_target_s")
    return None if value is None else float(value)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _est(values: list[float]) -> str:
    if not values:
        return "-"
    e = median_estimate(values)
    if e.ci is None:
        return _fmt(e.median)
    return f"{_fmt(e.median)} [{_fmt(e.ci[0])}, {_fmt(e.ci[1])}]"


TABLES = (
    ("short requests: TTFT, s", (("short_ttft_p50_s", "p50"), ("short_ttft_p90_s", "p90"),
                                 ("short_ttft_p99_s", "p99"))),
    ("long requests: TTFT, s", (("long_ttft_p50_s", "p50"), ("long_ttft_p90_s", "p90"),
                                ("long_e2e_p50_s", "E2E p50"))),
    ("decodes: per-request TPOT, s", (("tpot_p50_s", "p50"), ("tpot_p99_s", "p99"))),
)  # fmt: skip


def _print_tables(loads: list[float], engines: list[str], by: Runs) -> None:
    """Three narrow tables per load (each under 100 columns): medians over seeds [95% CI]."""
    for rate in loads:
        for title, columns in TABLES:
            print(f"\nmedha at {rate:g} QPS, {title}: median over seeds [95% CI]")
            extra = f"{'long done':>11}" if title.startswith("long") else ""
            print(f"{'engine':<13}" + "".join(f"{h:>24}" for _, h in columns) + extra)
            for engine in engines:
                runs = by[(rate, engine)]
                cells = "".join(
                    f"{_est([m[k] for m in runs if m[k] is not None]):>24}" for k, _ in columns
                )
                if extra:
                    done = sum(m["num_long"] for m in runs)
                    window = sum(m["num_long_done_in_window"] for m in runs)
                    sent = sum(m["num_long_sent"] for m in runs)
                    cells += f"{f'{done}/{sent} ({window})':>11}"
                print(f"{engine:<13}{cells}", flush=True)
        print("long done: completed / sent over all seeds (completed by the last arrival)")


def _ratios(by: Runs, rate: float, engine: str, key: str) -> dict[str, Any] | None:
    """``engine``'s metric over the reference's, per seed (lower is better)."""
    ref = by[(rate, REFERENCE)]
    mine = by[(rate, engine)]
    pairs = [(m[key], r[key]) for m, r in zip(mine, ref, strict=True)]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None and b > 0]
    if not pairs:
        return None
    ratio = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
    e = ratio.estimate
    return {
        "median": e.median,
        "ci": list(e.ci) if e.ci else None,
        "num_wins": ratio.num_wins,
        "num_seeds": ratio.num_seeds,
    }


ABLATION = ("fcfs", "edf", "lrs", "lars", "medha")  # Medha's Fig. 13 (all with time budgets)


def _ablation(by: Runs, rate: float) -> dict[str, Any]:
    """Fig. 13's ranking at ``rate``: engines ordered best first by the median over seeds
    of short TTFT p50 and p90 and long TTFT p90, and the paper's claims checked."""
    names = [e for e in ABLATION if (rate, e) in by]

    def med(engine: str, key: str) -> float:
        values = [m[key] for m in by[(rate, engine)] if m[key] is not None]
        return median_estimate(values).median if values else float("inf")

    out: dict[str, Any] = {}
    for key in ("short_ttft_p50_s", "short_ttft_p90_s", "long_ttft_p90_s"):
        out[key] = sorted(names, key=lambda e: med(e, key))
    if len(names) == len(ABLATION):
        short = out["short_ttft_p90_s"]
        out["claims"] = {
            "fcfs_worst_for_short_p90": short[-1] == "fcfs",
            "edf_worst_for_long_p90_among_slack": max(
                ("edf", "lrs", "lars", "medha"), key=lambda e: med(e, "long_ttft_p90_s")
            )
            == "edf",
            "lars_at_least_edf_short_p90": med("lars", "short_ttft_p90_s")
            <= med("edf", "short_ttft_p90_s"),
            "medha_best_short_p50": out["short_ttft_p50_s"][0] == "medha",
        }
    return out


def _multi_prefill_gain(by: Runs, rate: float) -> dict[str, Any]:
    """Medha's gain over LARS without multi-prefill batching (Fig. 13: 1.6-1.8x on the
    short median): LARS / Medha per seed, median with 95% CI, seeds where Medha is lower."""
    out: dict[str, Any] = {}
    if (rate, "lars") not in by or (rate, MEDHA) not in by:
        return out
    for key in ("short_ttft_p50_s", "short_ttft_p90_s"):
        pairs = [
            (lars[key], medha[key])
            for lars, medha in zip(by[(rate, "lars")], by[(rate, MEDHA)], strict=True)
            if lars[key] is not None and medha[key]
        ]
        if not pairs:
            continue
        ratio = paired_ratio([a for a, _ in pairs], [b for _, b in pairs], is_lower_better=False)
        e = ratio.estimate
        out[key] = {
            "lars_over_medha": e.median,
            "ci": list(e.ci) if e.ci else None,
            "seeds_medha_lower": ratio.num_wins,
            "num_seeds": ratio.num_seeds,
        }
    return out


def _item4(by: Runs, loads: list[float]) -> dict[str, Any]:
    """Issue 34 item 4: the slack the predictor leaves a rider (medha_slack_probe.py)
    and the multi-prefill gain it buys at every load."""
    gains = {f"{rate:g}": _multi_prefill_gain(by, rate) for rate in loads}
    print("\nmulti-prefill gain, LARS / Medha short TTFT p50 (paper Fig. 13: 1.6-1.8x):")
    for rate, gain in gains.items():
        g = gain.get("short_ttft_p50_s")
        if g:
            ci = "[" + ", ".join(f"{x:.2f}" for x in g["ci"]) + "]" if g["ci"] else ""
            lower = f"Medha lower on {g['seeds_medha_lower']} of {g['num_seeds']} seeds"
            print(f"  {rate:>5} QPS  {g['lars_over_medha']:>6.2f}x {ci:<16} {lower}")
    slack = slack_answer()
    print(
        "rider cost in one iteration with a late chunk of a long prefill (50 ms budget"
        + (", the scenario's own A100s, not --hardware):" if HARDWARE else "):")
    )
    for context, a in slack.items():
        print(
            f"  {int(context):>9,} context: chunk {a['late_chunk_tokens']}, rider "
            f"{a['rider_us_per_token_k1']}-{a['rider_us_per_token_k4096']} us/token for "
            f"1-4096 tokens, knee {a['knee_tokens_predictor']} (measured GEMMs: "
            f"{a['knee_tokens_measured_linear']}); 2000-token rider gets "
            f"{a['short_chunk_by_rho']}"
        )
    return {"multi_prefill_gain": gains, "rider_slack": slack}


def _goal(target: str, value: float | None, met: bool | None) -> dict[str, Any]:
    return {"target": target, "value": value, "met": met}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 (at least 5 for goals)")
    parser.add_argument("--loads", default=str(GOAL_LOAD), help="QPS values, comma-separated")
    parser.add_argument("--sessions", type=int, default=None, help="requests per run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--hardware", default=None, help="run the scenario's GPUs as this hardware profile"
    )
    parser.add_argument(
        "--engines", default=None, help=f"a subset of the engines, a,b,... ({REFERENCE} is added)"
    )
    args = parser.parse_args()
    global HARDWARE
    HARDWARE = args.hardware
    seeds = parse_seeds(args.seeds)
    loads = [float(x) for x in args.loads.split(",")]
    base = load_scenario("medha")
    engines = list(base.engines or {})
    if args.engines:
        unknown = sorted(set(args.engines.split(",")) - set(engines))
        if unknown:
            parser.error(f"unknown engine(s) {', '.join(unknown)}; medha has {', '.join(engines)}")
        chosen = set(args.engines.split(",")) | {REFERENCE}  # every ratio is against it
        engines = [e for e in engines if e in chosen]
    if args.hardware is not None:
        try:
            load_hardware_profile(args.hardware)
        except ProfileError as exc:
            parser.error(str(exc))
    num_sessions = args.sessions or int(base.workload.params["num_sessions"])
    jobs: list[Job] = [(r, e, s, num_sessions) for r in loads for e in engines for s in seeds]
    print(
        f"medha: {len(engines)} engines x {len(seeds)} seeds x {len(loads)} loads = "
        f"{len(jobs)} runs of {num_sessions} requests, {args.jobs} processes",
        file=sys.stderr,
        flush=True,
    )
    results: dict[Job, dict[str, Any]] = {}
    start = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(args.jobs) as pool:
        for job, metrics in pool.imap_unordered(run_job, jobs):
            results[job] = metrics
            print(
                f"\r  {len(results)}/{len(jobs)} runs, {time.perf_counter() - start:.0f} s",
                end="",
                file=sys.stderr,
                flush=True,
            )
    print(file=sys.stderr)
    wall_s = time.perf_counter() - start
    by = {(r, e): [results[(r, e, s, num_sessions)] for s in seeds] for r in loads for e in engines}
    _print_tables(loads, engines, by)

    report: dict[str, Any] = {"benchmark": "medha_eval", "seeds": list(seeds), "loads": loads}
    report["wall_s"] = round(wall_s, 1)
    report["runs"] = {
        f"{r:g}/{e}": {k: [m[k] for m in by[(r, e)]] for k in by[(r, e)][0]}
        for r in loads
        for e in engines
    }
    ratios: dict[str, Any] = {}
    for rate in loads:
        for engine in engines:
            for key in ("short_ttft_p50_s", "short_ttft_p90_s", "long_ttft_p50_s"):
                ratios[f"{rate:g}/{engine}/{key}"] = _ratios(by, rate, engine, key)
    report["ratios_vs_" + REFERENCE.replace("-", "_")] = ratios
    report["ablation"] = {f"{rate:g}": _ablation(by, rate) for rate in loads}
    report["item4"] = _item4(by, loads)

    goals: dict[str, Any] = {}
    if GOAL_LOAD in loads and len(seeds) >= 5:
        p50 = ratios[f"{GOAL_LOAD:g}/{MEDHA}/short_ttft_p50_s"]
        p90 = ratios[f"{GOAL_LOAD:g}/{MEDHA}/short_ttft_p90_s"]
        longr = ratios[f"{GOAL_LOAD:g}/{MEDHA}/long_ttft_p50_s"]
        gain50 = 1.0 / p50["median"] if p50 else None
        gain90 = 1.0 / p90["median"] if p90 else None
        goals["short_ttft_p50_gain_vs_sarathi_2048"] = _goal(
            ">= 10x", gain50, None if gain50 is None else gain50 >= 10.0
        )
        goals["short_ttft_p90_gain_vs_sarathi_2048"] = _goal(
            ">= 20x", gain90, None if gain90 is None else gain90 >= 20.0
        )
        medha = by[(GOAL_LOAD, MEDHA)]
        t_target = _t_target_s(MEDHA) or 0.020
        tpot99 = median_estimate([m["tpot_p99_s"] for m in medha]).median
        goals["tpot_p99_within_t_target_plus_10pct"] = _goal(
            f"<= {1.1 * t_target:.3g} s", tpot99, tpot99 <= 1.1 * t_target
        )
        missing = sum(m["num_long_sent"] - m["num_long"] + m["num_rejected"] for m in medha)
        goals["every_long_request_completes"] = _goal("0 missing", missing, missing == 0)
        long_ratio = longr["median"] if longr else None
        goals["long_ttft_p50_vs_sarathi_2048"] = _goal(
            "<= 1.5x", long_ratio, None if long_ratio is None else long_ratio <= 1.5
        )
    else:
        for name in (
            "short_ttft_p50_gain_vs_sarathi_2048",
            "short_ttft_p90_gain_vs_sarathi_2048",
            "tpot_p99_within_t_target_plus_10pct",
            "every_long_request_completes",
            "long_ttft_p50_vs_sarathi_2048",
        ):
            goals[name] = _goal(f"needs {GOAL_LOAD} QPS and >= 5 seeds", None, None)
    report["goals"] = goals
    for rate in loads:
        ab = report["ablation"][f"{rate:g}"]
        print(f"\nablation at {rate:g} QPS (best first):")
        for key in ("short_ttft_p50_s", "short_ttft_p90_s", "long_ttft_p90_s"):
            print(f"  {key:<18} {' < '.join(ab[key])}")
        for claim, ok in ab.get("claims", {}).items():
            print(f"  {claim:<40} {'holds' if ok else 'does not hold'}")
    print("\ngoals at 0.75 QPS:")
    for name, goal in goals.items():
        print(
            f"  {name:<40} {goal['target']:>14}  value {_fmt(goal['value']):>8}  met {goal['met']}"
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
