"""Global engine load (``load_source: engine``): the FleetView's estimate, the fast scraper
against a real loopback engine whose counts change, two gateways that agree, staleness,
hostile pages and the config's bounds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from pydantic import ValidationError

from longroute.clock import WallClock
from longroute.gateway import scrape
from longroute.gateway.backends import build_backends
from longroute.gateway.config import GatewayConfig
from longroute.gateway.scrape import MetricsPageError, parse_engine_metrics
from longroute.gateway.wiring import build_fleet, build_router, monitors
from longroute.routing.fleet_view import FleetView, LoadSource
from longroute.routing.least_load import LeastLoadRouter
from longroute.routing.least_request import LeastRequestRouter
from longroute.types import Endpoint, Request
from thread_server import ThreadServer


def _fleet(source: LoadSource = LoadSource.ENGINE) -> FleetView:
    fleet = FleetView([Endpoint("a", "m", "h", "r"), Endpoint("b", "m", "h", "r")])
    fleet.set_load_source(source)
    return fleet


def _request(i: int, prompt: int = 100, output: int = 10) -> Request:
    return Request(f"r{i}", 0.0, prompt, output, model="m")


# ---- the estimate -------------------------------------------------------------------------


def test_local_source_ignores_scrapes_and_is_the_own_count() -> None:
    fleet = _fleet(LoadSource.LOCAL)
    fleet.record_dispatch(_request(1), "a", 0.0)
    fleet.set_engine_stats("a", 7, 9, None, 0.001)
    state = fleet.state("a")
    assert (state.num_inflight_requests, state.num_inflight_prompt_tokens) == (1, 100)
    assert state.engine_num_waiting == 7  # the scraped gauges are still shown


def test_engine_count_plus_own_dispatches_minus_own_completions_since_the_scrape() -> None:
    fleet = _fleet()
    own = [_request(i) for i in range(2)]
    for r in own:
        fleet.record_dispatch(r, "a", 0.0)
    fleet.set_engine_stats("a", 1, 4, 0.3, 0.001)  # engine: 5 = our 2 + 3 of others
    assert fleet.state("a").num_inflight_requests == 5
    fleet.record_dispatch(_request(9), "a", 0.1)  # dispatched after the scrape: +1
    assert fleet.state("a").num_inflight_requests == 6
    fleet.record_complete(own[0], "a", is_prefill_counted=True)  # counted by it, gone: -1
    assert fleet.state("a").num_inflight_requests == 5
    assert fleet.num_own_inflight_requests("a") == 2
    assert fleet.state("b").num_inflight_requests == 0  # never scraped: local


def test_the_estimate_never_falls_below_the_own_count() -> None:
    fleet = _fleet()
    for i in range(3):
        fleet.record_dispatch(_request(i), "a", 0.0)
    fleet.set_engine_stats("a", 0, 1, None, 0.001)  # in transit: the engine saw 1 of 3
    state = fleet.state("a")
    assert (state.num_inflight_requests, state.num_inflight_prompt_tokens) == (3, 300)


def test_tokens_of_others_are_sized_like_own_requests_in_flight() -> None:
    fleet = _fleet()
    fleet.record_dispatch(_request(1, prompt=100, output=10), "a", 0.0)
    fleet.record_dispatch(_request(2, prompt=300, output=30), "a", 0.0)
    fleet.set_engine_stats("a", 0, 6, None, 0.001)  # 4 others, sized 200 + 20 each
    state = fleet.state("a")
    assert state.num_inflight_requests == 6
    assert (state.num_inflight_prompt_tokens, state.num_inflight_output_tokens) == (1200, 120)


def test_with_none_own_in_flight_others_take_the_mean_dispatch_size() -> None:
    fleet = _fleet()
    request = _request(1, prompt=400, output=40)
    fleet.record_dispatch(request, "b", 0.0)
    fleet.record_complete(request, "b", is_prefill_counted=True)
    fleet.set_engine_stats("a", 2, 0, None, 0.001)
    state = fleet.state("a")
    assert state.num_inflight_requests == 2
    assert (state.num_inflight_prompt_tokens, state.num_inflight_output_tokens) == (800, 80)


def test_expired_scrape_falls_back_to_the_own_count() -> None:
    fleet = _fleet()
    fleet.record_dispatch(_request(1), "a", 0.0)
    fleet.set_engine_stats("a", 3, 3, None, 0.001)
    assert fleet.state("a").num_inflight_requests == 6
    fleet.expire_engine_load("a")
    assert fleet.state("a").num_inflight_requests == 1
    fleet.set_load_source(LoadSource.LOCAL)
    fleet.set_engine_stats("a", 3, 3, None, 0.001)
    assert fleet.state("a").num_inflight_requests == 1


# ---- a real engine on loopback ---------------------------------------------------------------


class FakeEngine(ThreadServer):
    """vLLM-style /metrics whose running count is ``running`` (set by the test, as an
    engine counts the requests it holds); histograms around it, as vLLM's page has."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.waiting = 0
        self.is_up = True
        self.num_scrapes = 0
        self._lock = threading.Lock()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, _: web.Request) -> web.Response:
        with self._lock:
            self.num_scrapes += 1
        if not self.is_up:
            return web.Response(status=503)
        buckets = "".join(
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{b}",model_name="m"}} 3\n'
            for b in (0.01, 0.1, 1.0, "+Inf")
        )
        page = (
            "# HELP vllm:num_requests_running Requests in model execution.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {self.running}.0\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {self.waiting}.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n' + buckets
        )
        return web.Response(text=page)


@pytest.fixture
def engines() -> Iterator[tuple[FakeEngine, FakeEngine]]:
    with FakeEngine() as a, FakeEngine() as b:
        yield a, b


def _config(urls: list[str], **extra: object) -> GatewayConfig:
    backends = [{"name": n, "url": u, "model": "m"} for n, u in zip("ab", urls, strict=True)]
    return GatewayConfig.model_validate({"backends": backends, "load_source": "engine", **extra})


class Gateway:
    """What one gateway keeps for the load: its fleet view and its scraper."""

    def __init__(self, config: GatewayConfig) -> None:
        self.backends = build_backends(config, {})
        self.fleet = build_fleet(config, self.backends, build_router(config, self.backends))
        _, scraper = monitors(config, self.backends, self.fleet, WallClock())
        assert scraper is not None
        self.scraper = scraper

    async def scrape_all(self, session: aiohttp.ClientSession) -> None:
        for backend in self.backends.values():
            await self.scraper.scrape(session, backend)


def test_the_gateway_scrapes_every_100_ms_with_engine_load(
    engines: tuple[FakeEngine, FakeEngine],
) -> None:
    gateway = Gateway(_config([e.url for e in engines]))
    assert gateway.fleet.load_source is LoadSource.ENGINE
    assert gateway.scraper.interval_s == 0.1

    async def run_for(seconds: float) -> None:
        async with aiohttp.ClientSession() as session:
            task = asyncio.ensure_future(gateway.scraper.run(session))
            await asyncio.sleep(seconds)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    engines[0].running = 4
    asyncio.run(run_for(0.55))
    assert 4 <= engines[0].num_scrapes <= 7 and 4 <= engines[1].num_scrapes <= 7
    assert gateway.fleet.state("a").num_inflight_requests == 4


def test_a_router_sees_engine_count_plus_own_dispatches_since_the_scrape(
    engines: tuple[FakeEngine, FakeEngine],
) -> None:
    gateway = Gateway(_config([e.url for e in engines]))
    fleet, router = gateway.fleet, LeastRequestRouter()
    engines[0].running, engines[1].running = 2, 3  # other clients' requests

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            await gateway.scrape_all(session)
            decision = router.route(_request(0), fleet, 0.0)
            assert dict(decision.scores) == {"a": 2.0, "b": 3.0}
            fleet.record_dispatch(_request(1), "a", 0.0)
            fleet.record_dispatch(_request(2), "a", 0.0)
            decision = router.route(_request(3), fleet, 0.0)
            assert dict(decision.scores) == {"a": 4.0, "b": 3.0}
            assert decision.endpoint == "b"
            engines[0].running = 4  # the engine got our two
            await gateway.scrape_all(session)
            assert router.route(_request(4), fleet, 0.0).scores["a"] == 4.0

    asyncio.run(scenario())


def test_two_gateways_on_the_same_engines_see_the_same_load(
    engines: tuple[FakeEngine, FakeEngine],
) -> None:
    config = _config([e.url for e in engines])
    one, two = Gateway(config), Gateway(config)
    for i in range(3):
        one.fleet.record_dispatch(_request(i), "a", 0.0)
    for i in range(2):
        two.fleet.record_dispatch(_request(10 + i), "a", 0.0)
    two.fleet.record_dispatch(_request(20), "b", 0.0)
    engines[0].running, engines[1].running = 5, 1  # what the engines hold: both gateways'

    async def scrape_both() -> None:
        async with aiohttp.ClientSession() as session:
            await one.scrape_all(session)
            await two.scrape_all(session)

    asyncio.run(scrape_both())
    for gateway in (one, two):
        assert gateway.fleet.state("a").num_inflight_requests == 5
        assert gateway.fleet.state("b").num_inflight_requests == 1
        assert LeastRequestRouter().route(_request(99), gateway.fleet, 0.0).endpoint == "b"
        # tokens become global too: every request here has 100 + 10
        assert LeastLoadRouter().route(_request(99), gateway.fleet, 0.0).scores == {
            "a": 550.0,
            "b": 110.0,
        }
    local = Gateway(_config([e.url for e in engines], load_source="local"))
    assert local.fleet.load_source is LoadSource.LOCAL


def test_a_stale_or_unreachable_engine_falls_back_to_the_own_count(
    engines: tuple[FakeEngine, FakeEngine],
) -> None:
    gateway = Gateway(
        _config([e.url for e in engines], load_scrape_interval_s=0.05, load_stale_after_s=0.2)
    )
    gateway.fleet.record_dispatch(_request(1), "a", 0.0)
    engines[0].running = 6

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            task = asyncio.ensure_future(gateway.scraper.run(session))
            await asyncio.sleep(0.2)
            assert gateway.fleet.state("a").num_inflight_requests == 6
            engines[0].is_up = False
            await asyncio.sleep(0.45)
            assert gateway.fleet.state("a").num_inflight_requests == 1  # stale: local
            engines[0].is_up = True
            await asyncio.sleep(0.2)
            assert gateway.fleet.state("a").num_inflight_requests == 6
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


# ---- hostile pages and config bounds ----------------------------------------------------------


def test_parser_reads_labels_with_braces_and_ignores_timestamps() -> None:
    page = (
        b'vllm:num_requests_running{model_name="a}b c",engine="0"} 3 1700000000000\n'
        b"vllm:num_requests_waiting 2\n"
        b"vllm:num_requests_waiting_other 50\n"
        b"# vllm:num_requests_waiting 70\n"
    )
    stats = parse_engine_metrics(page)
    assert stats is not None and (stats.num_running, stats.num_waiting) == (3, 2)


@pytest.mark.parametrize("value", ["NaN", "-1", "+Inf", "many"])
def test_parser_refuses_values_that_are_no_count(value: str) -> None:
    with pytest.raises(MetricsPageError, match="vllm:num_requests_running"):
        parse_engine_metrics(f"vllm:num_requests_running {value}\nvllm:num_requests_waiting 0\n")


def test_an_oversized_page_is_refused_and_the_view_stays_local(
    monkeypatch: pytest.MonkeyPatch, engines: tuple[FakeEngine, FakeEngine]
) -> None:
    monkeypatch.setattr(scrape, "MAX_METRICS_BYTES", 200)  # the fake page is ~600 bytes
    gateway = Gateway(_config([e.url for e in engines]))
    engines[0].running = 9

    async def once() -> None:
        async with aiohttp.ClientSession() as session:
            await gateway.scrape_all(session)

    asyncio.run(once())
    assert gateway.fleet.state("a").num_inflight_requests == 0
    assert "a" not in gateway.scraper.stats


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"load_scrape_interval_s": 0.001}, "greater than or equal to 0.01"),
        ({"load_scrape_interval_s": 11}, "less than or equal to 10"),
        ({"load_source": "both"}, "'local' or 'engine'"),
        ({"load_scrape_interval_s": 0.5, "load_stale_after_s": 0.6}, "at least 2 x"),
    ],
)
def test_config_bounds(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _config(["http://127.0.0.1:1", "http://127.0.0.1:2"], **extra)


def test_a_reload_switches_the_load_source_and_the_scrape_timing(
    tmp_path: Path, engines: tuple[FakeEngine, FakeEngine]
) -> None:
    from longroute.gateway import serve_gateway
    from longroute.gateway.secrets import resolve_secrets

    backends = [{"name": n, "url": e.url, "model": "m"} for n, e in zip("ab", engines, strict=True)]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"backends": backends}))
    config = GatewayConfig.model_validate({"backends": backends})
    engines[0].running = 3

    async def scenario() -> None:
        async with serve_gateway(
            config, resolve_secrets(config), port=0, config_path=path
        ) as running:
            gateway = running.gateway
            assert gateway.fleet.load_source is LoadSource.LOCAL
            assert gateway.scraper is not None and gateway.scraper.interval_s == 2.0
            path.write_text(yaml.safe_dump({"backends": backends, "load_source": "engine"}))
            assert (await gateway.reload()).is_ok
            assert LoadSource(gateway.fleet.load_source) is LoadSource.ENGINE  # re-read
            assert gateway.scraper.interval_s == 0.1
            await asyncio.sleep(0.5)  # the running loop picks the new interval up
            assert gateway.fleet.state("a").num_inflight_requests == 3

    asyncio.run(scenario())


def test_gorgo_adds_the_other_gateways_requests_to_its_own_queue() -> None:
    from longroute.routing.gorgo import GorgoRouter

    fleet = _fleet()
    router = GorgoRouter(rtt_weight=0.0, queue_weight=1.0)
    first = _request(1, prompt=100, output=10)
    decision = router.route(first, fleet, 0.0)
    assert decision.endpoint == "a"  # a tie goes to the first
    router.on_dispatch(first, "a", 0.0)
    fleet.record_dispatch(first, "a", 0.0)
    assert fleet.state("b").num_other_requests == 0
    # another gateway sent 3 requests to b: the engine says 3 in flight there
    fleet.set_engine_stats("b", 0, 3, None, 0.001)
    assert fleet.state("b").num_other_requests == 3
    scores = router.route(_request(2, prompt=100, output=10), fleet, 0.0).scores
    # a holds our one request (110 tokens of work); b the others' 3, sized like ours
    assert scores["a"] == pytest.approx(100 + 110)
    assert scores["b"] == pytest.approx(100 + 3 * 110)
    assert router.route(_request(3), fleet, 0.0).endpoint == "a"
    fleet.set_load_source(LoadSource.LOCAL)  # one gateway's view: b looks idle again
    assert router.route(_request(4), fleet, 0.0).endpoint == "b"
