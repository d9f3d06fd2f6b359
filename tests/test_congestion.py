"""Regional congestion episodes: the process, the network, failover in the simulator."""

from __future__ import annotations

import itertools
import random
import statistics
from typing import Any

import pytest
from pydantic import ValidationError

from longroute.config import ConfigError, parse_scenario
from longroute.congestion import (
    CongestionTimeline,
    DwellConfig,
    RegionCongestionConfig,
    timelines,
)
from longroute.sim.network import Network
from longroute.sim.scenario import run_scenario

RANDOM = {
    "normal_s": {"mean_s": 60.0},
    "congested_s": {"mean_s": 20.0, "sigma": 1.0},
    "congested_multiplier": 5.0,
    "down_fraction": 0.25,
    "down_s": {"mean_s": 10.0},
}


def _timeline(spec: dict[str, Any], seed: int = 0, region: str = "far") -> CongestionTimeline:
    return timelines({region: RegionCongestionConfig.model_validate(spec)}, seed)[region]


def test_the_process_alternates_normal_spells_and_episodes_with_the_given_means() -> None:
    episodes = _timeline(RANDOM).episodes_until(400_000.0)
    assert len(episodes) > 3000
    gaps = [b.start_s - a.end_s for a, b in itertools.pairwise(episodes)]
    assert all(g > 0 for g in gaps)  # a normal spell between any two episodes
    assert statistics.mean(gaps) == pytest.approx(60.0, rel=0.06)
    congested = [e.end_s - e.start_s for e in episodes if e.state == "congested"]
    down = [e.end_s - e.start_s for e in episodes if e.state == "down"]
    assert len(down) / len(episodes) == pytest.approx(0.25, abs=0.03)
    assert statistics.mean(congested) == pytest.approx(20.0, rel=0.1)
    assert statistics.mean(down) == pytest.approx(10.0, rel=0.1)
    # lognormal with sigma 1: the median is well below the mean (heavy tail)
    assert statistics.median(congested) < 0.75 * 20.0
    assert {e.multiplier for e in episodes if e.state == "congested"} == {5.0}


def test_dwell_draws_match_their_means() -> None:
    rng = random.Random(3)
    for dwell in (DwellConfig(mean_s=7.0), DwellConfig(mean_s=7.0, sigma=0.5)):
        draws = [dwell.draw(rng) for _ in range(40_000)]
        assert statistics.mean(draws) == pytest.approx(7.0, rel=0.03)


def test_timelines_are_deterministic_per_seed_and_region_and_independent_of_query_order() -> None:
    a = _timeline(RANDOM, seed=1).episodes_until(5_000.0)
    b = _timeline(RANDOM, seed=1).episodes_until(5_000.0)
    assert a == b
    assert a != _timeline(RANDOM, seed=2).episodes_until(5_000.0)
    assert a != _timeline(RANDOM, seed=1, region="other").episodes_until(5_000.0)
    # answering a late query first, then early ones, gives the same states
    late_first = _timeline(RANDOM, seed=1)
    times = [4_000.0, 10.0, 2_500.0, 0.0, 4_999.0]
    forward = _timeline(RANDOM, seed=1)
    expected = {t: forward.state_at(t) for t in sorted(times)}
    assert {t: late_first.state_at(t) for t in times} == expected


def test_a_schedule_gives_exact_states_at_its_boundaries() -> None:
    timeline = _timeline(
        {
            "schedule": [
                {"start_s": 10, "end_s": 20, "state": "congested", "multiplier": 8},
                {"start_s": 30, "end_s": 35, "state": "down"},
            ]
        }
    )
    assert timeline.state_at(9.999) == ("normal", 1.0)
    assert timeline.state_at(10.0) == ("congested", 8.0)
    assert timeline.state_at(19.999) == ("congested", 8.0)
    assert timeline.state_at(20.0) == ("normal", 1.0)
    assert timeline.state_at(32.0)[0] == "down"
    assert timeline.state_at(1e9) == ("normal", 1.0)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({}, "give normal_s"),
        ({"normal_s": {"mean_s": 5}}, "congested_s is required"),
        ({"normal_s": {"mean_s": 5}, "down_fraction": 1.0}, "down_s is required"),
        ({"normal_s": {"mean_s": 0}, "congested_s": {"mean_s": 1}}, "greater than 0"),
        ({"schedule": [{"start_s": 5, "end_s": 5, "state": "down"}]}, "must be after"),
        (
            {
                "schedule": [
                    {"start_s": 0, "end_s": 10, "state": "down"},
                    {"start_s": 5, "end_s": 15, "state": "congested"},
                ]
            },
            "overlap",
        ),
        ({"schedule": [{"start_s": 0, "end_s": 1, "state": "slow"}]}, "state"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        RegionCongestionConfig.model_validate(spec)
    assert needle in str(info.value)


def test_the_network_multiplies_rtt_while_congested_and_refuses_while_down() -> None:
    spec = {
        "schedule": [
            {"start_s": 10, "end_s": 20, "state": "congested", "multiplier": 6},
            {"start_s": 30, "end_s": 40, "state": "down"},
        ]
    }
    network = Network(
        {"near": {"near": 1.0, "far": 50.0}, "far": {"near": 50.0, "far": 1.0}},
        "near",
        random.Random(0),
        congestion={"far": _timeline(spec)},
    )
    assert network.sample_rtt_s("far", 5.0) == pytest.approx(0.050)
    assert network.sample_rtt_s("far", 15.0) == pytest.approx(0.300)
    assert network.sample_rtt_s("near", 15.0) == pytest.approx(0.001)
    assert not network.is_down("far", 29.9)
    assert network.is_down("far", 30.0) and not network.is_down("near", 30.0)
    with pytest.raises(ValueError, match="unknown region"):
        Network(
            {"near": {"near": 1.0}}, "near", random.Random(0), congestion={"x": _timeline(spec)}
        )


def _two_regions(congestion: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "congested",
        "seed": 1,
        "network": {
            "router_region": "near",
            "rtt_ms": {"near": {"far": 40}},
            "congestion": congestion,
            "connect_timeout_s": 2.0,
            "health_check_interval_s": 1.0,
        },
        "fleet": [
            {"name": "a", "model": "llama-3-8b", "hardware": "h100", "region": "near"},
            {"name": "b", "model": "llama-3-8b", "hardware": "h100", "region": "far"},
        ],
        "workload": {"generator": "short-chat", "params": {"num_sessions": 300}},
        "clients": {"kind": "open", "arrival": "poisson", "rate_per_s": 10},
    }


def test_a_down_region_fails_over_loses_nothing_and_comes_back_after_the_episode() -> None:
    down = {"far": {"schedule": [{"start_s": 5.0, "end_s": 15.0, "state": "down"}]}}
    config = parse_scenario(_two_regions(down), "test.yaml")
    result = run_scenario(config, routers=["round-robin"]).results["round-robin"]
    baseline = run_scenario(parse_scenario(_two_regions({}), "test.yaml"), routers=["round-robin"])
    records = result.records
    assert len(records) == len(baseline.results["round-robin"].records)  # nothing lost
    assert result.num_rejected == 0
    assert result.num_failovers >= 1
    # no request dispatched to the far region while it was down ...
    assert not [r for r in records if r.endpoint == "b" and 5.0 <= r.dispatch_s < 15.0]
    # ... requests that met it paid the connect timeout and were served near
    failed_over = [r for r in records if r.dispatch_s - r.arrival_s >= 2.0]
    assert failed_over and {r.endpoint for r in failed_over} == {"a"}
    # and once a probe finds it up again (within one interval), it takes traffic
    assert [r for r in records if r.endpoint == "b" and 16.0 <= r.dispatch_s < 20.0]


def test_congested_episodes_slow_the_requests_sent_during_them() -> None:
    episode = {"start_s": 0.0, "end_s": 1e6, "state": "congested", "multiplier": 20}
    slow = {"far": {"schedule": [episode]}}
    base = run_scenario(parse_scenario(_two_regions({}), "test.yaml"), routers=["round-robin"])
    hot = run_scenario(parse_scenario(_two_regions(slow), "test.yaml"), routers=["round-robin"])

    def far_ttft(result: Any) -> float:
        rs = result.results["round-robin"].records
        return statistics.median(r.first_token_s - r.arrival_s for r in rs if r.endpoint == "b")

    # 40 ms RTT becomes 800 ms: the far endpoint's median TTFT grows by about 0.76 s
    assert far_ttft(hot) - far_ttft(base) == pytest.approx(0.76, abs=0.1)


def test_a_scenario_naming_an_unknown_region_in_congestion_is_a_clear_error() -> None:
    bad = _two_regions({"mars": {"schedule": [{"start_s": 0, "end_s": 1, "state": "down"}]}})
    with pytest.raises(ConfigError) as info:
        parse_scenario(bad, "test.yaml")
    assert "mars" in str(info.value) and "test.yaml" in str(info.value)
