"""``longroute demo --replicas 2``: two gateway replicas on their own ports in front of the
routed fleet, its emulators publishing KV events; everything stops at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from longroute.demo.fleet import FleetPlan, KvPorts, gateway_config
from longroute.demo.run import DemoOptions, demo_plans
from longroute.gateway.config import parse_gateway_config


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_demo_with_two_replicas_runs_and_stops_everything() -> None:
    cmd = [sys.executable, "-m", "longroute", "demo", "--replicas", "2"]
    cmd += ["--num-requests", "6", "--concurrency", "2", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["replicas"] == 2
    gateways = [p for p in payload["processes"] if p["role"] == "gateway"]
    routed = sorted(p["name"] for p in gateways if p["name"].startswith("routed-"))
    assert routed == ["routed-gateway0", "routed-gateway1"]
    urls = {p["url"] for p in gateways if p["name"] in routed}
    assert len(urls) == 2  # two ports
    # where they are, said while they ran
    said = re.search(r"2 gateway replicas of prefix-cache .* at (\S+), (\S+);", done.stderr)
    assert said is not None, done.stderr
    assert set(said.groups()) == urls
    for summary in payload["bench"]["targets"].values():
        assert summary["num_requests"] == 6 and summary["num_errors"] == 0
    assert payload["is_all_stopped"] is True
    assert [p["pid"] for p in payload["processes"] if _is_alive(p["pid"])] == []


def test_replicas_plan_publishes_events_and_routes_on_them() -> None:
    _, routed = demo_plans(DemoOptions(replicas=3))
    assert routed.num_gateways == 3 and routed.kv_events
    _, single = demo_plans(DemoOptions())
    assert single.num_gateways == 1 and not single.kv_events
    ports = [KvPorts(5557 + 2 * i, 5558 + 2 * i) for i in range(3)]
    config = gateway_config(
        routed, ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"], ports
    )
    parsed = parse_gateway_config(config, "test")
    assert parsed.load_source == "engine"
    assert parsed.precise_prefix is not None and parsed.precise_prefix.tokenizer == "emulator"
    endpoints = [b.kv_events.endpoint for b in parsed.backends if b.kv_events is not None]
    assert endpoints == ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5559", "tcp://127.0.0.1:5561"]
    kv = json.loads(ports[0].emulator_args()[-1])
    assert kv["endpoint"] == "tcp://*:5557" and kv["replay_endpoint"] == "tcp://*:5558"


@pytest.mark.parametrize("replicas", [0, 9, True])
def test_bad_replica_counts_are_clear_errors(replicas: int) -> None:
    with pytest.raises(ValueError, match="replicas"):
        DemoOptions(replicas=replicas)


def test_a_fleet_without_gateway_has_no_replicas() -> None:
    from longroute.demo.fleet import DEFAULT_REPLICAS

    with pytest.raises(ValueError, match="no gateway"):
        FleetPlan("x", replicas=DEFAULT_REPLICAS[:1], router=None, num_gateways=2)
