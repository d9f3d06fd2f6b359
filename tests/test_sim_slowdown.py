"""Fleet-group ``slowdown``: an engine slower than the hardware profile that routers read."""

from __future__ import annotations

import copy
import statistics
from typing import Any

import pytest

from longroute.config import ConfigError, parse_scenario
from longroute.estimators.parallel import make_predictor
from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.sim.scenario import (
    build_endpoints,
    build_predictors,
    endpoint_slowdowns,
    run_scenario,
    slowed_hardware,
)
from longroute.types import Endpoint

# (prefill tokens, attention pairs, prefill context, decodes, decode context)
BATCHES = {
    "prefill-only": (2048, causal_attention_pairs(2048, 4096), 4096, 0, 0),
    "decode-only": (0, 0.0, 0, 48, 48 * 9000),
    "mixed": (512, causal_attention_pairs(512, 0), 0, 32, 32 * 3000),
    "one-decode": (0, 0.0, 0, 1, 100),
}
# (TP, SPP, KVP): plain TP, TP with all-reduces, pipeline hops, KVP merges
LAYOUTS = [(1, 1, 1), (2, 1, 1), (2, 4, 1), (1, 1, 4), (2, 2, 2)]


def _predictor(slowdown: float, layout: tuple[int, int, int]) -> RuntimePredictor:
    tp, spp, kvp = layout
    hardware = slowed_hardware(load_hardware_profile("h100"), slowdown)
    return make_predictor(
        load_model_profile("llama-3-8b"), hardware, tp, spp_degree=spp, kvp_degree=kvp
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_every_time_term_scales_exactly(batch: str, layout: tuple[int, int, int]) -> None:
    nominal, slow = _predictor(1.0, layout), _predictor(2.0, layout)
    args = BATCHES[batch]
    base_s = nominal.iteration_time_s(*args)
    # scaling by a power of two is exact in binary floating point
    assert slow.iteration_time_s(*args) == 2.0 * base_s
    assert slow.first_token_delay_s(2.0 * base_s) == 2.0 * nominal.first_token_delay_s(base_s)
    odd = _predictor(1.7, layout)
    assert odd.iteration_time_s(*args) == pytest.approx(1.7 * base_s, rel=1e-12)
    faster = _predictor(0.25, layout)
    assert faster.iteration_time_s(*args) == pytest.approx(0.25 * base_s, rel=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stretches_and_prefills_scale_and_kv_capacity_does_not(
    layout: tuple[int, int, int],
) -> None:
    nominal, slow = _predictor(1.0, layout), _predictor(3.0, layout)
    assert slow.decode_stretch_time_s(16, 16 * 2000, 50) == pytest.approx(
        3.0 * nominal.decode_stretch_time_s(16, 16 * 2000, 50), rel=1e-12
    )
    assert slow.prefill_time_s(20_000, 4096) == pytest.approx(
        3.0 * nominal.prefill_time_s(20_000, 4096), rel=1e-12
    )
    for utilization in (0.5, 0.9):
        assert slow.kv_capacity_tokens(utilization) == nominal.kv_capacity_tokens(utilization)


def test_slowed_hardware_scales_rates_and_latencies_only() -> None:
    hw = load_hardware_profile("a100-80g")
    slow = slowed_hardware(hw, 4.0)
    assert slow.peak_flops_per_s == hw.peak_flops_per_s / 4
    assert slow.memory_bandwidth_bytes_per_s == hw.memory_bandwidth_bytes_per_s / 4
    assert slow.interconnect_bytes_per_s == hw.interconnect_bytes_per_s / 4
    assert slow.inter_node_bytes_per_s == hw.inter_node_bytes_per_s / 4
    assert slow.iteration_overhead_s == hw.iteration_overhead_s * 4
    assert slow.allreduce_latency_s == hw.allreduce_latency_s * 4
    assert slow.inter_node_latency_s == hw.inter_node_latency_s * 4
    assert slow.pipeline_stage_overhead_s == hw.pipeline_stage_overhead_s * 4
    kept = ("memory_bytes", "linear_mfu", "attention_mfu", "bandwidth_efficiency", "source")
    for name in kept:
        assert getattr(slow, name) == getattr(hw, name)
    assert slowed_hardware(hw, 1.0) is hw


def _scenario(slowdown: Any = None, **extra: Any) -> dict[str, Any]:
    slow: dict[str, Any] = {"name": "slow", "model": "llama-3-8b", "hardware": "h100"}
    slow.update(region="local", replicas=2)
    if slowdown is not None:
        slow["slowdown"] = slowdown
    return {
        "name": "slowdown",
        "seed": 3,
        "network": {"router_region": "local", "rtt_ms": {"local": {"local": 1}}},
        "fleet": [
            {"name": "fast", "model": "llama-3-8b", "hardware": "h100", "region": "local"},
            slow,
        ],
        "workload": {
            "generator": "short-chat",
            "params": {"num_sessions": 300, "median_prompt_tokens": 3000},
        },
        "clients": {"kind": "open", "arrival": "poisson", "rate_per_s": 12},
        "routers": ["round-robin"],
        **extra,
    }


def test_slowed_endpoint_has_higher_ttfts_and_routers_see_the_nominal_profile() -> None:
    config = parse_scenario(_scenario(2), "test.yaml")
    assert endpoint_slowdowns(config) == {"slow-0": 2.0, "slow-1": 2.0}
    endpoints = build_endpoints(config)
    assert {e.hardware for e in endpoints} == {"h100"}
    predictors = build_predictors(endpoints, endpoint_slowdowns(config))
    assert predictors["slow-0"] is predictors["slow-1"]
    assert predictors["fast"].hardware.name == "h100"
    assert predictors["slow-0"].hardware.iteration_overhead_s == pytest.approx(
        2 * predictors["fast"].hardware.iteration_overhead_s
    )
    run = run_scenario(config)
    records = run.results["round-robin"].records
    ttft = {
        name: statistics.mean(r.ttft_s for r in records if r.endpoint == name)
        for name in ("fast", "slow-0", "slow-1")
    }
    assert ttft["slow-0"] > 1.5 * ttft["fast"], ttft
    assert ttft["slow-1"] > 1.5 * ttft["fast"], ttft


def test_slowdown_default_is_the_nominal_engine() -> None:
    config = parse_scenario(_scenario(), "test.yaml")
    assert endpoint_slowdowns(config) == {}
    assert config.fleet[1].slowdown == 1.0
    endpoints = build_endpoints(config)
    predictors = build_predictors(endpoints, endpoint_slowdowns(config))
    assert predictors["fast"] is predictors["slow-0"]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "x", "2", True, 11, 0.05])
def test_bad_slowdown_is_a_config_error_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(copy.deepcopy(_scenario(bad)), "test.yaml")
    message = str(info.value)
    assert message.startswith("test.yaml: invalid scenario"), message
    assert "fleet.1.slowdown" in message, message


def test_endpoint_without_a_slowdown_entry_runs_nominal() -> None:
    endpoint = Endpoint(name="e", model="llama-3-8b", hardware="h100", region="local")
    nominal = build_predictors([endpoint])["e"]
    assert nominal.hardware is load_hardware_profile("h100")
    assert build_predictors([endpoint], {"other": 2.0})["e"].hardware.name == "h100"
