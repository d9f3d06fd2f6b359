"""Routing overhead: microseconds per routing decision, per router and fleet size.

Every registered router decides on fleets of 5, 16 and 64 endpoints (models
cycled over the five LAAR models, all on a100-80g), with realistic router-side
state: each endpoint holds 0 to 6 in-flight requests of 4K to 64K prompt tokens,
whose block hashes are in the prefix index. Requests carry 8 to 128 block
hashes (half of them extend a prefix already in the index), a language, the
KV-lookup task, a session id and a tried-model list of 0 to 4 models (LAAR's
retry penalty runs), and name no model, so every endpoint is a candidate.
Only ``route`` is timed (the fleet is not changed between decisions).

LAAR gets a CapabilityModel fitted on outcomes drawn from the ``laar-default``
accuracy table. The per-request features the gateway computes for LAAR are
timed too: ``detect_language`` on a real 64K-token KV-lookup prompt from
``workloads.kv_prompts`` in English and in Japanese (~192 KiB at its 3
characters per token; the detector reads only the last 512 characters, so
size hardly matters), and ``length_bucket``.

Per fleet size, every router gets one warm-up pass, then ``--rounds`` rounds
of ``--decisions`` single decisions, each timed; the routers take turns
within a round, so a busy neighbour process hits them alike. Per round the
median and p99 are taken; the median over rounds is reported (the machine's
CPU count and load average are printed alongside: compare ratios). The gateway budget is
sglang-router 0.3.2's added p50 latency in ``benchmarks/gateway_overhead.py``
(5.6 ms non-streamed, README "Gateway overhead"). The last line of output is
one JSON object with every figure.

    python benchmarks/routing_overhead.py [--rounds 7] [--decisions 2000] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from longroute.estimators.capability import CapabilityModel
from longroute.estimators.capability_fit import Outcome, fit_capability
from longroute.features.block_hash import synthetic_block_hashes
from longroute.features.language import detect_language
from longroute.features.length import length_bucket
from longroute.routing import ROUTERS, Router
from longroute.routing.fleet_view import FleetView
from longroute.sim.correctness import load_accuracy_table
from longroute.types import Endpoint, Language, Request
from longroute.workloads.kv_prompts import KV_TASK, build_kv_prompt

ROUTER_NAMES = (
    "random",
    "round-robin",
    "least-request",
    "least-load",
    "session-affinity",
    "prefix-cache",
    "laar",
)
FLEET_SIZES = (5, 16, 64)
LAAR_MODELS = (
    "phi-3-mini",
    "phi-3-medium",
    "granite-3.1-2b",
    "granite-3.1-8b",
    "llama-3.1-swallow-8b",
)
LANGUAGES = (Language.LATIN, Language.JAPANESE, Language.CJK)
BLOCK_TOKENS = 512
GATEWAY_BUDGET_MS = 5.6  # sglang-router 0.3.2, added p50, non-streamed (README)
PROMPT_TOKENS = 65536


# ---- fleet, requests, capability ------------------------------------------------


def build_fleet(num_endpoints: int, rng: random.Random) -> tuple[FleetView, list[tuple[int, ...]]]:
    """A fleet with in-flight requests dispatched; returns it and their block chains."""
    endpoints = [
        Endpoint(
            name=f"ep{i:02d}-{LAAR_MODELS[i % 5]}",
            model=LAAR_MODELS[i % 5],
            hardware="a100-80g",
            region="r",
            max_model_len_tokens=131072,
        )
        for i in range(num_endpoints)
    ]
    fleet = FleetView(endpoints)
    chains: list[tuple[int, ...]] = []
    for e in endpoints:
        for j in range(rng.randint(0, 6)):
            num_blocks = rng.choice((8, 16, 32, 64, 128))
            chain = synthetic_block_hashes(None, [rng.getrandbits(48) for _ in range(num_blocks)])
            chains.append(chain)
            request = Request(
                request_id=f"{e.name}-inflight-{j}",
                arrival_s=0.0,
                num_prompt_tokens=num_blocks * BLOCK_TOKENS,
                num_output_tokens=rng.randint(16, 256),
                block_hashes=chain,
            )
            fleet.record_dispatch(request, e.name, 0.0)
    return fleet, chains


def build_requests(
    num_requests: int, chains: list[tuple[int, ...]], rng: random.Random
) -> list[Request]:
    requests = []
    for i in range(num_requests):
        num_blocks = rng.randint(8, 128)
        if chains and rng.random() < 0.5:  # extend a prefix that is in the index
            base = rng.choice(chains)
            shared = base[: rng.randint(1, min(len(base), num_blocks))]
            tail = [rng.getrandbits(48) for _ in range(num_blocks - len(shared))]
            hashes = shared + synthetic_block_hashes(shared[-1], tail)
        else:
            hashes = synthetic_block_hashes(None, [rng.getrandbits(48) for _ in range(num_blocks)])
        tried = tuple(rng.sample(LAAR_MODELS, rng.randint(0, 4)))
        requests.append(
            Request(
                request_id=f"r{i}",
                arrival_s=0.0,
                num_prompt_tokens=num_blocks * BLOCK_TOKENS - rng.randint(0, BLOCK_TOKENS - 1),
                num_output_tokens=24,
                block_hashes=hashes,
                language=rng.choice(LANGUAGES),
                task=KV_TASK,
                session_id=f"s{rng.randrange(1000)}",
                attempt=len(tried) + 1,
                tried_models=tried,
            )
        )
    return requests


def build_capability(rng: random.Random) -> tuple[CapabilityModel, str]:
    """A CapabilityModel fitted on 200 outcomes per model, language and bucket."""
    table = load_accuracy_table("laar-default")
    outcomes = [
        Outcome(model, language, edge - 1, KV_TASK, rng.random() < p)
        for model in table.models(KV_TASK)
        for language in LANGUAGES
        for edge in table.bucket_edges_tokens
        for p in [table.probability(KV_TASK, model, language, edge - 1)]
        for _ in range(200)
    ]
    return fit_capability(outcomes), f"CapabilityModel fitted on {len(outcomes)} outcomes"


# ---- timing ---------------------------------------------------------------------


def time_round(call: Callable[[Any], object], args: list[Any]) -> tuple[float, float]:
    """(median, p99) µs of single calls of ``call`` over ``args``, after a GC."""
    gc.collect()
    clock = time.perf_counter_ns
    durations = []
    for a in args:
        t0 = clock()
        call(a)
        durations.append(clock() - t0)
    return statistics.median(durations) / 1000, statistics.quantiles(durations, n=100)[98] / 1000


def time_interleaved(
    calls: dict[str, Callable[[Any], object]], args: list[Any], rounds: int
) -> dict[str, dict[str, float]]:
    """Per call: one warm-up pass, then ``rounds`` rounds, every call once per round (so
    a noisy neighbour hits them alike); median over rounds of each round's median/p99."""
    for call in calls.values():
        for a in args:
            call(a)
    per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            per_round[name].append(time_round(call, args))
    return {
        name: {
            "median_us": statistics.median(m for m, _ in runs),
            "p99_us": statistics.median(p for _, p in runs),
        }
        for name, runs in per_round.items()
    }


def _decider(router: Router, fleet: FleetView) -> Callable[[Request], object]:
    def decide(request: Request) -> object:
        return router.route(request, fleet, 0.0)

    return decide


def bench_routers(
    rounds: int, num_decisions: int, capability: CapabilityModel
) -> dict[str, dict[str, dict[str, float]]]:
    figures: dict[str, dict[str, dict[str, float]]] = {name: {} for name in ROUTER_NAMES}
    for size in FLEET_SIZES:
        rng = random.Random(size)
        fleet, chains = build_fleet(size, rng)
        requests = build_requests(num_decisions, chains, rng)
        calls = {}
        for name in ROUTER_NAMES:
            extra = {"capability": capability} if name == "laar" else {}
            calls[name] = _decider(ROUTERS.build(name, rng=random.Random(0), **extra), fleet)
        for name, figure in time_interleaved(calls, requests, rounds).items():
            figures[name][str(size)] = figure
    return figures


def bench_features(rounds: int, num_calls: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for language in (Language.LATIN, Language.JAPANESE):
        text = build_kv_prompt(0, PROMPT_TOKENS, language).text
        detected = detect_language(text)
        if detected is not language:
            raise SystemExit(f"detect_language gave {detected} for the {language} prompt")
        figure = time_interleaved({"f": detect_language}, [text] * num_calls, rounds)["f"]
        figure["prompt_bytes"] = float(len(text.encode()))
        out[f"detect_language_{language.value}"] = figure
    rng = random.Random(7)
    sizes = [rng.randint(1, 200_000) for _ in range(num_calls)]
    out["length_bucket"] = time_interleaved({"f": length_bucket}, sizes, rounds)["f"]
    return out


# ---- report ---------------------------------------------------------------------


def summarise(
    routers: dict[str, dict[str, dict[str, float]]], features: dict[str, dict[str, float]]
) -> dict[str, Any]:
    ratio = {
        size: routers["laar"][size]["median_us"] / routers["least-load"][size]["median_us"]
        for size in routers["laar"]
    }
    features_us = (
        max(v["median_us"] for k, v in features.items() if k.startswith("detect_language"))
        + features["length_bucket"]["median_us"]
    )
    largest = str(max(FLEET_SIZES))
    laar_total_us = routers["laar"][largest]["median_us"] + features_us
    return {
        "laar_vs_least_load_median": ratio,
        "laar_features_median_us": features_us,
        f"laar_decision_plus_features_median_us_{largest}": laar_total_us,
        "gateway_budget_ms": GATEWAY_BUDGET_MS,
        "laar_share_of_budget": laar_total_us / (GATEWAY_BUDGET_MS * 1000),
    }


def print_report(
    routers: dict[str, dict[str, dict[str, float]]],
    features: dict[str, dict[str, float]],
    summary: dict[str, Any],
) -> None:
    header = "".join(f"{f'{n} endpoints':>22}" for n in FLEET_SIZES)
    print(f"{'router':>18}{header}")
    print(f"{'':>18}" + f"{'median / p99 µs':>22}" * len(FLEET_SIZES))
    for name, by_size in routers.items():
        cells = "".join(
            f"{by_size[str(n)]['median_us']:>12.1f} / {by_size[str(n)]['p99_us']:<7.1f}"
            for n in FLEET_SIZES
        )
        print(f"{name:>18}{cells}")
    ratios = ", ".join(
        f"{v:.2f}x ({n} endpoints)" for n, v in summary["laar_vs_least_load_median"].items()
    )
    print(f"laar / least-load median: {ratios}")
    for name, f in features.items():
        size = f" on {f['prompt_bytes'] / 1024:.0f} KiB" if "prompt_bytes" in f else ""
        print(f"{name}{size}: median {f['median_us']:.2f} µs, p99 {f['p99_us']:.2f} µs")
    largest = max(FLEET_SIZES)
    total = summary[f"laar_decision_plus_features_median_us_{largest}"]
    print(
        f"laar decision ({largest} endpoints) + features: {total:.1f} µs median = "
        f"{summary['laar_share_of_budget']:.4f} of the gateway budget "
        f"({GATEWAY_BUDGET_MS} ms, sglang-router's added p50), i.e. "
        f"{GATEWAY_BUDGET_MS * 1000 / total:.0f}x below it"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--decisions", type=int, default=2000, help="timed decisions per round")
    parser.add_argument("--quick", action="store_true", help="3 rounds x 300 decisions")
    args = parser.parse_args()
    rounds, num_decisions = (3, 300) if args.quick else (args.rounds, args.decisions)
    if rounds < 1 or num_decisions < 100:
        raise SystemExit("need --rounds >= 1 and --decisions >= 100 (for a p99)")
    capability, capability_source = build_capability(random.Random(0))
    load_before = os.getloadavg()[0]
    print(
        f"laar capability: {capability_source}; {rounds} rounds x {num_decisions} decisions; "
        f"{os.cpu_count()} CPUs, load average {load_before:.2f}"
    )
    routers = bench_routers(rounds, num_decisions, capability)
    features = bench_features(rounds, num_decisions)
    summary = summarise(routers, features)
    print_report(routers, features, summary)
    figures = {
        "routers": routers,
        "features": features,
        "summary": summary,
        "capability": capability_source,
        "rounds": rounds,
        "decisions_per_round": num_decisions,
        "num_cpus": os.cpu_count(),
        "load_average_1min": [load_before, os.getloadavg()[0]],  # before, after
    }
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
