"""The gateway's speed benchmarks, checked on small inputs: the in-process handler path
runs and answers (benchmarks/gateway_handler.py), and gateway_overhead.py's goals line
holds issue 32's and issue 36's goals, computed from made-up results, also pooled over
runs (``--pool``)."""

from __future__ import annotations

import json
from pathlib import Path

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


def _run_output(paired: dict[str, dict[str, list[float]]]) -> str:
    cells = {goal: {cell: {"rounds": rounds} for cell, rounds in by_cell.items()}
             for goal, by_cell in paired.items()}  # fmt: skip
    return "round lines\n" + json.dumps({"paired": cells, "goals": {}}) + "\n"


def test_pool_judges_each_goal_over_the_rounds_of_every_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overhead = load_benchmark("gateway_overhead.py")
    runs = [  # per-round ratios; three runs of five rounds
        {"observed_vs_plain": {"rr +log non-stream": [0.97, 1.0, 1.01, 0.99, 1.02]},
         "cpu_vs_sglang": {"rr non-stream": [0.9, 0.85, 0.88, 0.95, 0.86]},
         "observed_vs_sglang": {"rr +log non-stream": [0.9, 1.1, 1.0, 0.95, 1.05]}},
        {"observed_vs_plain": {"rr +log non-stream": [0.98, 0.99, 1.03, 1.0, 0.96]},
         "cpu_vs_sglang": {"rr non-stream": [0.87, 0.91, 0.89, 0.84, 0.9]},
         "observed_vs_sglang": {"rr +log non-stream": [0.93, 1.08, 0.99, 1.02, 0.97]}},
        {"observed_vs_plain": {"rr +log non-stream": [1.0, 0.97, 1.02, 0.99, 1.01]},
         "cpu_vs_sglang": {"rr non-stream": [0.92, 0.86, 0.88, 0.9, 0.87]},
         "observed_vs_sglang": {"rr +log non-stream": [1.04, 0.96, 1.01, 0.98, 1.0]}},
    ]  # fmt: skip
    paths = []
    for index, run in enumerate(runs):
        path = tmp_path / f"run{index}.out"
        path.write_text(_run_output(run))
        paths.append(path)
    overhead._pool(paths)
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    plain = out["pooled"]["observed_vs_plain"]["rr +log non-stream"]
    assert plain["num_rounds"] == 15 and plain["verdict"] == "met"
    assert plain["ci"][0] > 0.95 and out["goals"]["observed_vs_plain"]["met"] is True
    cpu = out["pooled"]["cpu_vs_sglang"]["rr non-stream"]
    assert cpu["verdict"] == "missed" and cpu["won"] == 15  # every round below 1, none <= 0.7
    assert out["goals"]["cpu_vs_sglang"]["met"] is False
    assert out["pooled"]["observed_vs_sglang"]["rr +log non-stream"]["verdict"] == "unresolved"
    assert out["goals"]["observed_vs_sglang"]["met"] is None  # the CI holds 1.0
    assert "ahead_of_sglang" not in out["goals"]  # no run had its cells: not judged


def test_pool_refuses_a_file_that_is_not_a_runs_output(tmp_path: Path) -> None:
    overhead = load_benchmark("gateway_overhead.py")
    broken = tmp_path / "broken.out"
    texts = [
        "a run that died before its JSON line\n",
        json.dumps({"paired": {"observed_vs_plain": {"rr": {"median": 1.0}}}}),  # no rounds
        json.dumps({"paired": {"observed_vs_plain": {"rr": {"rounds": ["x"]}}}}),
        '{"paired": {"observed_vs_plain": {"rr": {"rounds": [1.0, NaN]}}}}',
    ]
    for text in texts:
        broken.write_text(text)
        with pytest.raises(SystemExit, match=r"broken\.out: not the output of a gateway_overhead"):
            overhead._pool([broken])
