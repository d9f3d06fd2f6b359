"""Issue 14's "no silent surprises": each finding either works or fails with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from longroute.cli import app

TINY = """\
name: tiny
network:
  router_region: us
  rtt_ms: {us: {us: 1}}
fleet:
  - {name: a, model: llama-3-8b, hardware: a100-80g, region: us, replicas: 2}
workload:
  generator: short-chat
  params: {num_sessions: 50}
clients: {kind: open, arrival: poisson, rate_per_s: 5}
"""


def _simulate(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["simulate", "--no-report", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_misspelt_scenario_gets_a_suggestion() -> None:
    code, _, stderr = _simulate("--scenario", "defualt")
    assert code == 2 and "unknown scenario 'defualt' (did you mean 'default'?)" in stderr


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nnetwork: [\n", encoding="utf-8")
    code, _, stderr = _simulate("--scenario", str(path))
    assert code == 2
    assert f"{path}:3:1: not valid YAML: expected the node content" in stderr.replace("\n", "")
    assert "<unicode string>" not in stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "hardware: a100-80g",
            "hardware: a100-81g",
            "fleet[0].hardware: unknown hardware profile 'a100-81g' (did you mean 'a100-80g'?)",
        ),
        (
            "model: llama-3-8b",
            "model: llama-3-9b",
            "fleet[0].model: unknown model profile 'llama-3-9b' (did you mean 'llama-3-8b'?)",
        ),
        (
            "generator: short-chat",
            "generator: short-chatt",
            "workload.generator: unknown workload 'short-chatt' (did you mean 'short-chat'?)",
        ),
        (
            "name: tiny",
            "name: tiny\nqueue_policy: larss",
            "queue_policy: unknown queue policy 'larss' (did you mean 'lars'?)",
        ),
        (
            "name: tiny",
            "name: tiny\nbatch_packer: time-budgets",
            "batch_packer: unknown batch packer 'time-budgets' (did you mean 'time-budget'?)",
        ),
    ],
)
def test_unknown_names_in_a_scenario_name_the_file_and_field(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TINY.replace(old, new), encoding="utf-8")
    code, _, stderr = _simulate("--scenario", str(path))
    assert code == 2 and f"{path}: {message}" in stderr.replace("\n", "")


def _trace(tmp_path: Path, num: int = 40, gap_s: float = 0.5) -> Path:
    path = tmp_path / "t.jsonl"
    lines = [
        f'{{"prompt_tokens": 200, "output_tokens": 20, "arrival_s": {i * gap_s}}}'
        for i in range(num)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TRACE_SCENARIO = """\
name: replay
network:
  router_region: us
  rtt_ms: {{us: {{us: 1}}}}
fleet:
  - {{name: a, model: llama-3-8b, hardware: a100-80g, region: us, replicas: 2}}
workload: {{trace: {trace}}}
{extra}"""


def test_a_trace_scenario_replays_its_timestamps_by_default(tmp_path: Path) -> None:
    from longroute.sim.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(TRACE_SCENARIO.format(trace=_trace(tmp_path), extra=""), encoding="utf-8")
    assert load_scenario(str(path)).clients.arrival == "trace"
    explicit = "clients: {arrival: poisson, rate_per_s: 2}\n"
    path.write_text(TRACE_SCENARIO.format(trace=_trace(tmp_path), extra=explicit), "utf-8")
    assert load_scenario(str(path)).clients.arrival == "poisson"  # asked for: kept


def test_a_window_load_scale_spaces_a_trace_replay(tmp_path: Path) -> None:
    import json

    windows = "windows:\n  - {name: full}\n  - {name: half, load_scale: 0.5, seed_offset: 0}\n"
    path = tmp_path / "s.yaml"
    path.write_text(TRACE_SCENARIO.format(trace=_trace(tmp_path), extra=windows), "utf-8")
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", str(path), "--routers", "least-load", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    full, half = json.loads(result.stdout)["windows"]
    assert half["num_requests"] == full["num_requests"] == 40
    full_s = full["routers"]["least-load"]["duration_s"]
    half_s = half["routers"]["least-load"]["duration_s"]
    assert half_s == pytest.approx(2 * full_s, rel=0.1)  # 19.5 s of arrivals become 39 s


def test_trace_on_a_windowed_scenario_is_refused(tmp_path: Path) -> None:
    code, _, stderr = _simulate("--scenario", "gorgo", "--trace", str(_trace(tmp_path)))
    assert code == 2
    assert "scenario 'gorgo' runs windows (full, half, third)" in stderr.replace("\n", "")


def test_a_trace_run_has_its_own_report_folder_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    trace = _trace(tmp_path)
    args = ["simulate", "--routers", "least-load", "--trace", str(trace), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "reports" / "default+t" / "summary.json").exists()
    assert not (tmp_path / "reports" / "default").exists()
    assert "report: reports/default+t" in result.stderr


def test_an_overloaded_run_says_the_fleet_fell_behind(tmp_path: Path) -> None:
    trace = tmp_path / "heavy.jsonl"
    lines = [
        f'{{"prompt_tokens": 30000, "output_tokens": 300, "arrival_s": {i * 0.05}}}'
        for i in range(150)
    ]
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(TRACE_SCENARIO.format(trace=trace, extra=""), encoding="utf-8")
    code, _, stderr = _simulate("--scenario", str(path), "--routers", "round-robin", "--json")
    assert code == 0
    text = stderr.replace("\n", " ")
    assert "warning: round-robin: the run went on" in text
    assert "fell behind: a-" in text and "a-0 (+" in text and "a-1 (+" in text


def test_a_run_that_keeps_up_gets_no_backlog_warning(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TRACE_SCENARIO.format(trace=_trace(tmp_path), extra=""), encoding="utf-8")
    code, _, stderr = _simulate("--scenario", str(path), "--routers", "round-robin", "--json")
    assert code == 0 and "warning" not in stderr


def test_only_the_endpoints_that_fell_behind_are_named() -> None:
    from longroute.metrics.backlog import find_backlog
    from longroute.metrics.records import RequestRecord

    def record(i: int, endpoint: str, arrival: float, finish: float) -> RequestRecord:
        return RequestRecord(
            f"r{i}", None, "x", endpoint, "m", None, arrival, arrival, arrival, finish, 1, 0, 1
        )

    kept_up = [record(i, "fast", i, i + 1.0) for i in range(100)]
    assert find_backlog(kept_up) is None
    slow = [record(100 + i, "slow", i, 500.0 + i) for i in range(3)]
    backlog = find_backlog(kept_up + slow)
    assert backlog is not None and backlog.endpoints == (("slow", 403.0),)
    assert backlog.drain_s == 403.0 and backlog.arrival_span_s == 99.0
