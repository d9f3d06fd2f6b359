"""ttca prices a prefix the fleet's index holds but the endpoint has likely evicted (issue
35): past its KV memory's worth of prompt blocks sent there since, it is uncached."""

from __future__ import annotations

from longroute.prefix.router_index import RouterPrefixIndex
from longroute.routing.fleet_view import FleetView
from longroute.routing.ttca import TtcaRouter
from longroute.routing.ttca_support import held_matches
from longroute.types import Endpoint, Request

BLOCK = 512


def _send(router: TtcaRouter, fleet: FleetView, request: Request) -> None:
    router.route(request, fleet, 0.0)
    router.on_dispatch(request, "a", 0.0)
    fleet.record_holdings(request, "a", 0.0)


def _prompt(rid: str, blocks: tuple[int, ...]) -> Request:
    return Request(rid, 0.0, len(blocks) * BLOCK, 50, block_hashes=blocks,
                   block_size_tokens=BLOCK)  # fmt: skip


def test_a_prefix_pushed_out_of_the_kv_memory_is_priced_uncached() -> None:
    router = TtcaRouter()
    fleet = FleetView([Endpoint(name="a", model="llama-3-8b", hardware="h100", region="r")])
    router.route(Request("warm", 0.0, BLOCK, 10, block_size_tokens=BLOCK), fleet, 0.0)
    router._kv_capacity["a"] = 4 * BLOCK  # a KV memory of four blocks
    first = _prompt("x", (1, 2, 3))
    _send(router, fleet, first)
    router.route(_prompt("x2", (1, 2, 3)), fleet, 0.0)
    assert router._last["a"][1] == 3 * BLOCK  # still held: priced as cached
    _send(router, fleet, _prompt("y", (10, 11, 12, 13)))  # four newer blocks fill it
    assert fleet.prefix_index.match((1, 2, 3)) == {"a": 3}  # the fleet still says held
    router.route(_prompt("x3", (1, 2, 3)), fleet, 0.0)
    uncached, cached = router._last["a"][:2]
    assert (uncached, cached) == (3 * BLOCK, 0)


def test_held_matches_cuts_only_endpoints_with_a_bounded_lru() -> None:
    lru = RouterPrefixIndex(("a",), 2)
    lru.insert((1, 2, 3), "a", 0.0)  # two blocks' room: the path's last block is evicted
    matched = {"a": 3, "b": 3}
    assert held_matches(matched, {"a": lru}, (1, 2, 3)) == {"a": 2, "b": 3}
    assert held_matches(matched, {}, (1, 2, 3)) is matched
    assert matched == {"a": 3, "b": 3}  # the fleet's figures are not changed in place
