"""Why ttca loses two of issue 35's goals: its per-request decisions beside the winners'.

    python benchmarks/ttca_decisions.py                 # seeds 10-14, ~3 min on 2 cores
    python benchmarks/ttca_decisions.py --seeds 10-11 --gorgo-weights '{"rtt_weight": 2.77,
        "queue_weight": 0.184}'                        # skip the tuning

* ``gorgo``'s held-out windows (``half``, ``third``): ttca and tuned GORGO (tuner seed 0,
  as ``ttca_eval.py``). Each request is a session's **first** turn, a **stay** (the
  endpoint of its previous turn) or a **move**; per class and endpoint: requests, mean
  TTFT, ttca's predicted TTFT (rtt + ttft_engine at dispatch) and the requests above the
  router's own TTFT p95. Where ttca predicted an engine time (TTFT less the round trip)
  of at least :data:`QUEUED_S` (a queue ahead or a long prompt): predicted against
  observed, per class. For ttca's first turns, the mean of each term of T at every
  candidate (``(1+w)(rtt + ttft)``, decode, externality) and the uncached tokens.
* ``mixed``, first attempts: ttca, prefix-cache and GORGO (default weights): moves of a
  conversation, the hit ratio of each class, and for ttca's moves the terms of T at the
  home and at the endpoint chosen, with the term that gained most.

What it prints is a diagnosis, not a goal; the last line is one JSON object of the same
figures (``goals`` empty).
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from _eval import checked_seeds, eval_parser
from longroute.metrics.records import RequestRecord
from longroute.routing import Router
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sim.tune import TuneOptions, tune_scenario
from longroute.sim.windows import run_windows
from longroute.tuning import as_tunable

TERMS = ("(1+w)(rtt+ttft)", "decode", "externality", "uncached")
Decisions = dict[tuple[str, int], tuple[float | None, dict[str, tuple[float, ...]], float, float]]
QUEUED_S = 0.1
"""A request whose predicted engine time (queue and prefill) is at least this found a queue
or a long prompt: the predicted-against-observed table reads these."""


def _recorder(store: Decisions) -> Any:
    """A prepare_router hook keeping, per ttca attempt, its predicted TTFT and the terms of
    T at every candidate (read from the router's last route(), as its hooks do)."""

    def prepare(name: str, router: Router) -> tuple[()]:
        if name != "ttca":
            return ()
        original = router.route
        first_weight = 1.0 + router.ttft_weight  # type: ignore[attr-defined]

        def route(request: Any, fleet: Any, now_s: float) -> Any:
            decision = original(request, fleet, now_s)
            out = request.num_output_tokens
            terms: dict[str, tuple[float, ...]] = {
                e: (
                    first_weight * (rtt + p.ttft_engine_s),
                    (out - 1) * p.tpot_s,
                    p.externality_s,
                    float(uncached),
                )
                for e, (uncached, _, p, rtt) in router._last.items()  # type: ignore[attr-defined]
            }
            _, _, chosen, rtt_s = router._last[decision.endpoint]  # type: ignore[attr-defined]
            store[(request.request_id, request.attempt)] = (
                decision.predicted_ttft_s, terms, chosen.ttft_engine_s, rtt_s
            )  # fmt: skip
            return decision

        router.route = route  # type: ignore[method-assign]
        return ()

    return prepare


def _classes(records: Sequence[RequestRecord]) -> list[tuple[str, str | None, RequestRecord]]:
    """(first | stay | move, the previous turn's endpoint, record), first attempts in order."""
    out = []
    home: dict[str, str] = {}
    for r in sorted((r for r in records if r.attempt <= 1), key=lambda r: r.arrival_s):
        previous = home.get(r.session_id) if r.session_id is not None else None
        kind = "first" if previous is None else ("stay" if previous == r.endpoint else "move")
        if r.session_id is not None:
            home[r.session_id] = r.endpoint
        out.append((kind, previous, r))
    return out


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def gorgo_job(job: tuple[int, dict[str, float]]) -> dict[str, Any]:
    seed, weights = job
    out: dict[str, Any] = {}
    for window in ("half", "third"):
        store: Decisions = {}
        record = _recorder(store)

        def prepare(name: str, router: Router, record: Any = record) -> tuple[()]:
            if name == "gorgo":
                as_tunable(router).set_weights(weights)
            return record(name, router)  # type: ignore[no-any-return]

        (run,) = run_windows(
            load_scenario("gorgo"),
            seed=seed,
            routers=["ttca", "gorgo"],
            only=[window],
            prepare_router=prepare,
        )
        rows: dict[str, Any] = {}
        for name, result in run.run.results.items():
            classes = _classes(result.records)
            p95 = _p95([r.first_token_s - r.arrival_s for _, _, r in classes])
            table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            terms: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(TERMS))
            for kind, _, r in classes:
                row = table[f"{kind} {r.endpoint}"]
                ttft = r.first_token_s - r.arrival_s
                row["n"] += 1
                row["ttft_s"] += ttft
                row["above_p95"] += ttft > p95
                entry = store.get((r.request_id, r.attempt)) if name == "ttca" else None
                if entry is not None and entry[0] is not None:
                    row["predicted_s"] += entry[0]
                if entry is not None and entry[2] >= QUEUED_S:
                    queued = table[f"{kind}, engine >= {QUEUED_S:g} s"]
                    queued["n"] += 1
                    queued["predicted_engine_s"] += entry[2]
                    queued["observed_engine_s"] += ttft - entry[3]
                if entry is not None and kind == "first":
                    for e, values in entry[1].items():
                        acc = terms[f"first {r.endpoint}: at {e}"]
                        for i, v in enumerate(values):
                            acc[i] += v
            for row in table.values():
                n = row["n"]
                for k in ("ttft_s", "predicted_s", "predicted_engine_s", "observed_engine_s"):
                    if k in row:
                        row[k] /= n
            counts = {k: v["n"] for k, v in table.items()}
            rows[name] = {
                "ttft_p95_s": p95,
                "classes": {k: dict(v) for k, v in sorted(table.items())},
                "first_turn_terms": {
                    k: [v / counts[k.split(":")[0]] for v in acc]
                    for k, acc in sorted(terms.items())
                },
            }
        out[window] = rows
    return {"scenario": "gorgo", "seed": seed, "windows": out}


def mixed_job(seed: int) -> dict[str, Any]:
    store: Decisions = {}
    run = run_scenario(
        load_scenario("mixed"),
        seed=seed,
        routers=["ttca", "prefix-cache", "gorgo"],
        prepare_router=_recorder(store),
    )
    rows: dict[str, Any] = {}
    for name, result in run.results.items():
        prompt: Counter[str] = Counter()
        cached: Counter[str] = Counter()
        diffs: list[list[float]] = []
        for kind, previous, r in _classes(result.records):
            prompt[kind] += r.num_prompt_tokens
            cached[kind] += r.num_cached_tokens
            entry = store.get((r.request_id, r.attempt)) if name == "ttca" else None
            if kind == "move" and entry is not None and previous in entry[1]:
                at_home, chosen = entry[1][previous], entry[1][r.endpoint]
                diffs.append([h - c for h, c in zip(at_home, chosen, strict=True)])
        row: dict[str, Any] = {
            "requests": dict(Counter(kind for kind, _, _ in _classes(result.records))),
            "hit_ratio": sum(cached.values()) / max(1, sum(prompt.values())),
            "hit_ratio_by_class": {k: cached[k] / prompt[k] for k in prompt if prompt[k]},
        }
        if diffs:
            gains = [sum(d[:3]) for d in diffs]
            row["move_gain_s"] = {
                "p25": _q(gains, 0.25),
                "median": statistics.median(gains),
                "p75": _q(gains, 0.75),
            }
            row["move_term_mean_s"] = {
                t: statistics.fmean(d[i] for d in diffs) for i, t in enumerate(TERMS)
            }
            row["move_led_by"] = dict(
                Counter(TERMS[max(range(3), key=d.__getitem__)] for d in diffs)
            )
        rows[name] = row
    return {"scenario": "mixed", "seed": seed, "routers": rows}


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


def report(results: list[dict[str, Any]]) -> None:
    for res in results:
        if res["scenario"] == "gorgo":
            for window, rows in res["windows"].items():
                queued = sorted(k for k in rows["ttca"]["classes"] if "engine >=" in k)
                t, g = rows["ttca"]["ttft_p95_s"], rows["gorgo"]["ttft_p95_s"]
                print(
                    f"\ngorgo seed {res['seed']} {window}: TTFT p95 ttca {t:.3f} s, "
                    f"tuned GORGO {g:.3f} s ({t / g:.3f}x)"
                )
                print(
                    f"{'class endpoint':<18}"
                    + "".join(
                        f"{h:>34}"
                        for h in ("ttca: n, TTFT, predicted, > p95", "GORGO: n, TTFT, > p95")
                    )
                )
                keys = sorted(
                    (set(rows["ttca"]["classes"]) | set(rows["gorgo"]["classes"])) - set(queued)
                )
                for k in keys:
                    a = rows["ttca"]["classes"].get(k, {})
                    b = rows["gorgo"]["classes"].get(k, {})
                    cell_a = (
                        f"{a.get('n', 0):.0f}, {a.get('ttft_s', 0):.3f}, "
                        f"{a.get('predicted_s', 0):.3f}, {a.get('above_p95', 0):.0f}"
                    )
                    n_b, ttft_b, above_b = b.get("n", 0), b.get("ttft_s", 0), b.get("above_p95", 0)
                    cell_b = f"{n_b:.0f}, {ttft_b:.3f}, {above_b:.0f}"
                    print(f"{k:<18}{cell_a:>34}{cell_b:>34}")
                print(f"ttca's engine time (TTFT - rtt) where it predicted >= {QUEUED_S:g} s:")
                for k in queued:
                    q = rows["ttca"]["classes"][k]
                    print(
                        f"  {k:<26} n {q['n']:>5.0f}, predicted {q['predicted_engine_s']:.3f} s, "
                        f"observed {q['observed_engine_s']:.3f} s "
                        f"({q['observed_engine_s'] / q['predicted_engine_s']:.2f}x)"
                    )
                print(
                    "ttca's first turns, mean terms of T (s) at each candidate: " + ", ".join(TERMS)
                )
                for k, v in rows["ttca"]["first_turn_terms"].items():
                    print(f"  {k:<30}" + "".join(f"{x:>10.3f}" for x in v))
        else:
            print(f"\nmixed seed {res['seed']}, first attempts")
            for name, row in res["routers"].items():
                print(
                    f"  {name:<14} hit ratio {row['hit_ratio']:.3f}, requests {row['requests']}, "
                    f"hit by class {_rounded(row['hit_ratio_by_class'])}"
                )
                if "move_gain_s" in row:
                    g = row["move_gain_s"]
                    print(
                        f"    moves: T(home) - T(chosen) p25 {g['p25']:.3f}, median "
                        f"{g['median']:.3f}, p75 {g['p75']:.3f} s; mean per term "
                        f"{_rounded(row['move_term_mean_s'])}; "
                        f"led by {row['move_led_by']}"
                    )


def main() -> None:
    parser = eval_parser(__doc__.splitlines()[0], "10-14", "seeds 10-11")
    parser.add_argument("--gorgo-weights", help="GORGO's frozen weights as JSON (else tuned)")
    args = parser.parse_args()
    (seeds,) = checked_seeds(parser, args, "10-11" if args.quick else args.seeds)
    if args.gorgo_weights:
        weights = {k: float(v) for k, v in json.loads(args.gorgo_weights).items()}
    else:
        print("tuning GORGO on gorgo (tuner seed 0) ...", flush=True)
        weights = dict(tune_scenario(load_scenario("gorgo"), TuneOptions(), seed=0).frozen.weights)
    print(f"GORGO weights: {weights}", flush=True)
    jobs: list[tuple[Any, Any]] = [(gorgo_job, (s, weights)) for s in seeds]
    jobs += [(mixed_job, s) for s in seeds]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = [r.get() for r in [pool.apply_async(fn, (arg,)) for fn, arg in jobs]]
    report(results)
    print(
        json.dumps(
            {
                "benchmark": "ttca_decisions",
                "seeds": seeds,
                "gorgo_weights": weights,
                "runs": results,
                "goals": {},
            }
        )
    )


if __name__ == "__main__":
    main()
