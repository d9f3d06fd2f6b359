"""The emulator publishes its prefix cache's KV-cache events as vLLM 0.32 does.

Real sockets throughout: the emulator serves HTTP on loopback and publishes on
ZeroMQ; the tests subscribe with plain pyzmq SUB and DEALER sockets.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
import zmq.asyncio
from typer.testing import CliRunner

from longroute.cli import app
from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.kv_events_config import KvEventsConfig, parse_kv_events_config
from longroute.emulator.kv_publisher import KvEventPublisher
from longroute.emulator.server import EMULATOR_KEY, Emulator
from longroute.emulator.text import chat_template, prompt_from_text
from longroute.features.block_hash import chain_block_hashes
from longroute.prefix.engine_cache import EnginePrefixCache
from longroute.prefix.kv_endpoints import is_bind_endpoint
from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from longroute.prefix.kv_wire import REPLAY_END_SEQUENCE, decode_message, encode_replay_request

PROFILE = "llama-3-8b"
BLOCK = 16
TOPIC = "kv@emulator"
# KV capacity of llama-3-8b on one H100 at this utilization: 1511 tokens
TINY_KV_UTILIZATION = 0.2135
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


def events_config(**overrides: Any) -> KvEventsConfig:
    base: dict[str, Any] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:0",
        "replay_endpoint": "tcp://*:0",
        "topic": TOPIC,
    }
    return KvEventsConfig(**{**base, **overrides})


def loopback(endpoint: str) -> str:
    """A bound wildcard endpoint (tcp://0.0.0.0:PORT) as a client dials it."""
    return endpoint.replace("0.0.0.0", "127.0.0.1")


def text_of(seed: int, num_words: int) -> str:
    return " ".join(
        WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] + str(i) for i in range(num_words)
    )


@dataclass
class Live:
    """One running emulator with events on, and a SUB socket subscribed to its topic."""

    url: str
    emulator: Emulator
    session: aiohttp.ClientSession
    sub: zmq.asyncio.Socket
    ctx: zmq.asyncio.Context
    frames: list[list[bytes]] = field(default_factory=list)

    async def chat(self, messages: list[dict[str, str]], max_tokens: int = 4) -> dict[str, Any]:
        body = {"model": PROFILE, "messages": messages, "max_tokens": max_tokens}
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            result: dict[str, Any] = await resp.json()
            return result

    async def drain(self, quiet_s: float = 0.3) -> list[list[bytes]]:
        """Every message published until ``quiet_s`` passes without one."""
        while await self.sub.poll(int(quiet_s * 1000)):
            self.frames.append(await self.sub.recv_multipart())
        return self.frames


@contextlib.asynccontextmanager
async def live_emulator(
    config: KvEventsConfig | None = None, **overrides: Any
) -> AsyncIterator[Live]:
    options = EmulatorOptions(
        **{
            "profile": PROFILE,
            "port": 0,
            "speed": 100.0,
            "prefix_block_tokens": BLOCK,
            "kv_events": config or events_config(),
            **overrides,
        }
    )
    runner, url = await start_emulator(options)
    emulator = runner.app[EMULATOR_KEY]
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    publisher = emulator.kv_publisher
    assert publisher is not None
    if is_bind_endpoint(publisher.config.endpoint):
        sub.connect(loopback(publisher.endpoint))
        await asyncio.sleep(0.3)  # ZeroMQ's slow joiner: let the subscription reach the PUB
    try:
        async with aiohttp.ClientSession() as session:
            yield Live(url, emulator, session, sub, ctx)
    finally:
        sub.close()
        await runner.cleanup()
        ctx.term()


def batches_of(frames: list[list[bytes]]) -> list[KVEventBatch]:
    decoded = [decode_message(f) for f in frames]
    assert all(topic == TOPIC for topic, _ in decoded)
    return [batch for _, batch in decoded]


def all_events(batches: list[KVEventBatch]) -> list[KVEvent]:
    return [e for b in batches for e in b.events]


def cached_now(batches: list[KVEventBatch]) -> set[int]:
    """The engine's cache as its events describe it."""
    held: set[int] = set()
    for event in all_events(batches):
        if isinstance(event, BlockStored):
            held.update(int(h) for h in event.block_hashes)
        elif isinstance(event, BlockRemoved):
            held.difference_update(int(h) for h in event.block_hashes)
        else:
            held.clear()
    return held


def predicted_cached_tokens(text: str, held: set[int]) -> int:
    """vLLM's rule on a hash-keyed cache: leading hits, never the whole prompt."""
    prompt = prompt_from_text(text, BLOCK)
    num_hit = 0
    for h in prompt.block_hashes:
        if h not in held:
            break
        num_hit += 1
    return min(num_hit, (prompt.num_tokens - 1) // BLOCK) * BLOCK


def common_prefix_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def templated(messages: list[dict[str, str]]) -> str:
    return chat_template([(m["role"], m["content"]) for m in messages])


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def cached_tokens(response: dict[str, Any]) -> int:
    value: int = response["usage"]["prompt_tokens_details"]["cached_tokens"]
    return value


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# ---- the event stream ------------------------------------------------------


def test_two_turn_conversation_publishes_the_blocks_the_second_turn_reuses() -> None:
    turn1 = user(text_of(1, 120))

    async def scenario() -> tuple[list[list[bytes]], dict[str, Any], dict[str, Any], str]:
        async with live_emulator() as live:
            first = await live.chat(turn1)
            reply = first["choices"][0]["message"]["content"]
            turn2 = [
                *turn1,
                {"role": "assistant", "content": reply},
                *user(text_of(2, 40)),
            ]
            second = await live.chat(turn2)
            return await live.drain(), first, second, templated(turn2)

    frames, first, second, text2 = run(scenario())
    assert all(len(f) == 3 for f in frames)
    batches = batches_of(frames)
    assert [b.sequence for b in batches] == list(range(len(batches)))
    assert all(b.data_parallel_rank == 0 and abs(b.ts_s - time.time()) < 60 for b in batches)
    assert [b.ts_s for b in batches] == sorted(b.ts_s for b in batches)
    events = all_events(batches)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert len(stored) == len(events)  # nothing evicted or cleared
    prompt1 = prompt_from_text(templated(turn1), BLOCK)
    prompt2 = prompt_from_text(text2, BLOCK)
    # turn 1 stored every full block of its prompt, from the root, in order
    assert stored[0].parent_block_hash is None
    published = [int(h) for e in stored for h in e.block_hashes]
    num_shared = common_prefix_blocks(prompt1.block_hashes, prompt2.block_hashes)
    assert published == [*prompt1.block_hashes, *prompt2.block_hashes[num_shared:]]
    for event in stored:
        assert event.block_size_tokens == BLOCK and event.medium == "GPU"
        assert event.lora_name is None
        assert len(event.token_ids) == BLOCK * len(event.block_hashes)
        parent = None if event.parent_block_hash is None else int(event.parent_block_hash)
        rehashed = chain_block_hashes(event.token_ids, BLOCK, parent_hash=parent)
        assert list(rehashed) == [int(h) for h in event.block_hashes]
    # turn 2 was served turn 1's blocks and stored only what follows them
    assert num_shared > 0 and cached_tokens(first) == 0
    assert cached_tokens(second) == num_shared * BLOCK
    turn2_stored = [e for e in stored if e.block_hashes[0] == prompt2.block_hashes[num_shared]]
    assert (
        turn2_stored and turn2_stored[0].parent_block_hash == prompt2.block_hashes[num_shared - 1]
    )


def test_evictions_are_published_and_the_events_predict_cached_tokens() -> None:
    """A tiny KV cache: blocks are evicted (one BlockRemoved per block, as vLLM), and
    the cache the events describe predicts every response's cached_tokens exactly."""
    prompts = [templated(user(text_of(seed, 200))) for seed in range(6)]
    order = [0, 1, 0, 2, 3, 0, 4, 1, 5, 0]

    async def scenario() -> tuple[list[list[bytes]], list[tuple[int, int]]]:
        checks: list[tuple[int, int]] = []
        async with live_emulator(
            gpu_memory_utilization=TINY_KV_UTILIZATION, max_model_len_tokens=1024
        ) as live:
            assert live.emulator.driver.engine.kv.capacity_tokens < 2000
            for index in order:
                await live.drain(0.15)
                predicted = predicted_cached_tokens(
                    prompts[index], cached_now(batches_of(live.frames))
                )
                body = {"model": PROFILE, "prompt": prompts[index], "max_tokens": 2}
                async with live.session.post(live.url + "/v1/completions", json=body) as resp:
                    checks.append((predicted, cached_tokens(await resp.json())))
            return await live.drain(), checks

    frames, checks = run(scenario())
    events = all_events(batches_of(frames))
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert removed, "a 1.5K-token cache must evict"
    assert all(len(e.block_hashes) == 1 and e.medium == "GPU" for e in removed)
    held: set[int | bytes] = set()
    for event in events:  # every removal names a block stored before and still held
        if isinstance(event, BlockStored):
            assert not held & set(event.block_hashes)
            held.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            assert event.block_hashes[0] in held
            held.discard(event.block_hashes[0])
    assert [p for p, _ in checks] == [c for _, c in checks]
    assert any(c > 0 for _, c in checks) and any(c == 0 for _, c in checks[1:])


def test_replay_serves_every_kept_batch_then_the_end_marker() -> None:
    async def scenario() -> tuple[list[list[bytes]], list[list[bytes]], list[list[bytes]]]:
        async with live_emulator(events_config(buffer_steps=1000)) as live:
            for seed in range(3):
                await live.chat(user(text_of(seed, 50)))
            live_frames = await live.drain()
            publisher = live.emulator.kv_publisher
            assert publisher is not None and publisher.replay_endpoint is not None
            dealer = live.ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(loopback(publisher.replay_endpoint))
            try:
                replies = []
                for start in (0, 2):
                    await dealer.send_multipart([b"", encode_replay_request(start)])
                    got: list[list[bytes]] = []
                    while True:
                        frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
                        got.append(frames)
                        if int.from_bytes(frames[2], "big", signed=True) == REPLAY_END_SEQUENCE:
                            break
                    replies.append(got)
            finally:
                dealer.close()
            return live_frames, replies[0], replies[1]

    live_frames, from_zero, from_two = run(scenario())
    assert len(live_frames) >= 3
    assert from_zero[-1] == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]
    assert [f[1:] for f in from_zero[:-1]] == live_frames  # byte for byte what was published
    assert all(f[0] == b"" for f in from_zero)
    assert [f[1:] for f in from_two[:-1]] == live_frames[2:]


def test_reset_prefix_cache_publishes_all_blocks_cleared() -> None:
    prompt = user(text_of(9, 80))

    async def scenario() -> tuple[list[list[bytes]], int, dict[str, Any]]:
        async with live_emulator(admin_enabled=True) as live:
            await live.chat(prompt)
            async with live.session.post(live.url + "/reset_prefix_cache") as resp:
                assert resp.status == 200 and (await resp.json()) == {"is_reset": True}
            again = await live.chat(prompt)
            return await live.drain(), live.emulator.driver.engine.kv.cache.num_blocks, again

    frames, num_blocks, again = run(scenario())
    events = all_events(batches_of(frames))
    kinds = [type(e).__name__ for e in events]
    cleared_at = kinds.index("AllBlocksCleared")
    assert "BlockStored" in kinds[:cleared_at] and "BlockStored" in kinds[cleared_at + 1 :]
    assert cached_tokens(again) == 0  # the reset emptied the cache
    assert num_blocks == len(prompt_from_text(templated(prompt), BLOCK).block_hashes)


def test_connect_mode_reaches_a_subscriber_that_binds() -> None:
    """An endpoint without * is connected to: one collector binds, engines connect."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    config = events_config(endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=None)

    async def scenario() -> None:
        async with live_emulator(config) as live:
            # a bound SUB attaches a new peer (and sends it the subscription) only
            # when the socket is next used: poll it while the publisher connects
            for _ in range(6):
                sub.poll(0)
                await asyncio.sleep(0.05)
            await live.chat(user(text_of(4, 50)))
            await asyncio.sleep(0.3)

    try:
        run(scenario())
        assert sub.poll(2000)
        topic, batch = decode_message(sub.recv_multipart())
        assert topic == TOPIC and batch.sequence == 0
        assert isinstance(batch.events[0], BlockStored)
    finally:
        sub.close()
        ctx.term()


# ---- the wire structure is vLLM's --------------------------------------------

FIXTURE = Path(__file__).parent / "data" / "vllm_kv_events_0.32.msgpack.b64"


def shape(value: Any) -> Any:
    """A msgpack value's structure: maps keep their keys in order, leaves become types."""
    if isinstance(value, dict):
        return [(key, shape(v)) for key, v in value.items()]
    if isinstance(value, list):
        return ["list", *sorted({repr(shape(v)) for v in value})]
    return type(value).__name__


def event_shapes(payloads: list[bytes]) -> dict[str, list[tuple[str, Any]]]:
    """Per event type, the key order and value types of its map (int hashes only)."""
    shapes: dict[str, list[tuple[str, Any]]] = {}
    for payload in payloads:
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and isinstance(events, list) and rank in (0, None)
        for event in events:
            assert isinstance(event, dict)
            hashes = event.get("block_hashes", [0])
            parent = event.get("parent_block_hash")
            is_plain = event.get("lora_name") is None and all(isinstance(h, int) for h in hashes)
            if is_plain and (parent is None or isinstance(parent, int)):
                kind = event["type"] + ("" if parent is None else "+parent")
                shapes.setdefault(kind, shape(event))
    return shapes


def test_messages_have_vllm_032_structure() -> None:
    """Compared with payloads made by vLLM 0.32's own msgspec classes (the fixture)."""
    vllm_payloads = [base64.b64decode(line) for line in FIXTURE.read_text().split()]
    vllm_outer = [msgpack.unpackb(p) for p in vllm_payloads if msgpack.unpackb(p)[2] == 0]

    async def scenario() -> list[list[bytes]]:
        async with live_emulator(
            admin_enabled=True,
            gpu_memory_utilization=TINY_KV_UTILIZATION,
            max_model_len_tokens=1024,
        ) as live:
            for seed in range(5):
                await live.chat(user(text_of(seed, 200)))
            await live.chat(user(text_of(0, 220)))  # a continuation: parent set
            async with live.session.post(live.url + "/reset_prefix_cache") as resp:
                assert (await resp.json()) == {"is_reset": True}
            return await live.drain()

    frames = run(scenario())
    ours = [f[2] for f in frames]
    for payload in ours:  # the outer EventBatch: [float ts, [events], rank 0]
        outer = msgpack.unpackb(payload)
        assert len(outer) == 3 and len(vllm_outer[0]) == 3
        assert [type(v).__name__ for v in outer] == [type(v).__name__ for v in vllm_outer[0]]
    theirs = event_shapes(vllm_payloads)
    mine = event_shapes(ours)
    assert set(mine) == {"BlockStored", "BlockStored+parent", "BlockRemoved", "AllBlocksCleared"}
    for kind, structure in mine.items():
        assert structure == theirs[kind], kind
    stored_keys = [key for key, _ in mine["BlockStored"]]
    assert stored_keys[:8] == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
        "lora_id", "medium", "lora_name",
    ]  # fmt: skip


# ---- never blocking, never crashing -------------------------------------------


def test_publish_never_waits_for_a_stuck_publisher_thread() -> None:
    """The engine's side returns at once even when the thread cannot send: a full
    queue drops batches (counted) instead of blocking the engine loop."""
    release = threading.Event()
    encoded: list[int] = []

    def slow_encode(topic: str, batch: KVEventBatch) -> list[bytes]:
        release.wait(10)
        encoded.append(batch.sequence)
        return [
            topic.encode(),
            batch.sequence.to_bytes(8, "big"),
            b"\x93\xcb" + bytes(8) + b"\x90\x00",
        ]

    publisher = KvEventPublisher(events_config(max_queue_size=2, replay_endpoint=None), slow_encode)
    publisher.start()
    try:
        started = time.perf_counter()
        for sequence in range(50):
            publisher.publish(KVEventBatch(sequence, 0.0, (AllBlocksCleared(),), 0))
        elapsed_s = time.perf_counter() - started
        assert elapsed_s < 0.05
        assert 45 <= publisher.num_dropped <= 48  # the thread holds one, the queue two
    finally:
        release.set()
        publisher.close()
    assert (
        encoded == sorted(encoded) and 2 <= len(encoded) <= 5 and publisher.num_sent == len(encoded)
    )


def test_garbage_replay_requests_are_ignored_and_replay_still_works() -> None:
    publisher = KvEventPublisher(events_config())
    publisher.start()
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        publisher.publish(KVEventBatch(0, 1.5, (AllBlocksCleared(),), 0))
        assert publisher.replay_endpoint is not None
        dealer.connect(loopback(publisher.replay_endpoint))
        dealer.send_multipart([b"", b"short"])
        dealer.send_multipart([b"", b"x" * 100_000])
        dealer.send_multipart([b"", b"a", b"b", b"c"])
        dealer.send_multipart([b"", (-5).to_bytes(8, "big", signed=True)])
        dealer.send_multipart([b"", encode_replay_request(0)])
        assert dealer.poll(3000)
        first = dealer.recv_multipart()
        assert first[1:3] == [TOPIC.encode(), (0).to_bytes(8, "big")]
        _, batch = decode_message(first[1:])
        assert batch.events == (AllBlocksCleared(),) and batch.ts_s == 1.5
        assert dealer.poll(3000)
        assert dealer.recv_multipart() == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]
        assert not dealer.poll(200)  # nothing answered the garbage
    finally:
        dealer.close()
        ctx.term()
        publisher.close()


def test_a_taken_endpoint_fails_the_start_and_the_cli_names_it() -> None:
    holder: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    port = holder.bind_to_random_port("tcp://*")
    try:
        publisher = KvEventPublisher(events_config(endpoint=f"tcp://*:{port}"))
        with pytest.raises(zmq.ZMQError):
            publisher.start()
        publisher.close()  # a no-op: nothing started
        config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"})
        result = CliRunner().invoke(
            app, ["emulate", "--profile", PROFILE, "--port", "0", "--kv-events-config", config]
        )
        assert result.exit_code == 2
        assert "cannot open the KV-event sockets" in result.output
    finally:
        holder.close(linger=0)


# ---- configuration --------------------------------------------------------------


def test_config_has_vllm_keys_defaults_and_clear_errors() -> None:
    default = parse_kv_events_config("{}")
    assert default == KvEventsConfig(publisher="null") and not default.is_publishing
    assert default.endpoint == "tcp://*:5557" and default.buffer_steps == 10_000
    enabled = parse_kv_events_config('{"enable_kv_cache_events": true, "topic": "t"}')
    assert enabled.publisher == "zmq" and enabled.is_publishing and enabled.topic == "t"
    null = parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}')
    assert not null.is_publishing
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'endpoints'.*valid keys: enable"):
        parse_kv_events_config('{"endpoints": "tcp://*:1"}')
    with pytest.raises(ValueError, match="publisher must be one of null, zmq, got 'kafka'"):
        parse_kv_events_config('{"publisher": "kafka"}')
    with pytest.raises(ValueError, match=r"kv_events\.endpoint: .*'http://x:1'"):
        parse_kv_events_config('{"endpoint": "http://x:1"}')
    with pytest.raises(ValueError, match="max_queue_size must be an integer >= 1, got 0"):
        parse_kv_events_config('{"max_queue_size": 0}')
    with pytest.raises(ValueError, match="enable_kv_cache_events must be true or false"):
        parse_kv_events_config('{"enable_kv_cache_events": "yes"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_kv_events_config("{")
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        parse_kv_events_config("[]")
    result = CliRunner().invoke(
        app, ["emulate", "--profile", PROFILE, "--kv-events-config", '{"hwm": -1}']
    )
    assert result.exit_code == 2 and "kv_events.hwm must be an integer >= 0" in result.output


def test_no_publisher_without_events() -> None:
    async def scenario() -> None:
        options = EmulatorOptions(profile=PROFILE, port=0, kv_events=KvEventsConfig())
        runner, _ = await start_emulator(options)
        try:
            emulator = runner.app[EMULATOR_KEY]
            assert emulator.kv_publisher is None and emulator.driver.kv_events is None
            assert emulator.driver.engine.kv.cache.observer is None
        finally:
            await runner.cleanup()

    run(scenario())


# ---- the cache's observer hook -------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_stored(self, block_hashes: Any, start: int, stop: int) -> None:
        self.calls.append(("stored", tuple(block_hashes[start:stop])))

    def on_removed(self, block_hash: int) -> None:
        self.calls.append(("removed", block_hash))

    def on_cleared(self) -> None:
        self.calls.append(("cleared",))


def test_cache_observer_sees_runs_of_new_blocks_evictions_and_clears() -> None:
    cache = EnginePrefixCache(BLOCK)
    recorder = Recorder()
    cache.observer = recorder
    assert cache.insert((1, 2, 3), 0, 3) == 3
    assert cache.insert((1, 2, 4, 5), 0, 4) == 2  # 1 and 2 are pinned, not stored again
    # 2 exists (as if a concurrent request computed it): two runs, split around it
    assert cache.insert((10, 2, 11), 0, 3) == 2
    assert recorder.calls == [
        ("stored", (1, 2, 3)),
        ("stored", (4, 5)),
        ("stored", (10,)),
        ("stored", (11,)),
    ]
    recorder.calls.clear()
    assert not cache.clear()  # blocks are pinned: nothing changes
    assert recorder.calls == [] and cache.num_blocks == 7
    cache.release((1, 2, 3), 3)
    assert cache.evict(1) == 1 and recorder.calls == [("removed", 3)]
    for hashes in ((1, 2, 4, 5), (10, 2, 11)):
        cache.release(hashes, len(hashes))
    assert cache.clear() and recorder.calls[-1] == ("cleared",) and cache.num_blocks == 0
