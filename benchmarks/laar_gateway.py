"""LAAR through the real gateway: five emulated models, four routers, time to correct answer.

The seed paper's evaluation (§6), on loopback, in one go:

1. Five ``longroute emulate`` processes, one per model of the paper (Phi-3-mini,
   Phi-3-medium, Granite-3.1-2B, Granite-3.1-8B, Llama-3.1-Swallow-8B) on an
   A100-80GB profile, answering KV-lookup questions right or wrong as the
   ``laar-default`` accuracy table says (temperature 0: deterministic), timed
   ``--speed`` times faster than real time.
2. Offline measurement: the *fit* split's questions are sent once to every
   emulator directly (``max_attempts`` 1); the verdicts become an outcomes
   JSONL, and ``longroute fit capability`` (the CLI) fits Q(m, x) from it.
3. For each router (laar with that capability; load-aware, llm-d's scorer and the
   paper's baseline; session-affinity; least-load, longroute's token balancer):
   a fresh set of emulators (cold prefix caches) behind ``longroute serve``,
   and ``longroute bench --workload kv-lookup`` (the CLI) on the *eval*
   split through it: 8 closed-loop users, up to R = 10 attempts per
   question, each retry naming the models that answered wrongly
   (``x-longroute-tried``), all attempts of a question under one session key.

It prints, per router, mean/p50/p95 TTCA, the final success rate, mean
attempts and censored questions, then LAAR's mean TTCA over each baseline's
(overall and averaged over the (length, language) settings) and a per-setting
table; the last line is one JSON object with those figures. Every process it
starts is stopped when it ends, whatever ends it. The accuracy table's numbers
are ours (shaped after the paper's §3), so this checks the routers' ordering,
not the paper's absolute figures.

    python benchmarks/laar_gateway.py [--queries-per-setting 50] [--speed 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from longroute.bench import BenchOptions, run_bench_async
from longroute.bench.kv import parse_kv_session_id
from longroute.estimators.capability_fit import Outcome, write_outcomes
from longroute.features.length import bucket_label
from longroute.launcher import Child, Launcher, emulator_spec, gateway_spec
from longroute.workloads.kv_prompts import KV_CHARS_PER_TOKEN, KV_TASK

MODELS = ("phi-3-mini", "phi-3-medium", "granite-3.1-2b", "granite-3.1-8b", "llama-3.1-swallow-8b")
HARDWARE = "a100-80g"
ROUTERS = ("laar", "load-aware", "session-affinity", "least-load")
BASELINES = ROUTERS[1:]
ALIAS = "kv-fleet"  # the model name clients use; the gateway may pick any backend
READY_TIMEOUT_S = 120.0


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--queries-per-setting",
        type=int,
        default=50,
        help="questions per (length, language) in each split (fit and eval); 50 = the "
        "scenario's size (6 runs in ~4 minutes but is too light to load the engines)",
    )
    parser.add_argument(
        "--lengths",
        default="4096,8192,16384,32768,65536",
        help="target prompt lengths in tokens, comma-separated",
    )
    parser.add_argument("--languages", default="latin,japanese,cjk")
    parser.add_argument("--speed", type=float, default=20.0, help="emulator time factor")
    parser.add_argument("--max-attempts", type=int, default=10, help="R")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop users")
    parser.add_argument("--alpha", type=float, default=0.7, help="LAAR's queue weight")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="keep logs, outcomes, capability, reports here")
    return parser.parse_args()


def _kv_params(args: argparse.Namespace, split: str) -> dict[str, Any]:
    return {
        "num_queries": 2 * args.queries_per_setting,  # fit: the first half, eval: the rest
        "lengths_tokens": [int(n) for n in args.lengths.split(",")],
        "languages": args.languages.split(","),
        "split": split,
    }


def _start_fleet(launcher: Launcher, tag: str, speed: float) -> tuple[dict[str, str], list[Child]]:
    """Five emulators (all started at once); their URLs by model."""
    extra = ("--accuracy-table", "laar-default", "--temperature", "0")
    specs = [
        emulator_spec(f"{tag}-{m}", profile=m, hardware=HARDWARE, speed=speed, extra_args=extra)
        for m in MODELS
    ]
    children = list(launcher.start(*specs))
    return {m: c.base_url for m, c in zip(MODELS, children, strict=True)}, children


# ---- offline measurement and fit -----------------------------------------------------


async def _measure(urls: dict[str, str], args: argparse.Namespace) -> list[Outcome]:
    """Every fit question once to every model, the five engines loaded at once."""
    options = BenchOptions(
        concurrency=args.concurrency, workload="kv-lookup", workload_params=_kv_params(args, "fit"),
        seed=args.seed, max_attempts=1,
    )  # fmt: skip
    results = await asyncio.gather(*(run_bench_async([u], options) for u in urls.values()))
    outcomes = []
    for result in results:
        (target,) = result.targets.values()
        if target.errors:
            raise RuntimeError(f"measurement on {target.model}: {target.errors[0].message}")
        for r in target.records:
            assert r.is_correct is not None and r.query_id is not None
            language = parse_kv_session_id(r.query_id).language
            outcomes.append(
                Outcome(r.model, language, r.num_prompt_tokens, KV_TASK, r.is_correct, r.query_id)
            )
    return outcomes


def _fit(outcomes: list[Outcome], workdir: Path) -> Path:
    """Outcomes JSONL -> ``longroute fit capability`` -> capability JSON, as a user would."""
    outcomes_path = workdir / "outcomes.jsonl"
    capability_path = workdir / "capability.json"
    write_outcomes(outcomes, outcomes_path)
    cmd = [sys.executable, "-m", "longroute", "fit", "capability", str(outcomes_path),
           "-o", str(capability_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (workdir / "fit.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return capability_path


# ---- one router through the gateway --------------------------------------------------


def _gateway_config(urls: dict[str, str], router: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "router": {"name": router, "params": params},
        "backends": [
            {"name": m, "url": u, "model": m, "hardware": HARDWARE, "max_concurrency": 256}
            for m, u in urls.items()
        ],
        "model_aliases": {ALIAS: "auto"},
        "chars_per_token": KV_CHARS_PER_TOKEN,  # how the questions were sized
        "admission": {"max_queue": 4096},
    }


def _bench(gateway_url: str, router: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``longroute bench`` on the eval split through the gateway; its TTCA object."""
    cmd = [sys.executable, "-m", "longroute", "bench", "--target", f"{router}={gateway_url}",
           "--model", ALIAS, "--workload", "kv-lookup", "--seed", str(args.seed),
           "--max-attempts", str(args.max_attempts), "--concurrency", str(args.concurrency),
           "--json", "--out", str(out)]  # fmt: skip
    for key, value in _kv_params(args, "eval").items():
        cmd += ["--param", f"{key}={json.dumps(value)}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench through {router} failed:\n{done.stderr}")
    target = json.loads(done.stdout)["targets"][router]
    if target["num_errors"]:
        print(f"warning: {router}: {target['num_errors']} failed requests", file=sys.stderr)
    ttca: dict[str, Any] = target["ttca"]
    ttca["num_requests"] = target["num_requests"]
    return ttca


def _run_router(
    launcher: Launcher, router: str, capability: Path, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    urls, emulators = _start_fleet(launcher, router, args.speed)
    params = {"capability": str(capability), "alpha": args.alpha} if router == "laar" else {}
    config = launcher.write_yaml(f"gw-{router}.yaml", _gateway_config(urls, router, params))
    (gateway,) = launcher.start(gateway_spec(f"gw-{router}", config))
    try:
        started = time.perf_counter()
        ttca = _bench(gateway.base_url, router, args, workdir / f"report-{router}")
        ttca["wall_s"] = time.perf_counter() - started
        return ttca
    finally:
        launcher.stop([*emulators, gateway])


# ---- output -----------------------------------------------------------------------


def _setting_means(ttca: dict[str, Any]) -> dict[str, float]:
    return {
        f"{bucket_label(s['length_bucket_tokens'])}/{s['language']}": s["mean_ttca_s"]
        for s in ttca["by_setting"]
    }


def _print_router(router: str, t: dict[str, Any]) -> None:
    print(f"{router:>17}: mean TTCA {t['mean_s']:7.3f} s  p50 {t['p50_s']:7.3f} s  "
          f"p95 {t['p95_s']:7.3f} s  final success {t['final_success'] * 100:5.1f}%  "
          f"mean attempts {t['mean_attempts']:5.2f}  censored {t['num_censored']:3d}/"
          f"{t['num_queries']}  ({t['num_requests']} requests, {t['wall_s']:.0f} s)",
          flush=True)  # fmt: skip


def _comparison(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """LAAR over each baseline: overall mean TTCA, and the mean of per-setting ratios."""
    laar = results["laar"]
    laar_settings = _setting_means(laar)
    out: dict[str, Any] = {}
    for base in BASELINES:
        other = _setting_means(results[base])
        ratios = {k: v / other[k] for k, v in laar_settings.items() if other.get(k, 0) > 0}
        out[base] = {
            "mean_ttca_ratio": laar["mean_s"] / results[base]["mean_s"],
            "mean_setting_ratio": sum(ratios.values()) / len(ratios),
            "num_settings_lost": sum(r > 1.0 for r in ratios.values()),
            "mean_attempts_ratio": laar["mean_attempts"] / results[base]["mean_attempts"],
            "final_success_difference": laar["final_success"] - results[base]["final_success"],
        }
        print(f"laar / {base}: mean TTCA {out[base]['mean_ttca_ratio']:.2f}x, "
              f"mean of per-setting ratios {out[base]['mean_setting_ratio']:.2f}x "
              f"(laar slower in {out[base]['num_settings_lost']} of {len(ratios)} settings), "
              f"mean attempts {out[base]['mean_attempts_ratio']:.2f}x, final success "
              f"{out[base]['final_success_difference'] * 100:+.1f} points")  # fmt: skip
    return out


def _length_means(ttca: dict[str, Any]) -> dict[str, float]:
    """Mean TTCA per length bucket (over its languages' questions)."""
    sums: dict[int, list[float]] = {}
    for s in ttca["by_setting"]:
        acc = sums.setdefault(s["length_bucket_tokens"], [0.0, 0.0])
        acc[0] += s["mean_ttca_s"] * s["num_queries"]
        acc[1] += s["num_queries"]
    return {bucket_label(edge): total / n for edge, (total, n) in sorted(sums.items())}


def _by_length(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """LAAR's mean TTCA over each baseline's, per length bucket (the seed saw LAAR lose
    at 64K under load)."""
    laar = _length_means(results["laar"])
    out = {}
    for base in BASELINES:
        other = _length_means(results[base])
        out[base] = {k: v / other[k] for k, v in laar.items() if other.get(k, 0) > 0}
        cells = "  ".join(f"{k} {r:.2f}x" for k, r in out[base].items())
        print(f"laar / {base} per length: {cells}")
    return out


def _print_settings(results: dict[str, dict[str, Any]]) -> None:
    means = {router: _setting_means(t) for router, t in results.items()}
    print(f"{'setting':>14} " + " ".join(f"{r:>17}" for r in results) + "   (mean TTCA, s)")
    for setting in means["laar"]:
        cells = " ".join(f"{means[r].get(setting, float('nan')):17.3f}" for r in results)
        lost = any(means["laar"][setting] > means[b].get(setting, float("inf")) for b in BASELINES)
        print(f"{setting:>14} {cells}{'   <- laar slower than a baseline' if lost else ''}")


def main() -> None:
    args = _args()
    workdir = args.out or Path(tempfile.mkdtemp(prefix="lr-laar-gw-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    with Launcher(workdir / "logs", ready_timeout_s=READY_TIMEOUT_S) as launcher:
        urls, fleet = _start_fleet(launcher, "fit", args.speed)
        started = time.perf_counter()
        outcomes = asyncio.run(_measure(urls, args))
        launcher.stop(fleet)
        capability = _fit(outcomes, workdir)
        num_right = sum(o.is_correct for o in outcomes)
        took_s = time.perf_counter() - started
        print(f"offline measurement: {len(outcomes)} answers ({num_right} right) in "
              f"{took_s:.0f} s; fitted {capability}", flush=True)  # fmt: skip
        for router in ROUTERS:
            results[router] = _run_router(launcher, router, capability, args, workdir)
            _print_router(router, results[router])
    comparison = _comparison(results)
    by_length = _by_length(results)
    _print_settings(results)
    print(f"(reports, logs, outcomes and capability in {workdir})")
    keys = ("mean_s", "p50_s", "p95_s", "final_success", "mean_attempts", "num_censored",
            "num_queries", "num_requests", "wall_s")  # fmt: skip
    summary = {
        "routers": {r: {k: t[k] for k in keys} for r, t in results.items()},
        "laar_vs": comparison,
        "laar_vs_by_length": by_length,
        "settings_mean_ttca_s": {r: _setting_means(t) for r, t in results.items()},
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
