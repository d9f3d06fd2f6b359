"""Engine truth against the emulator: the gateway predicts, before dispatch, the cached
tokens each request will get, from the engine's own KV-cache events.

Emulators publish their prefix caches' events in vLLM 0.32's format (stored, removed,
cleared), with a KV cache small enough to evict. The gateway tokenizes each chat as the
emulator does (``precise_prefix.tokenizer: emulator``), matches its blocks against what
the events say each engine holds, and returns its prediction in
``x-longroute-predicted-cached-tokens``; the engine reports what it really served in
``usage.prompt_tokens_details.cached_tokens``. The approximate index (what was sent
where) is queried on the same requests for comparison.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.kv_events_config import KvEventsConfig
from longroute.emulator.server import EMULATOR_KEY
from longroute.features.tokenize import EmulatorPromptTokenizer
from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.app import RunningGateway
from longroute.gateway.config import parse_gateway_config
from longroute.headers import PREDICTED_CACHED_HEADER
from longroute.prefix.precise_index import PrecisePrefixIndex

PROFILE = "llama-3-8b"
BLOCK = 16
# KV capacity of llama-3-8b on one H100 at this utilization: some 1,500 tokens, so a
# few conversations evict each other
TINY_KV_UTILIZATION = 0.2135
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


@dataclass
class Tally:
    num_requests: int = 0
    num_exact: int = 0
    num_approx_exact: int = 0
    num_hits: int = 0  # requests the engine served some tokens of from cache
    misses: list[str] = field(default_factory=list)


@asynccontextmanager
async def emulators(num: int, *, with_events: bool = True) -> AsyncIterator[list[tuple[str, str]]]:
    """``num`` emulators as (url, event endpoint) pairs."""
    runners = []
    out = []
    try:
        for _ in range(num):
            events = KvEventsConfig(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint="tcp://*:0",
                replay_endpoint="tcp://*:0",
                topic="kv",
            )
            options = EmulatorOptions(
                profile=PROFILE,
                port=0,
                speed=100.0,
                prefix_block_tokens=BLOCK,
                gpu_memory_utilization=TINY_KV_UTILIZATION,
                kv_events=events if with_events else None,
            )
            runner, url = await start_emulator(options)
            runners.append(runner)
            publisher = runner.app[EMULATOR_KEY].kv_publisher
            endpoint = "" if publisher is None else publisher.endpoint
            out.append((url, endpoint.replace("0.0.0.0", "127.0.0.1")))
        yield out
    finally:
        for runner in runners:
            await runner.cleanup()


def gateway_config(engines: list[tuple[str, str]], router: str = "prefix-cache") -> Any:
    backends = []
    for i, (url, endpoint) in enumerate(engines):
        backend: dict[str, Any] = {"name": f"e{i}", "url": url, "model": PROFILE}
        if endpoint:
            backend["kv_events"] = {"endpoint": endpoint, "topic": "kv"}
        backends.append(backend)
    return parse_gateway_config(
        {
            "backends": backends,
            "router": {"name": router},
            "precise_prefix": {"tokenizer": "emulator", "block_size_tokens": BLOCK},
            "health": {"interval_s": 60.0},
        },
        "test_gateway_kv_events",
    )


def words(rng: random.Random, num: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(num))


async def conversation_turns(
    http: aiohttp.ClientSession,
    running: RunningGateway,
    tally: Tally,
    rng: random.Random,
    num_conversations: int,
    num_turns: int,
) -> None:
    """Interleaved multi-turn conversations, one request at a time (so the prediction is
    made on the state every earlier request left)."""
    tokenizer = EmulatorPromptTokenizer(block_size_tokens=BLOCK)
    index = running.gateway.fleet.prefix_index
    assert isinstance(index, PrecisePrefixIndex)
    # the approximate index on the same requests: what a gateway without events would
    # believe (everything it sent, where it sent it)
    guesses = PrecisePrefixIndex(list(index.endpoint_names), 1_000_000)
    histories = [
        [{"role": "system", "content": f"conversation {c}: " + words(rng, 60)}]
        for c in range(num_conversations)
    ]
    for _ in range(num_turns):
        for history in rng.sample(histories, len(histories)):
            history.append({"role": "user", "content": words(rng, rng.randrange(5, 40))})
            prompt = tokenizer.chat_prompt(history)
            approx = {
                name: guesses.predicted_cached_tokens(
                    name, prompt.block_hashes, len(prompt.token_ids), block_size_tokens=BLOCK
                )
                for name in index.endpoint_names
            }
            body = {"model": PROFILE, "messages": history, "max_tokens": 8}
            async with http.post(running.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                data = await response.json()
                predicted = response.headers.get(PREDICTED_CACHED_HEADER)
                endpoint = response.headers["x-longroute-endpoint"]
            usage = data["usage"]
            assert usage["prompt_tokens"] == len(prompt.token_ids)
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            tally.num_requests += 1
            tally.num_hits += cached > 0
            if predicted is not None and int(predicted) == cached:
                tally.num_exact += 1
            else:
                tally.misses.append(f"{endpoint}: predicted {predicted}, engine {cached}")
            if approx[endpoint] == cached:
                tally.num_approx_exact += 1
            guesses.insert(prompt.block_hashes, endpoint, float(tally.num_requests))
            history.append(
                {"role": "assistant", "content": data["choices"][0]["message"]["content"]}
            )


async def wait_precise(running: RunningGateway, names: list[str], timeout_s: float = 10.0) -> None:
    truth = running.gateway.engine_truth
    assert truth is not None
    for _ in range(int(timeout_s / 0.05)):
        if all(truth.is_precise(n) for n in names):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not precise after {timeout_s} s: {truth.stats()}")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_predicted_cached_tokens_match_the_engine_through_evictions() -> None:
    run(_predicted_cached_tokens())


async def _predicted_cached_tokens() -> None:
    tally = Tally()
    async with AsyncExitStack() as stack:
        engines = await stack.enter_async_context(emulators(2))
        running = await stack.enter_async_context(
            serve_gateway(gateway_config(engines), GatewaySecrets({}, None), port=0)
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        # a first request to each engine makes it publish (batch 0 starts its history)
        await conversation_turns(http, running, Tally(), random.Random(99), 4, 1)
        await wait_precise(running, ["e0", "e1"])
        await conversation_turns(http, running, tally, random.Random(1), 10, 6)
        index = running.gateway.fleet.prefix_index
        assert isinstance(index, PrecisePrefixIndex)
        removed = sum(index.counters(n).num_blocks_removed for n in index.endpoint_names)
        async with http.get(running.url + "/metrics") as response:
            metrics = await response.text()
    assert tally.num_requests == 60
    assert tally.num_hits >= 20, tally  # the workload reuses prefixes
    assert removed >= 20  # and the engines evicted
    exact = tally.num_exact / tally.num_requests
    approx = tally.num_approx_exact / tally.num_requests
    print(f"precise exact {exact:.3f}, approximate exact {approx:.3f}, removed {removed}")
    assert exact >= 0.95, (exact, tally.misses)
    assert approx < exact  # evictions the approximate index cannot see
    assert 'longroute_prefix_state_precise{endpoint="e0"} 1.0' in metrics
    assert 'longroute_kv_event_errors_total{endpoint="e1",reason="gap"} 0.0' in metrics


def test_a_backend_without_events_keeps_the_approximate_index() -> None:
    run(_without_events())


async def _without_events() -> None:
    async with AsyncExitStack() as stack:
        engines = await stack.enter_async_context(emulators(1, with_events=False))
        # events promised at an address nobody publishes on
        config = gateway_config([(engines[0][0], "tcp://127.0.0.1:9")])
        running = await stack.enter_async_context(
            serve_gateway(config, GatewaySecrets({}, None), port=0)
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        tally = Tally()
        await conversation_turns(http, running, tally, random.Random(2), 2, 3)
    assert tally.num_requests == 6  # routing went on
    assert tally.num_exact == 0  # nothing predicted: the backend never turned precise
    assert not running.gateway.engine_truth.is_precise("e0")  # type: ignore[union-attr]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
