"""benchmarks/workload_speed.py: the generators' speed, timed where a timed unit test flaked."""

from __future__ import annotations

import json

import pytest

from bench_modules import load_benchmark

workload_speed = load_benchmark("workload_speed.py")


def test_one_case_reports_its_figures_and_a_goal_judged_on_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = workload_speed.main(["--repeat", "2", "--cases", "medha_mix"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(result))  # the last line is the whole result
    figure = result["figures"]["medha_mix"]
    assert 0 < figure["cpu_s"] <= figure["cpu_max_s"] and figure["wall_s"] > 0
    goal = result["goals"]["medha_mix_cpu_s"]
    assert goal["value"] == round(figure["cpu_s"], 4)
    assert goal["met"] is (goal["value"] <= workload_speed.GOALS_S["medha_mix"])
    assert set(result["goals"]) == {"medha_mix_cpu_s"}


def test_a_missing_trace_is_a_null_goal_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload_speed, "MOONCAKE", workload_speed.ROOT / "no-such-trace.jsonl")
    result = workload_speed.main(["--repeat", "1", "--cases", "mooncake"])
    assert result["figures"] == {"mooncake": None}
    assert result["goals"]["mooncake_cpu_s"] == {
        "target": "<= 1.0 s (median CPU time)",
        "value": None,
        "met": None,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cases", "nope"], "unknown case(s) ['nope']"),
        (["--cases", ","], "unknown case(s) []"),
        (["--repeat", "0"], "--repeat must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        workload_speed.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
