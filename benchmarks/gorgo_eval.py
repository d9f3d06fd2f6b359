"""GORGO against its baselines over seeds: the paper's shape, the strongest baseline,
lasting congestion, and the tuner's robustness (issue 17).

1. Tune GORGO's two weights (``longroute tune``'s ``tune_scenario``) on the
   ``gorgo`` scenario's tuning window (full load) at each tuner seed (default
   0-4).
2. Run ``gorgo`` and ``gorgo-congestion`` at each evaluation seed (default
   10-19: no evaluation draw is a tuning draw) with every router of the
   scenario; GORGO runs frozen with the first tuner seed's weights (what
   ``longroute tune --scenario gorgo -o w.yaml`` then ``longroute simulate
   --scenario S --weights w.yaml`` give), on both scenarios: weights tuned in
   normal conditions meet congestion they were not tuned for. On ``gorgo`` the
   other tuner seeds' weights run too, on the held-out windows (``gorgo@t<seed>``).

Every window is its own draw (seed + window index); ``half`` and ``third`` are
held out (``full`` is the tuning window's load). Per window and column (TTFT
p50/p95/p99, E2E p95) GORGO over a baseline is a ratio per seed, paired; the
table gives the median [95% bootstrap CI] and the seeds GORGO won.

Goals (issue 17), on the held-out windows, medians over seeds:

- ``vs_aibrix``: GORGO TTFT p95 <= 0.9x and E2E p95 <= 0.85x ``aibrix-prefix-cache``'s;
  the value is the worse of ratio/0.9 and ratio/0.85 over the windows (met: <= 1).
- ``vs_best_baseline``: <= 1.0x the best baseline in every column (the baseline with the
  lowest median in that column and window); the value is the largest ratio.
- ``congestion_vs_network_blind``: on ``gorgo-congestion``, TTFT p95 <= 0.8x and E2E
  p95 <= 0.9x the best network-blind baseline (prefix-cache, session-affinity,
  aibrix-prefix-cache), with no request lost (every router finishes as many requests
  as it does on ``gorgo`` at that seed, none rejected); the value is as in ``vs_aibrix``.
- ``tuner_seeds_within_5pct``: every tuner seed's weights <= 1.05x the best baseline in
  every held-out column; the value is the largest ratio.
- ``docs_tables``: docs/gorgo.md carries the three tables' reproduction commands.

    python benchmarks/gorgo_eval.py                          # ~15 min on 2 cores
    python benchmarks/gorgo_eval.py --seeds 10-14 --tuner-seeds 0-4
    python benchmarks/gorgo_eval.py --quick                  # 2 seeds, 2 tuner seeds

The last line is one JSON object with every per-seed figure, the ratios and the goals.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _eval import checked_seeds, eval_parser, progress_printer
from longroute.metrics.summary import summarize
from longroute.routing import Router
from longroute.sim.scenario import load_scenario
from longroute.sim.tune import TuneOptions, tune_scenario
from longroute.sim.windows import run_windows
from longroute.sweep.stats import median_estimate, paired_ratio
from longroute.tuning import as_tunable

COLUMNS = (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95"), ("ttft_p99_s", "TTFT p99"),
           ("e2e_p95_s", "E2E p95"))  # fmt: skip
KEPT = (*(k for k, _ in COLUMNS), "num_requests", "num_rejected", "cache_hit_ratio",
        "load_concentration")  # fmt: skip
HELD_OUT = ("half", "third")
NETWORK_BLIND = ("prefix-cache", "session-affinity", "aibrix-prefix-cache")
AIBRIX = "aibrix-prefix-cache"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "gorgo.md"
DOC_COMMANDS = ("gorgo_eval.py", "--scenario gorgo-congestion")
Weights = dict[str, float]


def tune_job(job: tuple[str, int]) -> tuple[tuple[str, int], Weights]:
    scenario, seed = job
    run = tune_scenario(load_scenario(scenario), TuneOptions(), seed=seed)
    return job, dict(run.frozen.weights)


EvalJob = tuple[str, int, str, Weights, tuple[str, ...] | None, tuple[str, ...] | None]
"""(scenario, seed, label, weights, routers or all, windows or all)"""


def eval_job(job: EvalJob) -> tuple[tuple[str, int, str], dict[Any, Any]]:
    """One scenario at one seed: {window: {router label: kept figures}} (+ failovers)."""
    scenario, seed, label, weights, routers, only = job
    config = load_scenario(scenario)

    def prepare(name: str, router: Router) -> tuple[()]:
        if name == "gorgo":
            as_tunable(router).set_weights(weights)
        return ()

    names = list(routers) if routers is not None else None
    runs = run_windows(config, seed=seed, routers=names, only=list(only) if only else None,
                       prepare_router=prepare)  # fmt: skip
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for window_run in runs:
        by_router = {}
        for name, result in window_run.run.results.items():
            summary = summarize(result.records, num_rejected=result.num_rejected)
            kept = {k: summary[k] for k in KEPT}
            kept["num_failovers"] = result.num_failovers
            kept["num_unique_requests"] = len({r.request_id for r in result.records})
            by_router[label if name == "gorgo" else name] = kept
        out[window_run.window.name] = by_router
    return (scenario, seed, label), out


def _series(data: dict[Any, Any], scenario: str, window: str, router: str, key: str,
            seeds: Sequence[int]) -> list[float]:  # fmt: skip
    return [float(data[(scenario, seed)][window][router][key]) for seed in seeds]


def _ratio(data: dict[Any, Any], scenario: str, window: str, router: str, ref: str, key: str,
           seeds: Sequence[int]) -> dict[str, Any]:  # fmt: skip
    mine = _series(data, scenario, window, router, key, seeds)
    pair = paired_ratio(mine, _series(data, scenario, window, ref, key, seeds))
    e = pair.estimate
    return {"median": e.median, "ci": list(e.ci) if e.ci else None, "num_wins": pair.num_wins,
            "num_seeds": pair.num_seeds, "reference": ref}  # fmt: skip


def _best(data: dict[Any, Any], scenario: str, window: str, pool: tuple[str, ...], key: str,
          seeds: Sequence[int]) -> str:  # fmt: skip
    medians = {b: median_estimate(_series(data, scenario, window, b, key, seeds)).median
               for b in pool}  # fmt: skip
    return min(medians, key=lambda b: medians[b])


def _cell(r: dict[str, Any]) -> str:
    low, high = r["ci"] if r["ci"] else (r["median"], r["median"])
    return f"{r['median']:.3f} [{low:.3f},{high:.3f}] {r['num_wins']}"


def _table(title: str, rows: list[tuple[str, dict[str, dict[str, Any]]]]) -> None:
    """One row per window: GORGO / reference per column; reference names in the title."""
    print(f"\n{title}\nper seed GORGO / reference: median [95% CI], then the seeds GORGO won")
    print(f"{'window':<6}" + "".join(f"{h:>23}" for _, h in COLUMNS))
    for window, by_key in rows:
        print(f"{window:<6}" + "".join(f"{_cell(by_key[k]):>23}" for k, _ in COLUMNS))


def analyse(data: dict[Any, Any], seeds: Sequence[int], tuner_labels: list[str],
            baselines: tuple[str, ...],
            windows: list[str]) -> tuple[dict[Any, Any], dict[Any, Any]]:  # fmt: skip
    figures: dict[str, Any] = {"vs_aibrix": {}, "vs_best": {}, "congestion": {}, "tuner": {}}

    def versus(scenario: str, window: str, router: str, pool: tuple[str, ...]) -> dict[Any, Any]:
        """Per column: ``router`` over the best of ``pool`` in that column (by median)."""
        return {
            key: _ratio(data, scenario, window, router,
                        _best(data, scenario, window, pool, key, seeds), key, seeds)
            for key, _ in COLUMNS
        }  # fmt: skip

    for window in windows:
        figures["vs_aibrix"][window] = versus("gorgo", window, "gorgo", (AIBRIX,))
        figures["vs_best"][window] = versus("gorgo", window, "gorgo", baselines)
        figures["congestion"][window] = versus("gorgo-congestion", window, "gorgo", NETWORK_BLIND)
    for label in tuner_labels:
        figures["tuner"][label] = {w: versus("gorgo", w, label, baselines) for w in HELD_OUT}
    lost = 0
    for seed in seeds:
        for window in windows:
            plain = data[("gorgo", seed)][window]
            for router, kept in data[("gorgo-congestion", seed)][window].items():
                expected = plain[router]["num_requests"]
                got = kept["num_unique_requests"]
                lost += max(0, expected - got) + kept["num_rejected"]
    figures["congestion_requests_lost"] = lost
    figures["congestion_failovers"] = {
        w: {r: [data[("gorgo-congestion", s)][w][r]["num_failovers"] for s in seeds]
            for r in data[("gorgo-congestion", seeds[0])][w]} for w in windows}  # fmt: skip

    def worst(part: str, limits: dict[str, float]) -> float:
        return float(max(figures[part][w][k]["median"] / lim for w in HELD_OUT
                         for k, lim in limits.items()))  # fmt: skip

    aibrix = worst("vs_aibrix", {"ttft_p95_s": 0.9, "e2e_p95_s": 0.85})
    best = max(figures["vs_best"][w][k]["median"] for w in HELD_OUT for k, _ in COLUMNS)
    congestion = worst("congestion", {"ttft_p95_s": 0.8, "e2e_p95_s": 0.9})
    tuner = max(figures["tuner"][t][w][k]["median"] for t in figures["tuner"]
                for w in HELD_OUT for k, _ in COLUMNS)  # fmt: skip
    doc = DOCS.read_text(encoding="utf-8") if DOCS.exists() else ""
    docs_ok = all(command in doc for command in DOC_COMMANDS)
    goals = {
        "vs_aibrix": {"target": "<= 1: max over held-out windows of TTFT p95 ratio / 0.9 and "
                                "E2E p95 ratio / 0.85 (GORGO / aibrix-prefix-cache)",
                      "value": aibrix, "met": aibrix <= 1.0},
        "vs_best_baseline": {"target": "<= 1.0 in every held-out column (GORGO / best baseline)",
                             "value": best, "met": best <= 1.0},
        "congestion_vs_network_blind": {
            "target": "<= 1: max over held-out windows of TTFT p95 ratio / 0.8 and E2E p95 "
                      "ratio / 0.9 (GORGO / best network-blind), and no request lost",
            "value": congestion, "met": congestion <= 1.0 and lost == 0},
        "tuner_seeds_within_5pct": {
            "target": "<= 1.05 in every held-out column, every tuner seed (GORGO / best baseline)",
            "value": tuner, "met": tuner <= 1.05},
        "docs_tables": {"target": "docs/gorgo.md has the tables' reproduction commands",
                        "value": None, "met": docs_ok},
    }  # fmt: skip
    return figures, goals


def _report(figures: dict[Any, Any], windows: list[str], weights: dict[str, Weights]) -> None:
    print("\nweights: " + "; ".join(f"{k}: " + ", ".join(f"{n} {v:.3g}" for n, v in w.items())
                                    for k, w in weights.items()))  # fmt: skip
    _table(f"gorgo: GORGO / {AIBRIX} (the paper's shape).",
           [(w, figures["vs_aibrix"][w]) for w in windows])  # fmt: skip
    _table("gorgo: GORGO / the best baseline per column.",
           [(w, figures["vs_best"][w]) for w in windows])  # fmt: skip
    for w in windows:
        refs = ", ".join(f"{h} {figures['vs_best'][w][k]['reference']}" for k, h in COLUMNS)
        print(f"  best baseline, {w}: {refs}")
    _table("gorgo-congestion: GORGO / the best network-blind baseline.",
           [(w, figures["congestion"][w]) for w in windows])  # fmt: skip
    for w in windows:
        refs = ", ".join(f"{h} {figures['congestion'][w][k]['reference']}" for k, h in COLUMNS)
        print(f"  best network-blind, {w}: {refs}")
    print(f"  requests lost in congestion: {figures['congestion_requests_lost']}")
    for label, by_window in figures["tuner"].items():
        _table(f"gorgo, weights of tuner {label}: GORGO / the best baseline.",
               list(by_window.items()))  # fmt: skip


def main() -> None:
    parser = eval_parser(__doc__.splitlines()[0], "10-19", "seeds 10-11, tuner seeds 0-1")
    parser.add_argument("--tuner-seeds", default="0-4")
    args = parser.parse_args()
    seeds, tuner_seeds = checked_seeds(
        parser,
        args,
        "10-11" if args.quick else args.seeds,
        "0-1" if args.quick else args.tuner_seeds,
    )
    context = multiprocessing.get_context("spawn")
    progress = progress_printer()

    tunes = [("gorgo", t) for t in tuner_seeds]
    weights: dict[tuple[str, int], Weights] = {}
    print(f"tuning GORGO: {len(tunes)} runs on {args.jobs} workers ...", flush=True)
    with context.Pool(args.jobs) as pool:
        for i, (job, w) in enumerate(pool.imap_unordered(tune_job, tunes), start=1):
            weights[job] = w
            progress(i, len(tunes), f"tuned on {job[0]} at seed {job[1]}")
    first = tuner_seeds[0]
    labels = [f"gorgo@t{t}" for t in tuner_seeds]
    jobs: list[EvalJob] = []
    for seed in seeds:
        jobs.append(("gorgo", seed, "gorgo", weights[("gorgo", first)], None, None))
        jobs.append(("gorgo-congestion", seed, "gorgo", weights[("gorgo", first)], None, None))
        for t, label in zip(tuner_seeds[1:], labels[1:], strict=True):  # the first is "gorgo"
            jobs.append(("gorgo", seed, label, weights[("gorgo", t)], ("gorgo",), HELD_OUT))
    raw: dict[tuple[str, int, str], dict[Any, Any]] = {}
    print(f"evaluating: {len(jobs)} runs on {args.jobs} workers ...", flush=True)
    with context.Pool(args.jobs) as pool:
        for i, (key, out) in enumerate(pool.imap_unordered(eval_job, jobs), start=1):
            raw[key] = out
            progress(i, len(jobs), f"{key[0]} seed {key[1]} ({key[2]})")
    data: dict[tuple[str, int], dict[str, dict[str, dict[Any, Any]]]] = {}
    for (scenario, seed, _label), out in raw.items():
        merged = data.setdefault((scenario, seed), {})
        for window, by_router in out.items():
            merged.setdefault(window, {}).update(by_router)
    for seed in seeds:
        for window in HELD_OUT:
            by_router = data[("gorgo", seed)][window]
            by_router[labels[0]] = by_router["gorgo"]
    windows = list(data[("gorgo", seeds[0])])
    baselines = tuple(r for r in data[("gorgo", seeds[0])][windows[0]]
                      if r != "gorgo" and not r.startswith("gorgo@"))  # fmt: skip
    figures, goals = analyse(data, seeds, labels, baselines, windows)
    named = {f"{s}@t{t}": w for (s, t), w in weights.items()}
    _report(figures, windows, named)
    for name, goal in goals.items():
        value = "-" if goal["value"] is None else f"{goal['value']:.3f}"
        print(f"goal {name}: {value}: {'met' if goal['met'] else 'NOT met'}")
    runs = {f"{s}/{seed}": by_window for (s, seed), by_window in data.items()}
    print(json.dumps({"benchmark": "gorgo_eval", "seeds": seeds, "tuner_seeds": tuner_seeds,
                      "weights": named, "baselines": list(baselines), "runs": runs,
                      "figures": figures, "goals": goals}))  # fmt: skip


if __name__ == "__main__":
    main()
