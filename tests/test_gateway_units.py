"""Gateway parts without HTTP: config, parsing, prompt features, breaker, scraping, admission."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from longroute.clock import SimClock
from longroute.config import ConfigError
from longroute.gateway.admission import Admission, QueueFullError, QueueTimeoutError, best_scored
from longroute.gateway.config import load_gateway_config, parse_gateway_config
from longroute.gateway.errors import GatewayError
from longroute.gateway.granting_fleet import GrantingFleet
from longroute.gateway.health import BreakerState, CircuitBreaker
from longroute.gateway.parse import ROUTE_CHAT, ROUTE_COMPLETIONS, _chat_text, _messages, parse_body
from longroute.gateway.prompt import chat_prompt_text, pseudo_token_ids, text_features
from longroute.gateway.scrape import parse_engine_metrics
from longroute.gateway.secrets import resolve_secrets
from longroute.routing import ROUTERS
from longroute.routing.fleet_view import FleetView, NoCandidateError
from longroute.types import Endpoint, Request

# ---- config -------------------------------------------------------------------------------


def _config(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "backends": [
            {"name": "a", "url": "http://10.0.0.1:8000/", "model": "m1"},
            {"name": "b", "url": "https://b.example", "model": "m2", "api_key_env": "LR_B_KEY"},
        ]
    }
    data.update(overrides)
    return data


def _config_error(data: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse_gateway_config(data, "fleet.yaml")
    message = str(info.value)
    assert message.startswith("fleet.yaml:"), message
    return message


def test_config_defaults_and_url_normalisation() -> None:
    config = parse_gateway_config(_config(), "fleet.yaml")
    assert config.backends[0].url == "http://10.0.0.1:8000"
    assert (config.backends[0].region, config.backends[0].max_concurrency) == ("local", 64)
    assert config.admission.max_body_bytes == 8 * 1024 * 1024
    assert (config.admission.max_queue, config.admission.request_timeout_s) == (1024, 600.0)
    assert (config.block_size_tokens, config.chars_per_token) == (16, 4.0)
    assert config.admin_enabled is False and config.client_api_keys_env is None


def test_config_errors_name_the_dotted_path() -> None:
    assert "backends.1.colour" in _config_error(
        _config(
            backends=[
                {"name": "a", "url": "http://x", "model": "m"},
                {"name": "b", "url": "http://y", "model": "m", "colour": 1},
            ]
        )
    )
    assert "admission.max_queeu" in _config_error(_config(admission={"max_queeu": 3}))
    assert "health.failure_threshold" in _config_error(_config(health={"failure_threshold": 0}))
    assert "/v1" in _config_error(
        _config(backends=[{"name": "a", "url": "http://x/v1", "model": "m"}])
    )
    assert "http://" in _config_error(
        _config(backends=[{"name": "a", "url": "x:80", "model": "m"}])
    )
    assert "repeated: a" in _config_error(
        _config(backends=[{"name": "a", "url": "http://x", "model": "m"}] * 2)
    )
    assert "'m9' is not served" in _config_error(_config(model_aliases={"fast": "m9"}))
    assert "already a served model" in _config_error(_config(model_aliases={"m1": "auto"}))
    assert "must be a mapping" in _config_error([1, 2])


def test_config_files_and_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="cannot read gateway config"):
        load_gateway_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_gateway_config(bad)
    config = parse_gateway_config(_config(client_api_keys_env="LR_CLIENT_KEYS"), "f")
    monkeypatch.delenv("LR_B_KEY", raising=False)
    monkeypatch.delenv("LR_CLIENT_KEYS", raising=False)
    with pytest.raises(ConfigError) as exc:  # every missing variable at once
        resolve_secrets(config)
    assert str(exc.value) == (
        "environment variable(s) not set or empty: LR_B_KEY (backend 'b' api_key_env), "
        "LR_CLIENT_KEYS (client_api_keys_env); export them before `longroute serve`"
    )
    monkeypatch.setenv("LR_CLIENT_KEYS", "k1")
    with pytest.raises(ConfigError, match=r"empty: LR_B_KEY \(backend 'b' api_key_env\);"):
        resolve_secrets(config)
    monkeypatch.setenv("LR_B_KEY", "sk-b")
    monkeypatch.setenv("LR_CLIENT_KEYS", " k1, k2 ,")
    secrets = resolve_secrets(config)
    assert secrets.backend_api_keys == {"b": "sk-b"}
    assert secrets.client_api_keys == frozenset({"k1", "k2"})


# ---- request parsing and prompt features --------------------------------------------------


def test_completion_prompts_as_text_or_token_ids() -> None:
    text = parse_body(b'{"model": "m", "prompt": ["ab", "cd"], "max_tokens": 3}', ROUTE_COMPLETIONS)
    ids = parse_body(b'{"model": "m", "prompt": [[1, 2], [3]]}', ROUTE_COMPLETIONS)
    assert (text.prompt_text, text.prompt_token_ids, text.max_output_tokens) == ("abcd", None, 3)
    assert (ids.prompt_text, ids.prompt_token_ids) == (None, (1, 2, 3))
    for bad in (b'{"model": "m", "prompt": [true]}', b'{"model": "m", "prompt": []}'):
        with pytest.raises(GatewayError) as info:
            parse_body(bad, ROUTE_COMPLETIONS)
        assert (info.value.status, info.value.param) == (400, "prompt")


def test_chat_parsing_accepts_parts_and_null_content() -> None:
    body = (
        b'{"model": "m", "stream": true, "max_completion_tokens": 5, "n": 2, "messages": ['
        b'{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},'
        b'{"role": "assistant", "content": null, "tool_calls": []}]}'
    )
    parsed = parse_body(body, ROUTE_CHAT)
    assert (parsed.is_stream, parsed.max_output_tokens, parsed.num_choices) == (True, 5, 2)
    assert parsed.prompt_text == "<|user|>\nhi\n<|assistant|>\n\n"
    with pytest.raises(GatewayError) as info:
        parse_body(b'{"model": "m", "messages": [{"role": "user"}], "n": 0}', ROUTE_CHAT)
    assert info.value.param == "n"


def test_chat_text_in_one_pass_equals_the_general_path_or_its_error() -> None:
    """The one-pass chat text (string and null contents) gives the general path's text,
    and for anything else its very error (the first invalid message's, in order)."""
    rng = random.Random(7)
    pool: list[object] = [
        {"role": "user", "content": "hi"}, {"role": "system", "content": None},
        {"role": "assistant"}, {"role": "u" * 64, "content": "ok"}, {"role": "u" * 65},
        {"role": "", "content": "x"}, {"role": 3, "content": "x"}, {"content": "x"},
        {"role": "user", "content": [{"type": "text", "text": "p"}]},
        {"role": "user", "content": ["bad part"]}, {"role": "user", "content": 5},
        {"role": "tool", "content": "é\u4e2d"}, "not an object", None,
    ]  # fmt: skip

    def outcome(function: Any, body: dict[str, Any]) -> tuple[str, str]:
        try:
            return "text", function(body)
        except GatewayError as err:
            return "error", err.response().body.decode()

    for _ in range(3000):
        messages = [rng.choice(pool) for _ in range(rng.randrange(4))]
        body: dict[str, Any] = {"messages": messages if rng.random() < 0.95 else "x"}
        general = outcome(lambda b: chat_prompt_text(_messages(b)), body)
        assert outcome(_chat_text, body) == general
    assert outcome(_chat_text, {})[0] == "error"


def test_block_hashes_of_a_growing_conversation_extend_each_other() -> None:
    messages: list[dict[str, object]] = [{"role": "system", "content": "Be brief. " * 30}]
    previous: tuple[int, ...] = ()
    for turn in range(4):
        messages.append({"role": "user", "content": f"question {turn} " * 20})
        features = text_features(chat_prompt_text(messages), 16, 4.0)
        assert features.block_hashes[: len(previous)] == previous
        assert len(features.block_hashes) > len(previous)
        previous = features.block_hashes
        messages.append({"role": "assistant", "content": "answer " * 10})
    other = text_features(
        chat_prompt_text([{"role": "system", "content": "Be long. " * 30}]), 16, 4
    )
    assert other.block_hashes[0] != previous[0]


def test_pseudo_tokens_are_little_endian_words_of_full_blocks() -> None:
    assert list(pseudo_token_ids("abcdefgh", 2)) == [0x64636261, 0x68676665]
    assert list(pseudo_token_ids("abcdefghij", 2)) == [0x64636261, 0x68676665]  # partial cut
    features = text_features("x" * 130, 16, 4.0)
    assert features.num_prompt_tokens == 33  # ceil(130 / 4)
    assert len(features.block_hashes) == 2  # 130 bytes hold two 64-byte blocks
    assert text_features("x" * 130, 16, 4.0, is_hashing=False).block_hashes == ()


# ---- circuit breaker and engine metrics ---------------------------------------------------


def test_circuit_breaker_cycle() -> None:
    breaker = CircuitBreaker(failure_threshold=3, open_s=10.0)
    assert not breaker.record(False, 0.0, is_probe=False)
    assert not breaker.record(True, 0.5, is_probe=False)  # a success resets the count
    assert not breaker.record(False, 1.0, is_probe=True)
    assert not breaker.record(False, 2.0, is_probe=False)
    assert breaker.record(False, 3.0, is_probe=False)  # third in a row: opens
    assert breaker.state is BreakerState.OPEN
    assert not breaker.record(True, 4.0, is_probe=False)  # stragglers change nothing
    assert breaker.seconds_until_probe(5.0) == 8.0
    breaker.begin_probe(5.0)
    assert breaker.state is BreakerState.OPEN  # too early
    breaker.begin_probe(13.0)
    assert breaker.state is BreakerState.HALF_OPEN
    assert not breaker.record(False, 13.1, is_probe=True)  # failed probe: open again
    assert breaker.state is BreakerState.OPEN
    assert breaker.seconds_until_probe(13.1) == pytest.approx(10.0)
    breaker.begin_probe(23.2)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.record(True, 23.3, is_probe=True)  # probe succeeds: closed
    assert breaker.is_closed and breaker.num_consecutive_failures == 0


def test_engine_metrics_of_vllm_sglang_and_llamacpp() -> None:
    vllm = parse_engine_metrics(
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 3\n'
        'vllm:num_requests_running{engine="0"} 4\nvllm:num_requests_running_extra 99\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n'
        'vllm:prefix_cache_hits_total{engine="0"} 10\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 7\n'
    )
    assert vllm is not None
    assert (vllm.num_waiting, vllm.num_running, vllm.kv_usage) == (5, 4, 0.7)
    assert (vllm.num_prefix_cache_hits_tokens, vllm.num_prefix_cache_queries_tokens) == (10, None)
    sglang = parse_engine_metrics(
        "sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n"
    )
    assert sglang is not None and (sglang.num_waiting, sglang.kv_usage) == (1, 0.5)
    llama = parse_engine_metrics("llamacpp:requests_processing 1\nllamacpp:requests_deferred 6\n")
    assert llama is not None
    assert (llama.num_waiting, llama.num_running, llama.kv_usage) == (6, 1, None)
    assert parse_engine_metrics("process_cpu_seconds_total 3\n") is None


# ---- admission ----------------------------------------------------------------------------


def _admission(capacity: int, max_queue: int = 10) -> tuple[Admission, FleetView, SimClock]:
    endpoints = [Endpoint("a", "m1", "h", "r"), Endpoint("b", "m2", "h", "r")]
    fleet = FleetView(endpoints)
    clock = SimClock()
    router = ROUTERS.build("least-request", rng=random.Random(0))
    admission = Admission(
        fleet,
        router,
        {"a": capacity, "b": capacity},
        max_queue=max_queue,
        queue_policy="fcfs",
        clock=clock,
        observe_decision_s=lambda _: None,
    )
    return admission, fleet, clock


def _request(request_id: str, model: str, arrival_s: float = 0.0) -> Request:
    return Request(request_id, arrival_s, num_prompt_tokens=10, num_output_tokens=5, model=model)


def test_best_scored_prefers_low_scores_then_order() -> None:
    assert best_scored({"a": 2.0, "b": 1.0, "c": 1.0}, ["a", "c", "b"]) == "c"
    assert best_scored({"a": 2.0}, ["z", "a"]) == "a"  # unscored ranks last
    assert best_scored({}, ["z", "y"]) == "z"


def test_admission_fcfs_per_model_and_no_head_of_line_blocking() -> None:
    async def scenario() -> list[str]:
        admission, fleet, _ = _admission(capacity=1)
        served: list[str] = []
        first = await admission.acquire(_request("r1", "m1"), (), 5.0)
        waiters = [
            asyncio.create_task(admission.acquire(_request(f"r{i}", "m1", i), (), 5.0))
            for i in (2, 3)
        ]
        await asyncio.sleep(0)
        assert admission.num_waiting == 2
        other = await admission.acquire(_request("x", "m2"), (), 5.0)  # m2 is not blocked
        served.append(other.endpoint)
        for task in waiters:
            admission.finish(_request("r", "m1"), first.endpoint, has_first_byte=False, is_ok=True)
            first = await task
            served.append(first.endpoint)
        assert fleet.state("a").num_inflight_requests == 1
        return served

    assert asyncio.run(scenario()) == ["b", "a", "a"]


def test_admission_limits_timeouts_and_cancellation() -> None:
    async def scenario() -> None:
        admission, fleet, _ = _admission(capacity=1, max_queue=1)
        grant = await admission.acquire(_request("r1", "m1"), (), 5.0)
        with pytest.raises(QueueTimeoutError):
            await admission.acquire(_request("r2", "m1"), (), 0.01)
        waiter = asyncio.create_task(admission.acquire(_request("r3", "m1"), (), 5.0))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError):
            await admission.acquire(_request("r4", "m1"), (), 5.0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert admission.num_waiting == 0
        admission.finish(_request("r1", "m1"), grant.endpoint, has_first_byte=False, is_ok=True)
        assert fleet.state("a").num_inflight_requests == 0
        with pytest.raises(NoCandidateError, match="already failed"):
            await admission.acquire(_request("r5", "m1"), ("a",), 5.0)

    asyncio.run(scenario())


@pytest.mark.parametrize("router_name", ["round-robin", "least-request", "prefix-cache"])
def test_granting_fleet_computes_each_grants_candidates_once_with_the_same_grants(
    router_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's fleet hands the router the candidate list admission just computed:
    one computation per grant instead of two, and the same grants as a plain FleetView
    through health changes, exclusions, finishes and a full backend."""
    computed = [0]
    plain_candidates = FleetView.candidates

    def counting(fleet: FleetView, request: Request) -> list[Any]:
        computed[0] += 1
        return plain_candidates(fleet, request)

    monkeypatch.setattr(FleetView, "candidates", counting)

    def run(fleet_class: type[FleetView]) -> tuple[list[str | None], int]:
        endpoints = [Endpoint(name, "m", "h", "r") for name in "abcd"]
        fleet = fleet_class(endpoints)
        router = ROUTERS.build(router_name, rng=random.Random(0))
        admission = Admission(
            fleet, router, dict.fromkeys("abcd", 2), max_queue=10, queue_policy="fcfs",
            clock=SimClock(), observe_decision_s=lambda _: None,
        )  # fmt: skip
        rng = random.Random(1)
        granted: list[str | None] = []
        held: list[Any] = []
        computed[0] = 0
        for i in range(300):
            fleet.set_health(rng.choice("abcd"), rng.random() < 0.8)
            excluded = tuple(rng.sample("abcd", rng.randrange(3)))
            try:
                grant = admission.try_grant(_request(f"r{i}", "m", float(i)), excluded)
            except NoCandidateError:
                granted.append("none")
                continue
            granted.append(None if grant is None else grant.endpoint)
            if grant is not None:
                held.append(grant)
            while held and (len(held) > 5 or rng.random() < 0.4):
                done = held.pop(rng.randrange(len(held)))
                admission.finish(done.request, done.endpoint, has_first_byte=False, is_ok=True)
            assert fleet.candidates(_request("other", "m")) is not fleet.candidates(
                _request("other", "m")
            )  # outside a grant: computed anew each time
        return granted, computed[0]

    plain, plain_computed = run(FleetView)
    pinned, pinned_computed = run(GrantingFleet)
    assert pinned == plain
    assert len({g for g in plain if g is not None}) > 3  # grants, none free, none eligible
    num_routed = sum(g not in (None, "none") for g in plain)
    assert plain_computed - pinned_computed == num_routed


@pytest.mark.parametrize("router_name", ["prefix-cache", "gorgo"])
def test_waiting_inserts_route_as_inserts_at_dispatch(router_name: str) -> None:
    """Long prompts sharing documents, granted and finished in a loop that sometimes
    turns and sometimes waits past the delay: the same grants as a plain FleetView, whose
    inserts happen at dispatch."""
    from longroute.gateway.granting_fleet import DEFERRED_INSERT_BLOCKS, LATE_INSERT_DELAY_S

    def prompt(i: int, rng: random.Random) -> Request:
        doc = rng.randrange(4)
        shared = tuple(range(doc * 10**6, doc * 10**6 + DEFERRED_INSERT_BLOCKS))
        own = tuple(range(10**8 + i * 1000, 10**8 + i * 1000 + rng.randrange(0, 300)))
        hashes = shared + own
        return Request(f"r{i}", float(i), 16 * len(hashes), 8, model="m",
                       block_hashes=hashes, block_size_tokens=16)  # fmt: skip

    async def run(fleet_class: type[FleetView]) -> list[str | None]:
        fleet = fleet_class([Endpoint(name, "m", "h", "r") for name in "abc"])
        router = ROUTERS.build(router_name, rng=random.Random(0))
        admission = Admission(
            fleet, router, dict.fromkeys("abc", 3), max_queue=10, queue_policy="fcfs",
            clock=SimClock(), observe_decision_s=lambda _: None,
        )  # fmt: skip
        rng = random.Random(7)
        granted: list[str | None] = []
        held: list[Any] = []
        for i in range(120):
            grant = admission.try_grant(prompt(i, rng), ())
            granted.append(None if grant is None else grant.endpoint)
            if grant is not None:
                held.append(grant)
            while held and rng.random() < 0.5:
                done = held.pop(rng.randrange(len(held)))
                admission.finish(done.request, done.endpoint, has_first_byte=True, is_ok=True)
            pause = rng.random()
            if pause < 0.3:
                await asyncio.sleep(0)
            elif pause < 0.4:
                await asyncio.sleep(1.5 * LATE_INSERT_DELAY_S)
        return granted

    plain = asyncio.run(run(FleetView))
    assert asyncio.run(run(GrantingFleet)) == plain
    assert len(set(plain)) >= 3


def test_a_long_prompts_blocks_reach_the_index_when_the_loop_would_wait() -> None:
    from longroute.gateway.granting_fleet import (
        DEFERRED_INSERT_BLOCKS,
        LATE_INSERT_DELAY_S,
        MAX_PENDING_INSERTS,
    )

    endpoints = [Endpoint(name, "m", "h", "r") for name in "ab"]
    long_hashes = tuple(range(1, DEFERRED_INSERT_BLOCKS + 1))
    short_hashes = tuple(range(10_000, 10_000 + DEFERRED_INSERT_BLOCKS - 1))

    def request(rid: str, hashes: tuple[int, ...]) -> Request:
        return Request(rid, 0.0, 16 * len(hashes), 8, block_hashes=hashes, block_size_tokens=16)

    def hashes_from(first: int) -> tuple[int, ...]:
        return tuple(range(first, first + DEFERRED_INSERT_BLOCKS))

    async def scenario() -> None:
        fleet = GrantingFleet(endpoints)
        index = fleet._index  # the index itself: reading it applies nothing
        fleet.record_dispatch(request("short", short_hashes), "a", 0.0)
        assert index.match(short_hashes) == {"a": len(short_hashes)}  # at once
        fleet.record_dispatch(request("long", long_hashes), "b", 0.0)
        assert index.match(long_hashes) == {}  # not on the request's path
        assert fleet.num_pending_inserts == 1
        assert fleet.state("b").num_inflight_requests == 1  # the load is counted now
        # a read (every router's) applies it first: decisions see every dispatched prompt
        assert fleet.prefix_index.match(long_hashes) == {"b": len(long_hashes)}
        assert fleet.num_pending_inserts == 0
        # an answer's end applies it at the loop's next turn, after the answer is written
        done = request("done", hashes_from(20_000))
        fleet.record_dispatch(done, "a", 1.0)
        fleet.record_complete(done, "a", is_prefill_counted=True)
        assert fleet.num_pending_inserts == 1
        await asyncio.sleep(0)
        assert index.match(done.block_hashes) == {"a": len(done.block_hashes)}
        # no answer yet (an engine prefilling): LATE_INSERT_DELAY_S after the dispatch
        slow = hashes_from(30_000)
        fleet.record_dispatch(request("slow", slow), "b", 2.0)
        await asyncio.sleep(0)
        assert fleet.num_pending_inserts == 1
        await asyncio.sleep(2 * LATE_INSERT_DELAY_S)
        assert index.match(slow) == {"b": len(slow)}
        # an endpoint removed (a reload) before its insert ran learns nothing
        other = (*long_hashes[:-1], 0)
        fleet.record_dispatch(request("late", other), "a", 3.0)
        fleet.set_endpoints([endpoints[1]])
        await asyncio.sleep(2 * LATE_INSERT_DELAY_S)
        assert "a" not in fleet.prefix_index.match(other)
        # bounded: at most MAX_PENDING_INSERTS wait
        for i in range(MAX_PENDING_INSERTS + 3):
            fleet.record_dispatch(request(f"many-{i}", hashes_from(100_000 * (i + 1))), "b", 4.0)
            assert fleet.num_pending_inserts < MAX_PENDING_INSERTS
        assert index.match(hashes_from(100_000)) == {"b": DEFERRED_INSERT_BLOCKS}

    asyncio.run(scenario())
    # without a running loop (a synchronous caller) the insert happens at once
    fleet = GrantingFleet(endpoints)
    fleet.record_dispatch(request("sync", long_hashes), "a", 0.0)
    assert fleet.num_pending_inserts == 0
    assert fleet.prefix_index.match(long_hashes) == {"a": len(long_hashes)}
