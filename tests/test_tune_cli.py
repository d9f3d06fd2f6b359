"""`longroute tune` and `simulate --weights` on windowed scenarios: files, --json, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from longroute.cli import app
from longroute.config import ConfigError, parse_scenario
from longroute.sim.scenario import load_scenario
from longroute.tuning import load_weights


def _small_scenario(tmp_path: Path) -> Path:
    """The gorgo scenario with 3-minute windows and fewer sessions, as a YAML file."""
    data: dict[str, Any] = load_scenario("gorgo").model_dump(mode="json")
    data["name"] = "gorgo-small"
    data["workload"]["params"]["num_sessions"] = 300
    for window in data["windows"]:
        window["duration_s"] = 180.0
    data["tuning"]["window_requests"] = 16
    path = tmp_path / "gorgo-small.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_tune_then_simulate_with_the_frozen_weights(tmp_path: Path) -> None:
    scenario = _small_scenario(tmp_path)
    weights = tmp_path / "weights.yaml"
    runner = CliRunner()
    tuned = runner.invoke(
        app,
        ["tune", "--scenario", str(scenario), "-o", str(weights), "--out", str(tmp_path / "t"),
         "--json"],
    )  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    payload = json.loads(tuned.stdout)
    frozen = load_weights(weights)
    assert payload["weights"] == frozen.weights and frozen.router == "gorgo"
    assert payload["tuned_on"]["window"] == "full"
    assert (tmp_path / "t" / "trajectory.csv").read_text().count("\n") == (
        payload["tuned_on"]["num_steps"] + 1
    )
    assert (tmp_path / "t" / "tuner.png").stat().st_size > 1000
    # where the files went: on stderr, also under --json (stdout holds the object alone)
    assert f"frozen weights: {weights}" in tuned.stderr
    assert f"report: {tmp_path / 't'}" in tuned.stderr
    simulated = runner.invoke(
        app,
        ["simulate", "--scenario", str(scenario), "--weights", str(weights), "--json",
         "--routers", "gorgo,prefix-cache", "--out", str(tmp_path / "s")],
    )  # fmt: skip
    assert simulated.exit_code == 0, simulated.output
    assert f"report: {tmp_path / 's'} (one folder per window)" in simulated.stderr
    assert (tmp_path / "s" / "half" / "summary.json").is_file()
    result = json.loads(simulated.stdout)
    assert result["weights"] == frozen.weights
    assert result["reference_router"] == "gorgo"
    assert [w["name"] for w in result["windows"]] == ["full", "half", "third"]
    assert [w["is_tuning_window"] for w in result["windows"]] == [True, False, False]
    for window in result["windows"]:
        assert set(window["routers"]) == {"gorgo", "prefix-cache"}
        assert window["routers"]["gorgo"]["num_requests"] > 0
        ratio = window["reference_vs_best"]["ttft_p95_s"]
        assert ratio["best_baseline"] == "prefix-cache"
        expected = window["routers"]["gorgo"]["ttft_p95_s"] / ratio["best_baseline_value"]
        assert ratio["ratio"] == pytest.approx(expected)


def test_tune_and_weights_errors_are_clean(tmp_path: Path) -> None:
    scenario = _small_scenario(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        app, ["tune", "--scenario", str(scenario), "-o", str(tmp_path / "w.yaml"),
              "--router", "least-load"]
    )  # fmt: skip
    assert result.exit_code == 2 and "least-load" in result.stderr
    assert "Traceback" not in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("router: gorgo\nweights: {rtt_weight: -1}\n", encoding="utf-8")
    result = runner.invoke(app, ["simulate", "--scenario", str(scenario), "--weights", str(bad)])
    assert result.exit_code == 2 and str(bad) in result.stderr.replace("\n", "")
    other = tmp_path / "other.yaml"
    other.write_text("router: laar\nweights: {alpha: 0.5}\n", encoding="utf-8")
    result = runner.invoke(
        app, ["simulate", "--scenario", str(scenario), "--weights", str(other), "--no-report"]
    )
    assert result.exit_code == 2 and "tuned for router 'laar'" in result.stderr


def test_window_and_tuning_sections_are_validated() -> None:
    data: dict[str, Any] = load_scenario("gorgo").model_dump(mode="json")
    twice = {**data, "windows": [{"name": "a"}, {"name": "a"}]}
    with pytest.raises(ConfigError, match="window names must be unique"):
        parse_scenario({**twice, "tuning": None}, "x")
    with pytest.raises(ConfigError, match=r"tuning\.window 'nope' is not a window"):
        parse_scenario({**data, "tuning": {**data["tuning"], "window": "nope"}}, "x")
    bounds = {"queue_weight": [2.0, 1.0]}
    with pytest.raises(ConfigError, match=r"tuning.bounds.queue_weight: need 0 < low < high"):
        parse_scenario({**data, "tuning": {**data["tuning"], "bounds": bounds}}, "x")


def test_validation_freezes_the_best_incumbent_run_frozen_on_the_tuning_window(
    tmp_path: Path,
) -> None:
    """``validate_last``: the last distinct incumbents each run frozen on the whole tuning
    window; the one with the lowest objective is frozen, whichever came last."""
    from longroute.sim.tune import TuneOptions, tune_scenario
    from longroute.sim.windows import run_windows
    from longroute.tuning import as_tunable, get_objective

    config = load_scenario(str(_small_scenario(tmp_path)))
    run = tune_scenario(config, TuneOptions(validate_last=3), seed=1)
    incumbents: list[dict[str, float]] = []
    for step in run.trajectory:
        if step.incumbent not in incumbents:
            incumbents.append(step.incumbent)
    assert len(incumbents) >= 3 and [v.weights for v in run.validation] == incumbents[-3:]
    best = min(run.validation, key=lambda v: v.fitness)
    assert run.frozen.weights == best.weights
    assert len(run.frozen.tuned_on["validated"]) == len(run.validation)
    # a validation fitness is what a frozen run of the window measures
    weights = run.validation[0].weights
    (window,) = run_windows(
        config, seed=1, routers=["gorgo"], only=["full"],
        prepare_router=lambda _, router: as_tunable(router).set_weights(weights) or (),
    )  # fmt: skip
    records = window.run.results["gorgo"].records
    objective = get_objective(config.tuning.objective if config.tuning else "mix")
    expected = objective.value([r.ttft_s for r in records], [r.e2e_s for r in records])
    assert run.validation[0].fitness == pytest.approx(expected)
    assert tune_scenario(config, TuneOptions(), seed=1).validation == ()
