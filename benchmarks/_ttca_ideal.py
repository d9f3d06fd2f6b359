"""ttca_eval's bound for `mixed`: what an ideal router would score (issue 18).

The ideal router knows more than any real one, and its fleet costs it less:

* it knows each model's true accuracy on each question: the scenario's accuracy table,
  where a real router has a Q(m, x) fitted on other questions;
* it finds the fleet idle at every attempt, and the network instant;
* it sends each attempt to the fastest endpoint of the model it tries.

It tries models in ascending order of cost / accuracy. With independent outcomes per
model, that order gives the least expected time until the first success (an exchange
argument: swapping two adjacent models changes the expected cost by the difference of
c_i * p_j and c_j * p_i). It stops at the first right answer, as judged by the
scenario's oracle, or when all models have failed. So it answers every question that
any model answers: laar's success, and more than any router that gives up earlier.

Every attempt pays a full prefill. Each KV-lookup question is a one-turn session with a
document of its own, and another model has none of its KV cache. A deterministic model
retried on its own cache only repeats its wrong answer. An attempt costs its lone
prefill (its TTFT) plus its lone decode.

The bound covers only what it models. A real router also pays queueing beside ~8,000
chat turns, congestion episodes and a fitted Q. Those costs only add to the bound, but
it is not a proof over every possible policy: RTT jitter can dip below the base RTT,
which the bound leaves out by pricing the network at 0. The TTFT p95 counts the chat
turns at 0 s, as if they were fully cached. That keeps it below what any router
attains with the same attempts; a router that pads its count with cheap retries can
still go below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from longroute.config import ScenarioConfig
from longroute.estimators.parallel import prefill_latency_s
from longroute.sim.clients import query_id_of
from longroute.sim.laar_fit import build_oracle
from longroute.sim.scenario import (
    build_endpoints,
    build_predictors,
    build_workload,
    endpoint_slowdowns,
)


@dataclass(frozen=True, slots=True)
class IdealRun:
    """The ideal router on one seed: per question and per request, as ttca_eval's runs."""

    mean_ttca_s: float
    ttft_p95_s: float
    ttft_p95_first_attempt_s: float
    final_success: float
    num_queries: int
    num_requests: int

    def figures(self) -> dict[str, float]:
        return {
            "mean_ttca_s": self.mean_ttca_s,
            "ttft_p95_s": self.ttft_p95_s,
            "ttft_p95_first_attempt_s": self.ttft_p95_first_attempt_s,
            "final_success": self.final_success,
            "num_queries": float(self.num_queries),
            "num_requests": float(self.num_requests),
        }


def lone_times(config: ScenarioConfig, num_prompt_tokens: int, num_output_tokens: int
               ) -> dict[str, tuple[str, float, float]]:  # fmt: skip
    """Per endpoint, ``(model, ttft_s, e2e_s)`` of a lone uncached request at an idle
    fleet, without the network: what the simulator gives such a request (tested)."""
    endpoints = build_endpoints(config)
    predictors = build_predictors(endpoints, endpoint_slowdowns(config))
    out: dict[str, tuple[str, float, float]] = {}
    for e in endpoints:
        p = predictors[e.name]
        ttft_s = prefill_latency_s(p, num_prompt_tokens, e.max_num_batched_tokens)
        e2e_s = ttft_s
        if num_output_tokens > 1:
            e2e_s += p.decode_stretch_time_s(1, num_prompt_tokens, num_output_tokens - 1)
        out[e.name] = (e.model, ttft_s, e2e_s)
    return out


def lone_costs(config: ScenarioConfig, num_prompt_tokens: int, num_output_tokens: int
               ) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Per model, ``(ttft_s, e2e_s)`` of :func:`lone_times` on its fastest endpoint (the
    least E2E)."""
    out: dict[str, tuple[float, float]] = {}
    for model, ttft_s, e2e_s in lone_times(config, num_prompt_tokens, num_output_tokens).values():
        if model not in out or e2e_s < out[model][1]:
            out[model] = (ttft_s, e2e_s)
    return out


def best_order(cost_s: dict[str, float], accuracy: dict[str, float]) -> list[str]:
    """The models in ascending ``cost_s / accuracy``: the order with the least expected
    cost until the first success when each model succeeds independently with
    probability ``accuracy`` (module docstring). A model that never succeeds goes last."""
    return sorted(cost_s, key=lambda m: cost_s[m] / accuracy[m] if accuracy[m] > 0 else math.inf)


def expected_cost(order: list[str], cost_s: dict[str, float], accuracy: dict[str, float]
                  ) -> float:  # fmt: skip
    """Expected cost of trying ``order`` until the first success (all, if none)."""
    total_s, reach = 0.0, 1.0
    for m in order:
        total_s += reach * cost_s[m]
        reach *= 1.0 - accuracy[m]
    return total_s


def ideal_run(config: ScenarioConfig, seed: int) -> IdealRun:
    """The ideal router (module docstring) on ``config`` at ``seed``: every session of
    the workload, judged turns by ``config.correctness``'s oracle."""
    if config.correctness is None:
        raise ValueError(f"scenario {config.name!r} judges no answers: no TTCA to bound")
    workload = build_workload(config, seed)
    oracle = build_oracle(config.correctness, seed)
    costs: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
    seen_blocks: set[int] = set()
    num_chat = 0
    ttfts: list[float] = []
    first_ttfts: list[float] = []
    ttcas: list[float] = []
    num_answered = 0
    for session in workload.sessions:
        for index, turn in enumerate(session.turns):
            if turn.task is None:
                num_chat += 1
                continue
            if index != 0 or not turn.block_hashes or turn.block_hashes[0] in seen_blocks:
                raise ValueError(
                    f"session {session.session_id!r}: a judged turn that is not a fresh "
                    "one-turn prompt breaks the bound's every-attempt-uncached premise"
                )
            seen_blocks.add(turn.block_hashes[0])
            key = (turn.num_prompt_tokens, turn.num_output_tokens)
            if key not in costs:
                costs[key] = lone_costs(config, *key)
            cost = costs[key]
            qid = query_id_of(session.session_id, index)
            assert turn.language is not None
            language = turn.language

            accuracy = {
                m: oracle.table.probability(turn.task, m, language, turn.num_prompt_tokens)
                for m in cost
            }
            order = best_order({m: c[1] for m, c in cost.items()}, accuracy)
            total_s = 0.0
            for attempt, model in enumerate(order):
                ttft_s, e2e_s = cost[model]
                ttfts.append(ttft_s)
                if attempt == 0:
                    first_ttfts.append(ttft_s)
                total_s += e2e_s
                if oracle.is_correct(qid, model, task=turn.task, language=language,
                                     num_prompt_tokens=turn.num_prompt_tokens):  # fmt: skip
                    num_answered += 1
                    break
            ttcas.append(total_s)
    if not ttcas:
        raise ValueError(f"scenario {config.name!r} at seed {seed} has no judged turn")
    chat = [0.0] * num_chat
    return IdealRun(
        mean_ttca_s=math.fsum(ttcas) / len(ttcas),
        ttft_p95_s=float(np.percentile(chat + ttfts, 95)),
        ttft_p95_first_attempt_s=float(np.percentile(chat + first_ttfts, 95)),
        final_success=num_answered / len(ttcas),
        num_queries=len(ttcas),
        num_requests=num_chat + len(ttfts),
    )


IDEAL_METRICS = (("mean_ttca", "mean_ttca_s", True), ("ttft_p95", "ttft_p95_s", True),
                 ("final_success", "final_success", False))  # fmt: skip


def report_ideal(
    ideal: Callable[[str], list[float]],
    series: Callable[[str, str], list[float]],
    routers: list[str],
    ratio: Callable[..., dict[str, Any]],
    line: Callable[[str, list[str]], None],
    cell: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """Print and return, per router, the ideal router's mean TTCA, TTFT p95 and final
    success over the router's (``ratio(ideal, router's, lower=...)``: median over seeds
    [95% CI], seeds the ideal won). ``ideal(metric)`` and ``series(router, metric)``
    give one figure per seed, in the same seed order."""
    print("\nmixed, an ideal router / each: true accuracies, idle fleet, no network (a bound)")
    line("router", ["mean TTCA", "TTFT p95", "final success (x)"])
    out: dict[str, Any] = {}
    for r in routers:
        row = {key: ratio(ideal(metric), series(r, metric), lower=lower)
               for key, metric, lower in IDEAL_METRICS}  # fmt: skip
        out[r] = row
        line(r, [cell(row["mean_ttca"]), cell(row["ttft_p95"]), cell(row["final_success"])])
    return out
