"""The ttca router against each seed's router on its home turf, and on `mixed` (issues 18, 35).

    python benchmarks/ttca_eval.py            # seeds 10-14, ~15 min on 2 cores
    python benchmarks/ttca_eval.py --quick    # seeds 10-11, a smoke run

Runs, each at every evaluation seed (none of them a tuning seed):

* ``mixed``: every router of the scenario and ``ttca``;
* ``laar``: ``ttca`` and ``laar``;
* ``gorgo``: ``ttca`` and GORGO with weights tuned once by ``longroute tune`` (tuner
  seed 0, the scenario's tuning window), on the held-out windows ``half`` and ``third``;
* ``default`` and ``long-sessions``: ``ttca`` and every baseline of the scenario;
* past capacity: `gorgo`'s fleet at 1.5x and 3x its full load, every router of the
  scenario, GORGO tuned (``benchmarks/_ttca_goals.py``);
* self-calibration: ``mixed`` with one endpoint slowed 2x (``slowdown: 2``) that the
  router still believes nominal; the TTFT error of ttca's predictions on it, per
  request in order of dispatch;
* an ideal router on ``mixed`` (``benchmarks/_ttca_ideal.py``): true accuracies, an idle
  fleet, no network. It is computed, not simulated, and set over every router as a
  bound on what the goal asks.

On ``mixed`` each router's queries are also split against ttca's by who answered
(``benchmarks/_ttca_outcomes.py``): a mean over all queries counts a failure at its
censored TTCA, so a router that gives up cheaply looks quick.

Every comparison is ttca over the reference, paired by seed: the median ratio, its
95% bootstrap CI and the seeds ttca won. The last line is one JSON object with
``goals``: one per acceptance bullet of issue 35 (``mixed_*``: benchmarks/_ttca_goals.py),
and issue 18's self-calibration.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from _eval import checked_seeds, eval_parser, progress_printer
from _ttca_goals import as_float, mixed_figures, mixed_goals, overload_goal, overload_job
from _ttca_ideal import ideal_run, report_ideal
from _ttca_outcomes import outcome_figures, report_outcomes
from longroute.metrics.summary import summarize
from longroute.routing import Router
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sim.tune import TuneOptions, tune_scenario
from longroute.sim.windows import run_windows
from longroute.sweep.stats import paired_ratio
from longroute.tuning import as_tunable

HOME = ("default", "long-sessions")
HELD_OUT = ("half", "third")
CALIBRATION_REQUESTS = 100
Figures = dict[str, dict[str, float]]  # router -> metric -> value


def _figures(run_results: dict[Any, Any], ttca: dict[Any, Any]) -> Figures:
    out: Figures = {}
    for name, result in run_results.items():
        s = summarize(result.records, num_rejected=result.num_rejected)
        first = [x.first_token_s - x.arrival_s for x in result.records if x.attempt <= 1]
        row = {
            "ttft_p95_s": as_float(s["ttft_p95_s"]),
            "e2e_p95_s": as_float(s["e2e_p95_s"]),
            # first attempts: the same requests under every router, however many retries
            "ttft_p95_first_attempt_s": float(np.percentile(first, 95)) if first else math.nan,
            "num_requests": float(len(result.records)),
        }
        if name in ttca:
            row["mean_ttca_s"] = ttca[name].mean_s
            row["final_success"] = ttca[name].final_success
        out[name] = row
    return out


def plain_job(job: tuple[str, int, tuple[str, ...] | None]) -> tuple[tuple[str, int], Figures]:
    scenario, seed, routers = job
    config = load_scenario(scenario)
    names = None
    if routers is not None:
        names = list(routers)
    elif config.routers:
        names = [*config.routers, *(["ttca"] if "ttca" not in config.routers else [])]
    run = run_scenario(config, seed=seed, routers=names)
    figures = _figures(run.results, run.ttca())
    if scenario == "mixed" and run.max_attempts is not None:
        for name, row in outcome_figures(run, run.max_attempts).items():
            figures[name].update(row)
        for name, row in mixed_figures(run).items():
            figures[name].update(row)
    return (scenario, seed), figures


def ideal_job(seed: int) -> tuple[tuple[str, int], dict[str, float]]:
    """The ideal router on `mixed` (benchmarks/_ttca_ideal.py): a bound, not a run."""
    return ("mixed-ideal", seed), ideal_run(load_scenario("mixed"), seed).figures()


def gorgo_job(job: tuple[int, dict[str, float]]) -> tuple[tuple[str, int], dict[str, Figures]]:
    seed, weights = job

    def prepare(name: str, router: Router) -> tuple[()]:
        if name == "gorgo":
            as_tunable(router).set_weights(weights)
        return ()

    runs = run_windows(load_scenario("gorgo"), seed=seed, routers=["ttca", "gorgo"],
                       only=list(HELD_OUT), prepare_router=prepare)  # fmt: skip
    return ("gorgo", seed), {w.window.name: _figures(w.run.results, {}) for w in runs}


def calibration_job(seed: int) -> tuple[tuple[str, int], list[float]]:
    """ttca's relative TTFT error on a 2x-slowed endpoint, per request sent there."""
    config = load_scenario("mixed")
    slowed = config.fleet[0]
    fleet = [slowed.model_copy(update={"slowdown": 2.0}), *config.fleet[1:]]
    config = config.model_copy(update={"fleet": fleet})
    errors: list[float] = []
    target = slowed.name if slowed.replicas == 1 else f"{slowed.name}-0"

    def prepare(name: str, router: Router) -> tuple[()]:
        original_route = router.route
        original_first = router.on_first_token
        predicted: dict[tuple[str, int], tuple[float, float]] = {}

        def route(request: Any, fleet: Any, now_s: float) -> Any:
            decision = original_route(request, fleet, now_s)
            if decision.predicted_ttft_s is not None:
                predicted[(request.request_id, request.attempt)] = (
                    decision.predicted_ttft_s if decision.endpoint == target else -1.0,
                    now_s,
                )
            return decision

        def on_first_token(request: Any, endpoint: str, now_s: float) -> None:
            entry = predicted.pop((request.request_id, request.attempt), None)
            if endpoint == target and entry is not None and entry[0] > 0:
                observed = now_s - entry[1]
                errors.append(abs(entry[0] - observed) / observed)
            original_first(request, endpoint, now_s)

        router.route = route  # type: ignore[method-assign]
        router.on_first_token = on_first_token  # type: ignore[method-assign]
        return ()

    run_scenario(config, seed=seed, routers=["ttca"], prepare_router=prepare)
    return ("calibration", seed), errors


def _ratio(mine: list[float], ref: list[float], *, lower: bool = True) -> dict[str, Any]:
    pair = paired_ratio(mine, ref, is_lower_better=lower)
    e = pair.estimate
    return {"median": e.median, "ci": list(e.ci) if e.ci else None,
            "num_wins": pair.num_wins, "num_seeds": pair.num_seeds}  # fmt: skip


def _series(data: dict[Any, Any], key: tuple[str, int], seeds: Sequence[int], router: str,
            metric: str, window: str | None = None) -> list[float]:  # fmt: skip
    out = []
    for seed in seeds:
        figs = data[(key[0], seed)]
        figs = figs[window] if window is not None else figs
        out.append(figs[router][metric])
    return out


def _cell(r: dict[str, Any]) -> str:
    low, high = r["ci"] if r["ci"] else (r["median"], r["median"])
    return f"{r['median']:.3f} [{low:.3f}, {high:.3f}] {r['num_wins']}/{r['num_seeds']}"


def _line(label: str, cells: list[str]) -> None:
    print(f"{label:<22}" + "".join(f"{c:>26}" for c in cells))


def analyse(data: dict[Any, Any], seeds: Sequence[int]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    figures: dict[str, Any] = {}
    goals: dict[str, dict[str, Any]] = {}

    def series(scenario: str, router: str, metric: str, window: str | None = None) -> list[float]:
        return _series(data, (scenario, 0), seeds, router, metric, window)

    # ---- mixed
    routers = [r for r in data[("mixed", seeds[0])] if r != "ttca"]
    print("\nmixed: ttca / router, per seed: median [95% CI], seeds ttca won")
    _line("router", ["mean TTCA", "TTFT p95", "final success (x)"])
    mixed: dict[str, Any] = {}
    worst_ttca = worst_ttft = 0.0
    for r in routers:
        row = {
            "mean_ttca": _ratio(
                series("mixed", "ttca", "mean_ttca_s"), series("mixed", r, "mean_ttca_s")
            ),
            "ttft_p95": _ratio(
                series("mixed", "ttca", "ttft_p95_s"), series("mixed", r, "ttft_p95_s")
            ),
            "final_success": _ratio(
                series("mixed", "ttca", "final_success"),
                series("mixed", r, "final_success"),
                lower=False,
            ),
        }
        mixed[r] = row
        worst_ttca = max(worst_ttca, row["mean_ttca"]["median"])
        worst_ttft = max(worst_ttft, row["ttft_p95"]["median"])
        _line(r, [_cell(row["mean_ttca"]), _cell(row["ttft_p95"]), _cell(row["final_success"])])
    # TTFT p95 over all requests counts retries too, and a router that retries on the model
    # that just answered wrongly sends many cheap, cached retries (a deterministic model
    # repeats itself) that pull its percentile down: first attempts are the same requests
    # under every router
    print("\nmixed, first attempts only: ttca / router")
    _line("router", ["TTFT p95, first attempts", "requests sent (x)"])
    for r in routers:
        mixed[r]["ttft_p95_first_attempt"] = first = _ratio(
            series("mixed", "ttca", "ttft_p95_first_attempt_s"),
            series("mixed", r, "ttft_p95_first_attempt_s"),
        )
        mixed[r]["num_requests"] = sent = _ratio(
            series("mixed", "ttca", "num_requests"), series("mixed", r, "num_requests")
        )
        _line(r, [_cell(first), _cell(sent)])

    def outcome_series(router: str, key: str) -> list[float]:
        return [data[("mixed", s)][router].get(key, math.nan) for s in seeds]

    by_outcome = report_outcomes(outcome_series, routers, _line, _cell)
    for r in routers:
        mixed[r]["by_outcome"] = by_outcome[r]
    figures["mixed_ideal"] = report_ideal(
        lambda metric: [data[("mixed-ideal", s)][metric] for s in seeds],
        lambda router, metric: series("mixed", router, metric),
        ["ttca", *routers], _ratio, _line, _cell,
    )  # fmt: skip
    figures["mixed"] = mixed
    figures["mixed_users"], mixed_user_goals = mixed_goals(
        lambda router, metric: series("mixed", router, metric), routers, _ratio, _line, _cell
    )
    goals.update(mixed_user_goals)
    worst_mean = max(worst_ttca, worst_ttft)
    print(f"\nmixed, for reference (issue 18's withdrawn goal): worst mean TTCA / TTFT p95 "
          f"ratio {worst_mean:.3f}")  # fmt: skip
    # ---- home turf
    laar = _ratio(series("laar", "ttca", "mean_ttca_s"), series("laar", "laar", "mean_ttca_s"))
    print("\nhome turf: ttca / reference")
    _line("laar: mean TTCA / laar", [_cell(laar)])
    home: dict[str, Any] = {"laar": laar}
    goals["home_laar"] = {"target": "mean TTCA <= 1.0x laar's (median ratio)",
                          "value": laar["median"], "met": laar["median"] <= 1.0}  # fmt: skip
    worst_gorgo = 0.0
    for window in HELD_OUT:
        for metric in ("ttft_p95_s", "e2e_p95_s"):
            r = _ratio(
                series("gorgo", "ttca", metric, window), series("gorgo", "gorgo", metric, window)
            )
            home[f"gorgo/{window}/{metric}"] = r
            worst_gorgo = max(worst_gorgo, r["median"])
            _line(f"gorgo {window} {metric[:-2]}", [_cell(r)])
    goals["home_gorgo"] = {
        "target": "held-out windows: TTFT and E2E p95 <= 1.02x tuned GORGO's (worst median ratio)",
        "value": worst_gorgo, "met": worst_gorgo <= 1.02,
    }  # fmt: skip
    worst_home = 0.0
    for scenario in HOME:
        baselines = [r for r in data[(scenario, seeds[0])] if r != "ttca"]
        for metric in ("ttft_p95_s", "e2e_p95_s"):
            medians = {b: statistics.median(series(scenario, b, metric)) for b in baselines}
            best = min(medians, key=lambda b: medians[b])
            r = _ratio(series(scenario, "ttca", metric), series(scenario, best, metric))
            r["reference"] = best
            home[f"{scenario}/{metric}"] = r
            worst_home = max(worst_home, r["median"])
            _line(f"{scenario} {metric[:4]} / {best}"[:22], [_cell(r)])
    figures["home"] = home
    goals["home_default_long_sessions"] = {
        "target": "default and long-sessions: TTFT and E2E p95 <= the best other router's "
        "(worst median ratio)",
        "value": worst_home, "met": worst_home <= 1.0,
    }  # fmt: skip
    figures["past_capacity"], goals["past_capacity"] = overload_goal(data, seeds, _line)
    # ---- self-calibration
    curves = [data[("calibration", s)] for s in seeds]
    tail_n = 20
    ends = []
    for errors in curves:
        upto = errors[:CALIBRATION_REQUESTS]
        tail = upto[-tail_n:] if len(upto) >= tail_n else upto
        ends.append(statistics.median(tail) if tail else float("nan"))
    starts = [statistics.median(e[:5]) for e in curves if len(e) >= 5]
    last = f"median_error_of_requests_{CALIBRATION_REQUESTS - tail_n + 1}_{CALIBRATION_REQUESTS}"
    figures["calibration"] = {
        "first_5_median_error": starts,
        "requests_seen": [len(e) for e in curves],
        last: ends,
    }
    print(f"\nself-calibration (2x slower than its profile): TTFT error of the first 5 "
          f"requests {', '.join(f'{v:.2f}' for v in starts)}; of requests "
          f"{CALIBRATION_REQUESTS - tail_n + 1}-{CALIBRATION_REQUESTS} "
          f"{', '.join(f'{v:.2f}' for v in ends)} (one per seed)")  # fmt: skip
    worst_end = max(ends)
    goals["self_calibration"] = {
        "target": f"TTFT error < 20% within {CALIBRATION_REQUESTS} requests on an endpoint 2x "
        "slower than its profile (median of the last 20, worst seed)",
        "value": worst_end,
        "met": worst_end < 0.2,
    }
    goals["decision_cost"] = {
        "target": "decision p99 <= 100 us, 16 endpoints, 100,000-block index, each "
        "decision's fastest of several rounds: benchmarks/routing_overhead.py",
        "value": None,
        "met": None,
    }
    goals["in_gateway"] = {
        "target": "emulators in three regions, mixed GPUs: TTFT and E2E p95 <= the best other "
        "router's over >= 3 runs: benchmarks/gorgo_gateway.py",
        "value": None,
        "met": None,
    }
    goals["default"] = {
        "target": "serve and the default scenario default to ttca",
        "value": None,
        "met": _is_default(),
    }
    goals["unit_tests"] = {
        "target": "tests/test_ttca_router.py, tests/test_gateway_ttca_config.py",
        "value": None,
        "met": None,
    }
    return figures, goals


def _is_default() -> bool:
    from longroute.gateway.config import RouterConfig

    default_routers = load_scenario("default").routers or []
    return RouterConfig().name == "ttca" and default_routers[:1] == ["ttca"]


def main() -> None:
    parser = eval_parser(__doc__.splitlines()[0], "10-14", "seeds 10-11: a smoke run")
    args = parser.parse_args()
    (seeds,) = checked_seeds(parser, args, "10-11" if args.quick else args.seeds)
    context = multiprocessing.get_context("spawn")
    progress = progress_printer()

    print("tuning GORGO on gorgo (tuner seed 0) ...", flush=True)
    weights = dict(tune_scenario(load_scenario("gorgo"), TuneOptions(), seed=0).frozen.weights)
    print(f"  weights: {weights}", flush=True)
    jobs: list[tuple[Any, Any]] = []
    for seed in seeds:
        jobs.append((plain_job, ("mixed", seed, None)))
        jobs.append((plain_job, ("laar", seed, ("ttca", "laar"))))
        for scenario in HOME:
            jobs.append((plain_job, (scenario, seed, None)))
        jobs.append((gorgo_job, (seed, weights)))
        jobs.append((calibration_job, seed))
        jobs.append((overload_job, (seed, weights)))
        jobs.append((ideal_job, seed))
    data: dict[tuple[str, int], Any] = {}
    print(f"running {len(jobs)} jobs on {args.jobs} workers ...", flush=True)
    with context.Pool(args.jobs) as pool:
        pending = [pool.apply_async(fn, (arg,)) for fn, arg in jobs]
        for i, result in enumerate(pending, start=1):
            key, value = result.get()
            data[key] = value
            progress(i, len(jobs), f"{key[0]} seed {key[1]}")
    figures, goals = analyse(data, seeds)
    for name, goal in goals.items():
        value = "-" if goal["value"] is None else f"{goal['value']:.3f}"
        verdict = {True: "met", False: "NOT met", None: "see target"}[goal["met"]]
        print(f"goal {name}: {value}: {verdict}")
    runs = {f"{k[0]}/{k[1]}": v for k, v in data.items()}
    print(json.dumps({"benchmark": "ttca_eval", "seeds": seeds, "gorgo_weights": weights,
                      "runs": runs, "figures": figures, "goals": goals}))  # fmt: skip


if __name__ == "__main__":
    main()
