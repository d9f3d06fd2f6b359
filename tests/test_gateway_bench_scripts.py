"""The gateway's speed benchmarks, checked on small inputs: the in-process handler path
runs and answers (benchmarks/gateway_handler.py), and gateway_overhead.py's goals line
holds issue 32's and issue 36's goals, computed from made-up results."""

from __future__ import annotations

import pytest
import uvloop

from bench_modules import load_benchmark


@pytest.mark.parametrize(("router", "observed"), [("round-robin", True), ("prefix-cache", False)])
def test_the_handler_path_runs_and_answers_every_request(router: str, observed: bool) -> None:
    handler = load_benchmark("gateway_handler.py")
    per_round = uvloop.run(handler._child(router, observed, 50, 2))  # raises unless all 200
    assert len(per_round) == 2 and all(0 < us < 1e6 for us in per_round)


def _made_up(
    speed: dict[str, float], cpu: dict[str, float]
) -> dict[str, dict[str, dict[str, float]]]:
    results = {}
    for label in speed:
        results[label] = {
            mode: {"req_per_s": 100.0, "throughput_vs_sglang": speed[label],
                   "cpu_vs_sglang": cpu[label]}
            for mode in ("non-stream", "stream")
        }  # fmt: skip
    return results


def test_the_goals_line_has_both_issues_goals_from_the_worst_cells() -> None:
    overhead = load_benchmark("gateway_overhead.py")
    labels = ["longroute round-robin", "longroute prefix-cache",
              "longroute round-robin +log", "longroute prefix-cache +log"]  # fmt: skip
    results = _made_up(
        dict(zip(labels, (1.3, 1.25, 1.0, 0.9), strict=True)),
        dict(zip(labels, (0.6, 0.75, 1.0, 1.0), strict=True)),
    )
    goals = overhead._goals(results)
    assert goals["ahead_of_sglang"]["value"] == 1.25 and goals["ahead_of_sglang"]["met"] is True
    assert goals["cpu_vs_sglang"]["value"] == 0.75 and goals["cpu_vs_sglang"]["met"] is False
    assert goals["observed_vs_sglang"]["value"] == 0.9  # the +log cells only
    assert goals["observed_vs_sglang"]["met"] is False
    del results["longroute prefix-cache"]  # a cell missing: not judged
    assert overhead._ahead_goals(results)["ahead_of_sglang"]["met"] is None
