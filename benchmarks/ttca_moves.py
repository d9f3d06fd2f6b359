"""Do ttca's moves pay? Its predicted gain per moved chat turn on `mixed`, what happened.

    python benchmarks/ttca_moves.py --jobs 2           # seeds 10-14, ~5 min on 2 cores
    python benchmarks/ttca_moves.py --quick            # seeds 10-11
    python benchmarks/ttca_moves.py --margins 0.5,2    # the forced-stay runs to make

A chat turn's first attempt *moves* when ttca sends it off the endpoint of its previous
turn (its home; ``ttca_decisions._classes``). Issue 35 asks for ttca's first-attempt
cache-hit ratio on `mixed` to be at least 0.95x the best cache-seeking router's; ttca
moves 1,200-1,500 turns a seed, each for about a second of predicted gain.

* **Prediction against outcome** (ttca's own run). At every first attempt of a chat
  turn the router's own figures are kept: at each candidate, its TTFT (rtt +
  ``ttft_engine``), TPOT and T. Per class (first turn, stay, move): observed over
  predicted TTFT (from dispatch) and TPOT at the endpoint that served it. The TPOT
  *slope*: log(observed / e's typical) regressed on log(predicted / e's typical), e's
  typical the median TPOT ttca predicted there; 1 for a prediction whose swings come
  true, below 1 for one that over-reacts to the load it sees at dispatch.
  Per move: the predicted gain in T (home less chosen), the predicted gain in E2E at the
  turn's true output length, and a realised gain: the home's predicted E2E (true length)
  corrected by the median error of stays at that home in the same band of predicted
  TPOT over typical (<0.8, <0.95, <1.05, <1.2, more), less the turn's observed E2E
  at the endpoint chosen. No run can observe the home's answer for a turn that moved;
  this estimate is as good as the stays' errors say.
* **Forced stays** (a counterfactual at the system level: the later turns, the other
  conversations and the queues all follow). ttca again, except that a chat turn's first
  attempt that would leave its home (the one endpoint holding its longest cached
  prefix, as ttca reads it) for a score gain below M seconds is sent home. Per margin M:
  the moves, the first-attempt hit ratio over the best cache-seeking router's (the
  goal's figure: ratio of medians) and, paired by seed against plain ttca, the chat
  turns' mean TTFT and E2E and first attempts' TTFT p95. If forcing a move home cost
  nothing, its gain was noise.

A diagnosis, not a goal: the last line is one JSON object of the figures (``goals`` empty).
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from _eval import checked_seeds, eval_parser
from _ttca_goals import CACHE_SEEKING, first_attempt_hit_ratio
from longroute.metrics.records import RequestRecord
from longroute.routing import Router
from longroute.routing.ttca import _home
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sweep.stats import paired_ratio
from ttca_decisions import _classes

BANDS = (0.8, 0.95, 1.05, 1.2)
"""Upper edges of the bands of predicted TPOT over the endpoint's typical (the last band
is open): the stays' error is read in the home's band."""
DEFAULT_MARGINS = "0.5,1,2,4,8,1000"
MIN_OUTPUT = 16
"""Turns with fewer output tokens are left out of the TPOT slope (a step or two of noise)."""

TERMS = ("ttft", "decode", "externality")
"""T's terms, (1 + w)(rtt + ttft_engine), (out - 1) tpot and the externality: a move is
led by the one that gains most."""
# per attempt: (expected output, chosen, per candidate (rtt + ttft_engine, tpot, T, and
# T's terms))
Figures = tuple[float, float, float, tuple[float, float, float]]
Store = dict[tuple[str, int], tuple[int, str, dict[str, Figures]]]


def _prepare(store: Store | None, margin: float | None) -> Any:
    """Keeps ttca's figures per attempt (``store``) and, with ``margin``, sends a chat
    turn's first attempt home where leaving gains less than ``margin`` seconds of score."""

    def prepare(name: str, router: Router) -> tuple[()]:
        if name != "ttca":
            return ()
        original = router.route
        first_weight = 1.0 + router.ttft_weight  # type: ignore[attr-defined]
        weight = router.externality_weight  # type: ignore[attr-defined]

        def route(request: Any, fleet: Any, now_s: float) -> Any:
            decision = original(request, fleet, now_s)
            is_chat = (
                request.attempt == 1 and request.session_id is not None and request.task is None
            )
            if margin is not None and is_chat:
                hashes = request.block_hashes
                matched = fleet.prefix_index.match(hashes) if hashes else {}
                home = _home(matched, fleet.candidates(request))
                scores = decision.scores
                if (
                    home
                    and home != decision.endpoint
                    and scores[home] - scores[decision.endpoint] < margin
                ):
                    decision = dataclasses.replace(decision, endpoint=home)
            if store is not None and is_chat:
                out = request.num_output_tokens
                figures: dict[str, Figures] = {}
                for e, (_, _, p, rtt) in router._last.items():  # type: ignore[attr-defined]
                    terms = (
                        first_weight * (rtt + p.ttft_engine_s),
                        (out - 1) * p.tpot_s,
                        weight * p.externality_s,
                    )
                    figures[e] = (rtt + p.ttft_engine_s, p.tpot_s, sum(terms), terms)
                store[(request.request_id, request.attempt)] = (out, decision.endpoint, figures)
            return decision

        router.route = route  # type: ignore[method-assign]
        return ()

    return prepare


def _outcome(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Hit ratio, first-attempt TTFT p95, chat turns' mean TTFT and E2E, moves."""
    first = [r for r in records if r.attempt <= 1]
    chat = [r for r in first if r.session_id is not None and r.is_correct is None]
    classes = _classes(records)
    return {
        "hit_ratio": first_attempt_hit_ratio(records),
        "ttft_p95_first_attempt_s": statistics.quantiles([r.ttft_s for r in first], n=20)[-1],
        "chat_ttft_mean_s": statistics.fmean(r.ttft_s for r in chat),
        "chat_e2e_mean_s": statistics.fmean(r.e2e_s for r in chat),
        "moves": float(sum(1 for kind, _, _ in classes if kind == "move")),
    }


def _band(x: float) -> int:
    return next((i for i, edge in enumerate(BANDS) if x < edge), len(BANDS))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _predictions(records: Sequence[RequestRecord], store: Store) -> dict[str, Any]:
    """Prediction against outcome for ttca's chat turns (module docstring)."""
    rows = []
    typical_of: dict[str, list[float]] = defaultdict(list)
    for kind, previous, r in _classes(records):
        entry = store.get((r.request_id, r.attempt))
        if entry is None or entry[1] != r.endpoint:
            continue
        rows.append((kind, previous, r, entry))
        for e, (_, tpot, _, _) in entry[2].items():
            typical_of[e].append(tpot)
    typical = {e: statistics.median(v) for e, v in typical_of.items()}
    ttft_err: dict[str, list[float]] = defaultdict(list)
    tpot_err: dict[str, list[float]] = defaultdict(list)
    stay_ttft: dict[str, list[float]] = defaultdict(list)
    stay_tpot: dict[tuple[str, int], list[float]] = defaultdict(list)
    xs: list[float] = []
    ys: list[float] = []
    for kind, _, r, (_, chosen, figures) in rows:
        ttft_p, tpot_p, _, _ = figures[chosen]
        ttft_o = r.first_token_s - r.dispatch_s
        if ttft_p > 0.0:
            ttft_err[kind].append(ttft_o / ttft_p)
            if kind == "stay":
                stay_ttft[chosen].append(ttft_o / ttft_p)
        n = r.num_output_tokens
        if n >= 2 and tpot_p > 0.0:
            tpot_o = (r.finish_s - r.first_token_s) / (n - 1)
            tpot_err[kind].append(tpot_o / tpot_p)
            if kind == "stay":
                stay_tpot[(chosen, _band(tpot_p / typical[chosen]))].append(tpot_o / tpot_p)
            if n >= MIN_OUTPUT and tpot_o > 0.0:
                xs.append(math.log(tpot_p / typical[chosen]))
                ys.append(math.log(tpot_o / typical[chosen]))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    gains_t: list[float] = []
    gains_e2e: list[float] = []
    realised: list[float] = []
    home_busy: list[float] = []
    led_by: dict[str, list[float]] = defaultdict(list)  # realised gains by the term that led
    chosen_busy: list[float] = []
    for kind, previous, r, (_, chosen, figures) in rows:
        if kind != "move" or previous not in figures:
            continue
        (ttft_h, tpot_h, t_h, terms_h), (ttft_c, tpot_c, t_c, terms_c) = (
            figures[previous],
            figures[chosen],
        )
        n = r.num_output_tokens
        gains_t.append(t_h - t_c)
        gains_e2e.append(ttft_h + (n - 1) * tpot_h - ttft_c - (n - 1) * tpot_c)
        band = _band(tpot_h / typical[previous])
        k_tpot = _median(stay_tpot.get((previous, band), [])) or _median(
            [v for (e, _), vs in stay_tpot.items() if e == previous for v in vs]
        )
        k_ttft = _median(stay_ttft.get(previous, []))
        home_e2e = ttft_h * (k_ttft or 1.0) + (n - 1) * tpot_h * (k_tpot or 1.0)
        realised.append(home_e2e - (r.finish_s - r.dispatch_s))
        gain = [h - c for h, c in zip(terms_h, terms_c, strict=True)]
        led_by[TERMS[max(range(len(TERMS)), key=gain.__getitem__)]].append(realised[-1])
        home_busy.append(tpot_h / typical[previous])
        chosen_busy.append(tpot_c / typical[chosen])
    return {
        "ttft_observed_over_predicted": {k: _median(v) for k, v in sorted(ttft_err.items())},
        "tpot_observed_over_predicted": {k: _median(v) for k, v in sorted(tpot_err.items())},
        "tpot_slope": slope,
        "moves": len(gains_t),
        "move_gain_t_s": _median(gains_t),
        "move_gain_e2e_predicted_s": _median(gains_e2e),
        "move_gain_e2e_realised_s": _median(realised),
        "move_realised_over_predicted": (
            statistics.median(realised) / statistics.median(gains_e2e) if gains_e2e else None
        ),
        "move_realised_negative_share": (
            sum(1 for v in realised if v < 0.0) / len(realised) if realised else None
        ),
        "move_led_by": {k: len(v) for k, v in sorted(led_by.items())},
        "move_realised_by_lead_s": {k: _median(v) for k, v in sorted(led_by.items())},
        "move_home_tpot_over_typical": _median(home_busy),
        "move_chosen_tpot_over_typical": _median(chosen_busy),
    }


def job(spec: tuple[str, int, float | None]) -> tuple[str, int, dict[str, Any]]:
    kind, seed, margin = spec
    config = load_scenario("mixed")
    if kind == "reference":
        run = run_scenario(config, seed=seed, routers=list(CACHE_SEEKING))
        return kind, seed, {n: _outcome(res.records) for n, res in run.results.items()}
    store: Store | None = {} if margin is None else None
    run = run_scenario(config, seed=seed, routers=["ttca"], prepare_router=_prepare(store, margin))
    records = run.results["ttca"].records
    out: dict[str, Any] = dict(_outcome(records))
    if store is not None:
        out["predictions"] = _predictions(records, store)
    return kind, seed, out


def _paired(values: list[float], reference: list[float]) -> dict[str, Any]:
    pair = paired_ratio(values, reference)
    e = pair.estimate
    return {"median": e.median, "ci": list(e.ci) if e.ci else None,
            "num_wins": pair.num_wins, "num_seeds": pair.num_seeds}  # fmt: skip


def _cell(r: dict[str, Any]) -> str:
    low, high = r["ci"] if r["ci"] else (r["median"], r["median"])
    return f"{r['median']:.3f} [{low:.3f}, {high:.3f}]"


def analyse(
    runs: dict[str, dict[int, Any]], seeds: list[int], margins: list[float]
) -> dict[str, Any]:
    ref = runs["reference"]
    best_hit = max(statistics.median(ref[s][n]["hit_ratio"] for s in seeds) for n in CACHE_SEEKING)
    plain = runs["plain"]
    print("\nttca's chat turns on mixed, first attempts (per seed)")
    for seed in seeds:
        p = plain[seed]["predictions"]
        print(
            f"  seed {seed}: observed/predicted TTFT {_rounded(p['ttft_observed_over_predicted'])}"
            f", TPOT {_rounded(p['tpot_observed_over_predicted'])}, TPOT slope "
            f"{p['tpot_slope']:.3f}"
        )
        print(
            f"    {p['moves']} moves: gain in T {p['move_gain_t_s']:.3f} s, in E2E predicted "
            f"{p['move_gain_e2e_predicted_s']:.3f} s, realised {p['move_gain_e2e_realised_s']:.3f}"
            f" s ({p['move_realised_over_predicted']:.2f}x), realised < 0 for "
            f"{p['move_realised_negative_share']:.1%}; predicted TPOT / typical at home "
            f"{p['move_home_tpot_over_typical']:.3f}, at the endpoint chosen "
            f"{p['move_chosen_tpot_over_typical']:.3f}; led by {p['move_led_by']}, realised "
            f"by lead {_rounded(p['move_realised_by_lead_s'])} s"
        )
    table: dict[str, Any] = {}
    print(f"\nforced stays (best cache-seeking median hit ratio {best_hit:.4f}); paired by seed,")
    print("ttca forced / plain ttca, median [95% CI]")
    header = ("moves", "hit / best", "chat TTFT mean", "chat E2E mean", "TTFT p95 first")
    print(f"{'margin (s)':<12}" + "".join(f"{h:>24}" for h in header))
    for label in ["plain", *(f"{m:g}" for m in margins)]:
        rows = runs["plain" if label == "plain" else f"stay<{label}"]
        row: dict[str, Any] = {
            "moves": statistics.median(rows[s]["moves"] for s in seeds),
            "hit_over_best": statistics.median(rows[s]["hit_ratio"] for s in seeds) / best_hit,
        }
        for k in ("chat_ttft_mean_s", "chat_e2e_mean_s", "ttft_p95_first_attempt_s"):
            row[k] = _paired([rows[s][k] for s in seeds], [plain[s][k] for s in seeds])
        table[label] = row
        cells = [f"{row['moves']:.0f}", f"{row['hit_over_best']:.3f}"]
        cells += [_cell(row[k]) for k in ("chat_ttft_mean_s", "chat_e2e_mean_s",
                                           "ttft_p95_first_attempt_s")]  # fmt: skip
        print(f"{label:<12}" + "".join(f"{c:>24}" for c in cells))
    return {"best_cache_seeking_hit_ratio": best_hit, "forced_stays": table}


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 3) for k, v in values.items()}


def main() -> None:
    parser = eval_parser(__doc__.splitlines()[0], "10-14", "seeds 10-11")
    parser.add_argument(
        "--margins",
        default=DEFAULT_MARGINS,
        help=f"forced-stay margins in seconds, comma-separated ({DEFAULT_MARGINS})",
    )
    args = parser.parse_args()
    (seeds,) = checked_seeds(parser, args, "10-11" if args.quick else args.seeds)
    try:
        margins = [float(m) for m in args.margins.split(",") if m.strip()]
    except ValueError:
        parser.error(f"--margins must be numbers separated by commas, got {args.margins!r}")
    if any(not (math.isfinite(m) and m > 0.0) for m in margins) or len(margins) > 16:
        parser.error(f"--margins: at most 16, each finite and > 0, got {args.margins!r}")
    specs: list[tuple[str, int, float | None]] = []
    for seed in seeds:
        specs += [("plain", seed, None), ("reference", seed, None)]
        specs += [(f"stay<{m:g}", seed, m) for m in margins]
    runs: dict[str, dict[int, Any]] = defaultdict(dict)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for kind, seed, out in pool.imap_unordered(job, specs):
            runs[kind][seed] = out
            print(f"done {kind} seed {seed}", flush=True)
    figures = analyse(runs, list(seeds), margins)
    print(
        json.dumps(
            {
                "benchmark": "ttca_moves",
                "seeds": list(seeds),
                "margins": margins,
                "runs": {k: {str(s): v for s, v in r.items()} for k, r in runs.items()},
                "figures": figures,
                "goals": {},
            }
        )
    )


if __name__ == "__main__":
    main()
