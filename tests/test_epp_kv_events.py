"""The endpoint picker on engine truth: with ``precise_prefix`` and backends' ``kv_events``
it subscribes like ``serve`` and routes a conversation's next turn to the engine that
*reports* holding its prefix (here an engine the picker never sent it to)."""

from __future__ import annotations

import asyncio
import json
import random
from contextlib import AsyncExitStack

import aiohttp

from longroute.epp.server import serve_epp
from longroute.gateway.config import parse_gateway_config
from longroute.gateway.http.types import Headers
from longroute.gateway.secrets import GatewaySecrets
from longroute.prefix.precise_index import PrecisePrefixIndex
from test_gateway_kv_events import BLOCK, PROFILE, emulators, words


def test_the_picker_follows_what_the_engines_report() -> None:
    asyncio.run(asyncio.wait_for(_run(), 60))


async def _run() -> None:
    rng = random.Random(5)
    messages = [{"role": "system", "content": "shared system prompt: " + words(rng, 120)}]
    async with AsyncExitStack() as stack:
        engines = await stack.enter_async_context(emulators(2))
        config = parse_gateway_config(
            {
                "backends": [
                    {"name": f"e{i}", "url": url, "model": PROFILE,
                     "kv_events": {"endpoint": endpoint, "topic": "kv"}}
                    for i, (url, endpoint) in enumerate(engines)
                ],
                "router": {"name": "prefix-cache"},
                "precise_prefix": {"tokenizer": "emulator", "block_size_tokens": BLOCK},
                "health": {"interval_s": 60.0},
            },
            "test_epp_kv_events",
        )  # fmt: skip
        running = await stack.enter_async_context(serve_epp(config, GatewaySecrets({}, None)))
        picker = running.server.picker
        truth = picker.engine_truth
        assert truth is not None
        http = await stack.enter_async_context(aiohttp.ClientSession())
        # another client sent the conversation to e1 directly: only its events tell
        body = {"model": PROFILE, "messages": messages, "max_tokens": 4}
        async with http.post(engines[1][0] + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
        for _ in range(100):
            if truth.is_precise("e1"):
                break
            await asyncio.sleep(0.05)
        index = picker.fleet.prefix_index
        assert isinstance(index, PrecisePrefixIndex) and index.is_precise("e1")
        turn = {**body, "messages": [*messages, {"role": "user", "content": "next turn"}]}
        headers = Headers([("content-type", "application/json")])
        pick, _ = picker.pick("/v1/chat/completions", headers, json.dumps(turn).encode())
        assert pick.grant.endpoint == "e1"
        picker.finish(pick, 200)
        async with http.get(running.metrics_url + "/metrics") as response:
            assert 'longroute_prefix_state_precise{endpoint="e1"} 1.0' in await response.text()


def test_the_picker_learns_output_lengths_from_the_answers_usage() -> None:
    """As serve does: routers see a length learned from finished answers (per choice)."""
    config = parse_gateway_config(
        {"backends": [{"name": "a", "url": "http://127.0.0.1:9", "model": PROFILE}]},
        "test_epp_kv_events",
    )
    from longroute.epp.picker import EndpointPicker

    picker = EndpointPicker(config, GatewaySecrets({}, None))
    headers = Headers([("content-type", "application/json")])
    body = {"model": PROFILE, "messages": [{"role": "user", "content": "hi"}], "n": 2}
    for _ in range(10):  # the estimator trusts a key after 8 answers
        pick, _ = picker.pick("/v1/chat/completions", headers, json.dumps(body).encode())
        pick.tail.extend(b'"usage":{"prompt_tokens":5,"completion_tokens":84}}')
        picker.finish(pick, 200)
    pick, _ = picker.pick("/v1/chat/completions", headers, json.dumps(body).encode())
    assert pick.grant.request.num_output_tokens == 2 * 42  # 42 per choice, two choices
