"""The `laar` scenario: config sections, capability wiring, router defaults, end to end."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from longroute.cli import app
from longroute.config import ConfigError, ScenarioConfig, parse_scenario
from longroute.estimators.capability import save_capability
from longroute.sim.correctness import CorrectnessOracle, load_accuracy_table
from longroute.sim.laar_fit import measure_outcomes
from longroute.sim.scenario import load_scenario, resolve_routers, run_scenario
from longroute.types import Language
from longroute.workloads.registry import WORKLOADS

FLEET_MODELS = (
    "granite-3.1-2b",
    "granite-3.1-8b",
    "llama-3.1-swallow-8b",
    "phi-3-medium",
    "phi-3-mini",
)


def _laar_data() -> dict[str, Any]:
    text = (resources.files("longroute") / "data" / "scenarios" / "laar.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _reduced(**changes: Any) -> ScenarioConfig:
    """The laar scenario on 10 eval queries per setting (150 queries), for speed."""
    data = copy.deepcopy(_laar_data())
    data["workload"]["params"]["num_queries"] = 20
    data["capability"]["fit_workload"]["params"]["num_queries"] = 20
    data.update(changes)
    return parse_scenario(data, "laar-reduced")


def test_builtin_laar_scenario_matches_the_paper_setup() -> None:
    config = load_scenario("laar")
    assert sorted(g.model for g in config.fleet) == list(FLEET_MODELS)
    assert {g.hardware for g in config.fleet} == {"a100-80g"}
    assert len({g.region for g in config.fleet}) == 1
    assert config.clients.kind == "closed" and config.clients.num_users == 8
    assert config.correctness is not None
    assert config.correctness.max_attempts == 10 and config.correctness.temperature == 0
    assert config.workload.params["split"] == "eval"
    assert config.capability is not None and config.capability.fit_workload is not None
    assert config.capability.fit_workload.params["split"] == "fit"
    assert config.routers == ["laar", "load-aware", "session-affinity", "least-load"]
    assert "ours" in config.description


def test_reduced_laar_run_beats_session_affinity_on_ttca() -> None:
    run = run_scenario(_reduced())
    ttca = run.ttca()
    assert list(ttca) == ["laar", "load-aware", "session-affinity", "least-load"]
    assert all(t.num_queries == 150 for t in ttca.values())
    laar, affinity, load_aware = ttca["laar"], ttca["session-affinity"], ttca["load-aware"]
    assert laar.mean_s < affinity.mean_s
    assert laar.final_success >= affinity.final_success
    # the paper's load-aware baseline (llm-d's scorer: random among empty queues)
    assert laar.mean_s < load_aware.mean_s
    # LAAR stops once every model answered wrongly: never more than five attempts
    assert laar.mean_attempts <= 5.0
    assert all(r.attempt <= 5 for r in run.results["laar"].records)
    # it never re-picks a tried model while an untried one is left: at most 5 distinct tries
    for router, result in run.results.items():
        by_query: dict[str, list[str]] = {}
        for r in result.records:
            assert r.query_id is not None
            by_query.setdefault(r.query_id, []).append(r.model)
        if router == "laar":
            for models in by_query.values():
                first = models[: len(FLEET_MODELS)]
                assert len(set(first)) == len(first)
    assert run.capability is not None
    assert set(run.capability.models) == set(FLEET_MODELS)


def test_measure_outcomes_answers_every_turn_once_per_model() -> None:
    workload = WORKLOADS.build("kv-lookup", {"num_queries": 4, "split": "fit"}, seed=0)
    oracle = CorrectnessOracle(load_accuracy_table("laar-default"))
    outcomes = measure_outcomes(workload, oracle, FLEET_MODELS)
    assert len(outcomes) == workload.num_requests * len(FLEET_MODELS)
    first = outcomes[0]
    assert first.query_id == f"{workload.sessions[0].session_id}:0"
    assert first.task == "kv-lookup" and first.language is Language.LATIN
    assert [o.model for o in outcomes[:5]] == list(FLEET_MODELS)
    # the same oracle draw as in a simulation of that query
    assert first.is_correct == oracle.is_correct(
        first.query_id,
        first.model,
        task="kv-lookup",
        language=Language.LATIN,
        num_prompt_tokens=first.num_prompt_tokens,
    )


def test_capability_from_a_file(tmp_path: Path) -> None:
    fitted = run_scenario(_reduced(), routers=["laar"]).capability
    assert fitted is not None
    path = tmp_path / "capability.json"
    save_capability(fitted, path)
    config = _reduced(capability={"file": str(path)})
    run = run_scenario(config, routers=["laar"])
    assert run.capability == fitted


def test_routers_needing_capability_left_out_by_default_and_refused_when_named() -> None:
    config = _reduced(capability=None, routers=None)
    names = resolve_routers(config)
    assert "laar" not in names and "least-load" in names
    with pytest.raises(ConfigError, match=r"needs a capability model.*`capability` section"):
        resolve_routers(config, ["least-load", "laar"])
    assert "laar" in resolve_routers(_reduced(routers=None))


def test_config_sections_are_validated() -> None:
    with pytest.raises(ConfigError, match="correctness"):
        _reduced(correctness=None)  # fit_workload needs an oracle
    with pytest.raises(ConfigError, match="exactly one of 'fit_workload' or 'file'"):
        _reduced(capability={})
    with pytest.raises(ConfigError, match="max_attempts"):
        _reduced(correctness={"max_attempts": 0})


def test_unknown_model_in_the_accuracy_table_fails_before_simulating(tmp_path: Path) -> None:
    data = copy.deepcopy(_laar_data())
    data["fleet"].append({"name": "llama", "model": "llama-3-8b", "hardware": "a100-80g",
                          "region": "local"})  # fmt: skip
    with pytest.raises(ValueError, match="no model 'llama-3-8b'"):
        run_scenario(parse_scenario(data, "bad"), routers=["least-load"])


def test_cli_json_has_ttca_and_one_line_error_without_capability(tmp_path: Path) -> None:
    data = copy.deepcopy(_laar_data())
    data["workload"]["params"]["num_queries"] = 4
    data["capability"]["fit_workload"]["params"]["num_queries"] = 4
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "--scenario", str(path), "--json", "--no-report"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    ttca = payload["routers"]["laar"]["ttca"]
    assert ttca["num_queries"] == 30 and len(ttca["success_by_attempt"]) == 10
    assert set(payload["ttca_comparison"]["vs"]) == {"least-load", "load-aware", "session-affinity"}
    del data["capability"]
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["simulate", "--scenario", str(path), "--no-report"])
    assert result.exit_code == 2
    assert "needs a capability model" in result.output
    assert len(result.output.strip().splitlines()) == 1
