"""The gateway's gauges of the router-side prefix index: blocks per backend and its bound."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from longroute.gateway.metrics import GatewayMetrics
from longroute.routing.fleet_view import FleetView
from longroute.types import Endpoint, Request
from test_gateway import FakeBackend, async_test, running_fleet

BLOCKS = "longroute_prefix_index_blocks"
CAPACITY = "longroute_prefix_index_capacity_blocks"


def _gauges(text: str) -> tuple[dict[str, float], float | None]:
    """(blocks by endpoint, capacity) as a Prometheus parser reads them from ``text``."""
    blocks: dict[str, float] = {}
    capacity = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == BLOCKS:
                blocks[sample.labels["endpoint"]] = sample.value
            elif sample.name == CAPACITY:
                assert sample.labels == {}
                capacity = sample.value
    return blocks, capacity


def _request(request_id: str, hashes: tuple[int, ...]) -> Request:
    return Request(request_id, 0.0, 16 * len(hashes), 8, hashes, block_size_tokens=16)


def test_gauges_follow_the_index_and_stop_at_its_bound() -> None:
    endpoints = [Endpoint(n, "m", "h100", "local") for n in ("a", "b")]
    fleet = FleetView(endpoints, prefix_capacity_blocks=5)
    metrics = GatewayMetrics(fleet, lambda: 0)
    assert _gauges(metrics.render().decode()) == ({"a": 0.0, "b": 0.0}, 5.0)

    fleet.record_dispatch(_request("r1", (1, 2, 3)), "a", 1.0)
    assert _gauges(metrics.render().decode()) == ({"a": 3.0, "b": 0.0}, 5.0)

    fleet.record_dispatch(_request("r2", (1, 2, 3, 4)), "a", 2.0)  # extends r1: one more
    fleet.record_dispatch(_request("r3", (7, 8)), "b", 3.0)
    assert _gauges(metrics.render().decode()) == ({"a": 4.0, "b": 2.0}, 5.0)

    fleet.record_dispatch(_request("r4", (11, 12, 13, 14)), "a", 4.0)  # 8 > 5: LRU evicts
    blocks, capacity = _gauges(metrics.render().decode())
    assert blocks == {"a": 5.0, "b": 2.0} and capacity == 5.0
    assert fleet.prefix_index.match((11, 12, 13, 14)) == {"a": 4}


@async_test
async def test_gateway_serves_the_gauges_for_gorgo_and_zero_blocks_without_an_index() -> None:
    long_prompt = " ".join(f"word{i}" for i in range(3000))  # a few hundred 16-token blocks
    a, b = FakeBackend("a"), FakeBackend("b")
    async with running_fleet(a, b, router={"name": "gorgo"}, prefix_index_capacity_blocks=40) as f:
        status, headers, _ = await f.chat(long_prompt)
        chosen = headers["x-longroute-endpoint"]
        async with f.http.get(f.url + "/metrics") as response:
            gorgo_text = await response.text()
    a, b = FakeBackend("a"), FakeBackend("b")
    async with running_fleet(a, b, router={"name": "least-load"}) as f:
        await f.chat(long_prompt)
        async with f.http.get(f.url + "/metrics") as response:
            plain_text = await response.text()
    assert status == 200
    other = "b" if chosen == "a" else "a"
    assert _gauges(gorgo_text) == ({chosen: 40.0, other: 0.0}, 40.0)  # the bound held
    assert _gauges(plain_text) == ({"a": 0.0, "b": 0.0}, 200_000.0)  # config default
