"""Scenario configuration: validation, built-ins, endpoint expansion, context limits."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from longroute.config import ConfigError, NetworkConfig, parse_scenario
from longroute.estimators.profiles import load_model_profile
from longroute.registry import RegistryError
from longroute.routing import ROUTERS
from longroute.sim.scenario import (
    build_endpoints,
    build_predictors,
    build_workload,
    builtin_scenario_names,
    fit_context_limits,
    load_scenario,
    run_scenario,
)

LLAMA_8B_CONTEXT_TOKENS = 131072


def _tiny() -> dict[str, Any]:
    """A small valid scenario as parsed YAML; tests change copies of it."""
    return {
        "name": "tiny",
        "seed": 1,
        "network": {"router_region": "us-east", "rtt_ms": {"us-east": {"eu-west": 80}}},
        "fleet": [
            {"name": "use", "model": "llama-3-8b", "hardware": "h100", "region": "us-east"},
            {"name": "euw", "model": "llama-3-8b", "hardware": "h100", "region": "eu-west"},
        ],
        "workload": {"generator": "short-chat", "params": {"num_sessions": 50}},
        "clients": {"kind": "open", "arrival": "poisson", "rate_per_s": 20},
    }


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_tiny())
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _error(data: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse_scenario(data, "test.yaml")
    message = str(info.value)
    assert message.startswith("test.yaml:"), message
    return message


# --- built-ins -------------------------------------------------------------------------------


def test_builtin_scenarios_load_and_resolve() -> None:
    names = builtin_scenario_names()
    assert "default" in names
    for name in names:
        config = load_scenario(name)
        assert config.name == name
        endpoints = build_endpoints(config)
        assert len(endpoints) == sum(group.replicas for group in config.fleet)
        assert {e.region for e in endpoints} <= set(config.network.rtt_ms)
        limited = fit_context_limits(endpoints, build_predictors(endpoints))
        assert all(e.max_model_len_tokens is not None for e in limited)
        for router in config.routers or ():
            assert router in ROUTERS
        for router in config.router_params:
            assert router in ROUTERS


def test_default_scenario_workload_is_4000_requests() -> None:
    config = load_scenario("default")
    assert build_workload(config, config.seed).num_requests == 4000


def test_unknown_builtin_lists_the_builtins() -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario("nosuch")
    for name in builtin_scenario_names():
        assert name in str(info.value)


def test_scenario_files_load_by_path_and_report_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\n" + _yaml_body(), encoding="utf-8")
    assert load_scenario(str(path)).name == "mine"
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(str(tmp_path / "absent.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: {unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scenario(str(broken))


def _yaml_body() -> str:
    return (
        "network: {router_region: r, rtt_ms: {r: {r: 1}}}\n"
        "fleet: [{name: e, model: llama-3-8b, hardware: h100, region: r}]\n"
        "workload: {generator: short-chat, params: {num_sessions: 5}}\n"
    )


# --- validation ------------------------------------------------------------------------------


def test_tiny_scenario_is_valid_with_documented_defaults() -> None:
    config = parse_scenario(_tiny(), "test.yaml")
    assert config.clients.rate_per_s == 20
    assert config.routers is None
    assert config.queue_policy == "fcfs"
    assert config.is_prefix_caching is True
    assert config.slo is None


@pytest.mark.parametrize(
    ("path", "where"),
    [
        (("fleeet",), "fleeet"),
        (("fleet", 0, "replica"), "fleet.0.replica"),
        (("clients", "rate_pre_s"), "clients.rate_pre_s"),
    ],
)
def test_unknown_keys_are_errors_naming_their_path(path: tuple[str | int, ...], where: str) -> None:
    assert where in _error(_with(path, 2))


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("clients", "rate_per_s"), -1.0, "clients.rate_per_s"),
        (("clients", "rate_per_s"), 0, "clients.rate_per_s"),
        (("fleet", 1, "replicas"), 0, "fleet.1.replicas"),
        (("fleet", 0, "gpu_memory_utilization"), 1.5, "fleet.0.gpu_memory_utilization"),
        (("network", "peak_multiplier"), 0.5, "network.peak_multiplier"),
        (("clients", "kind"), "half-open", "clients.kind"),
    ],
)
def test_out_of_range_values_are_errors_naming_the_field(
    path: tuple[str | int, ...], value: object, where: str
) -> None:
    assert where in _error(_with(path, value))


@pytest.mark.parametrize("data", [[1, 2], "text", 3, None])
def test_a_scenario_must_be_a_mapping(data: object) -> None:
    assert "mapping" in _error(data)


def test_workload_needs_exactly_one_of_generator_and_trace() -> None:
    neither = _with(("workload",), {"params": {}})
    both = _with(("workload",), {"generator": "short-chat", "trace": "t.jsonl"})
    for data in (neither, both):
        message = _error(data)
        assert "workload" in message
        assert "exactly one of 'generator' or 'trace'" in message
    only_trace = parse_scenario(_with(("workload",), {"trace": "t.jsonl"}), "test.yaml")
    assert only_trace.workload.trace == "t.jsonl"


# --- network ---------------------------------------------------------------------------------


def test_rtt_matrix_is_made_symmetric_with_a_default_diagonal() -> None:
    net = NetworkConfig(
        router_region="a", rtt_ms={"a": {"b": 80.0, "c": 150.0}, "b": {"b": 3.0, "c": 40.0}}
    )
    assert net.rtt_ms == {
        "a": {"a": 1.0, "b": 80.0, "c": 150.0},
        "b": {"a": 80.0, "b": 3.0, "c": 40.0},
        "c": {"a": 150.0, "b": 40.0, "c": 1.0},
    }


def test_rtt_matrix_rejects_negative_values_and_an_unknown_router_region() -> None:
    assert "rtt_ms.us-east.eu-west" in _error(
        _with(("network", "rtt_ms"), {"us-east": {"eu-west": -5}})
    )
    message = _error(_with(("network", "router_region"), "mars"))
    assert "'mars'" in message
    assert "us-east" in message


def test_conflicting_rtt_values_are_rejected() -> None:
    data = _with(("network", "rtt_ms"), {"us-east": {"eu-west": 80}, "eu-west": {"us-east": 90}})
    message = _error(data)
    assert "80" in message and "90" in message


def test_fleet_region_without_rtt_is_rejected_naming_it() -> None:
    data = _with(("fleet", 1, "region"), "ap-northeast")
    message = _error(data)
    assert "'ap-northeast'" in message
    assert "'euw'" in message  # the fleet group
    assert "us-east" in message  # the known regions


# --- endpoints and context limits ------------------------------------------------------------


def test_build_endpoints_expands_replicas_with_suffixes() -> None:
    data = _with(("fleet", 0, "replicas"), 2)
    data["fleet"][0]["num_gpus"] = 2
    data["fleet"][0]["max_num_seqs"] = 64
    endpoints = build_endpoints(parse_scenario(data, "test.yaml"))
    assert [e.name for e in endpoints] == ["use-0", "use-1", "euw"]
    for e in endpoints[:2]:
        assert (e.model, e.hardware, e.region) == ("llama-3-8b", "h100", "us-east")
        assert (e.num_gpus, e.max_num_seqs) == (2, 64)
    assert endpoints[2].region == "eu-west"
    assert endpoints[2].num_gpus == 1
    assert all(e.max_model_len_tokens is None for e in endpoints)


def test_fit_context_limits_caps_by_kv_capacity() -> None:
    assert load_model_profile("llama-3-8b").max_model_len_tokens == LLAMA_8B_CONTEXT_TOKENS
    data = _tiny()
    data["fleet"] = [
        {"name": "small", "model": "llama-3-8b", "hardware": "l40s", "region": "us-east",
         "gpu_memory_utilization": 0.5},
        {"name": "big", "model": "llama-3-8b", "hardware": "h100", "region": "us-east"},
        {"name": "capped", "model": "llama-3-8b", "hardware": "h100", "region": "us-east",
         "max_model_len_tokens": 4096},
    ]  # fmt: skip
    endpoints = build_endpoints(parse_scenario(data, "test.yaml"))
    predictors = build_predictors(endpoints)
    small, big, capped = fit_context_limits(endpoints, predictors)
    small_capacity = predictors["small"].kv_capacity_tokens(0.5)
    assert small_capacity < LLAMA_8B_CONTEXT_TOKENS
    assert small.max_model_len_tokens == small_capacity
    assert big.max_model_len_tokens == LLAMA_8B_CONTEXT_TOKENS  # KV holds more than the model
    assert capped.max_model_len_tokens == 4096
    assert predictors["big"] is predictors["capped"]  # same model, hardware and GPU count


# --- router parameters -----------------------------------------------------------------------


def test_unknown_router_param_fails_naming_it() -> None:
    data = _with(("router_params",), {"round-robin": {"bogus": 1}})
    config = parse_scenario(data, "test.yaml")
    with pytest.raises(RegistryError) as info:
        run_scenario(config, routers=["round-robin"])
    message = str(info.value)
    assert "'round-robin'" in message
    assert "bogus" in message


def test_unknown_router_in_scenario_fails_before_simulating() -> None:
    config = parse_scenario(_with(("routers",), ["random", "nosuch"]), "test.yaml")
    with pytest.raises(RegistryError, match="'nosuch'"):
        run_scenario(config)


def test_router_params_for_an_unknown_router_are_rejected() -> None:
    data = _with(("router_params",), {"prefix-cach": {"cache_threshold": 0.5}})
    config = parse_scenario(data, "test.yaml")
    with pytest.raises((ConfigError, RegistryError), match="prefix-cach"):
        run_scenario(config, routers=["round-robin"])
