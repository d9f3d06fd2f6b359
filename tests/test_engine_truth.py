"""EngineTruth: when a backend's prefix state is precise (from its events) and when it falls
back to the approximate index, and what it predicts in each state."""

from __future__ import annotations

import asyncio
import logging

import pytest

from longroute.features.block_hash import chain_block_hashes
from longroute.gateway.backends import build_backend
from longroute.gateway.config import BackendConfig
from longroute.gateway.engine_truth import EngineTruth
from longroute.prefix.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from longroute.prefix.precise_index import PrecisePrefixIndex
from longroute.types import Request

BLOCK = 4
TOKENS = tuple(range(100, 113))  # 13 tokens: 3 full blocks
HASHES = chain_block_hashes(TOKENS, BLOCK)


def request() -> Request:
    return Request("r", 0.0, len(TOKENS), 8, block_hashes=HASHES, block_size_tokens=BLOCK)


def stored(sequence: int) -> KVEventBatch:
    """The engine stored the prompt's 3 full blocks (its own hashes 1, 2, 3)."""
    event = BlockStored((1, 2, 3), None, TOKENS[:12], BLOCK)
    return KVEventBatch(sequence, 0.0, (event,), 0)


async def truth_with_backend(timeout_s: float = 30.0) -> EngineTruth:
    index = PrecisePrefixIndex(["b0", "b1"], 1000)
    truth = EngineTruth(index, BLOCK, timeout_s)
    config = BackendConfig(
        name="b0",
        url="http://127.0.0.1:9",
        model="m",
        kv_events={"endpoint": "tcp://127.0.0.1:9", "topic": "kv"},  # type: ignore[arg-type]
    )
    await truth.set_backends({"b0": build_backend(config, None)})
    return truth


def test_precise_from_the_first_batch_of_a_history_and_back_on_a_loss() -> None:
    async def run() -> None:
        truth = await truth_with_backend()
        try:
            # a batch in the middle of the engine's history: blocks before it are unknown
            truth.on_batch("b0", stored(5))
            assert not truth.is_precise("b0")
            assert truth.predicted_cached_tokens("b0", request()) is None
            # batch 0 starts a complete history
            truth.on_batch("b0", stored(0))
            assert truth.is_precise("b0")
            assert truth.predicted_cached_tokens("b0", request()) == 12  # 3 blocks, 12 <= 13-1
            truth.on_batch("b0", KVEventBatch(1, 0.0, (BlockRemoved((3,)),), 0))
            assert truth.predicted_cached_tokens("b0", request()) == 8
            truth.on_lost("b0", "rank 0: a gap the replay did not fill")
            assert not truth.is_precise("b0")
            assert truth.predicted_cached_tokens("b0", request()) is None
            assert truth.num_fallbacks == {"b0": 1}
            # an AllBlocksCleared starts a complete history again
            truth.on_batch("b0", KVEventBatch(9, 0.0, (AllBlocksCleared(),), 0))
            assert truth.is_precise("b0")
            assert truth.predicted_cached_tokens("b0", request()) == 0
            # a backend without kv_events never turns precise
            truth.on_batch("b1", stored(0))
            assert not truth.is_precise("b1")
        finally:
            await truth.close()

    asyncio.run(run())


def test_an_event_in_another_block_size_falls_back() -> None:
    async def run() -> None:
        truth = await truth_with_backend()
        try:
            truth.on_batch("b0", stored(0))
            odd = BlockStored((7,), None, (1, 2, 3, 4, 5, 6, 7, 8), 8)
            truth.on_batch("b0", KVEventBatch(1, 0.0, (odd,), 0))
            assert not truth.is_precise("b0")
            assert truth.num_fallbacks == {"b0": 1}
        finally:
            await truth.close()

    asyncio.run(run())


def test_silence_after_requests_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        truth = await truth_with_backend(timeout_s=0.05)
        task = asyncio.create_task(truth.run())
        try:
            await asyncio.sleep(0.12)  # nothing sent yet: nothing to say
            assert "no KV event" not in caplog.text
            truth.predicted_cached_tokens("b0", request())
            await asyncio.sleep(0.2)
        finally:
            task.cancel()
            await truth.close()

    with caplog.at_level(logging.WARNING, logger="longroute.gateway.kv_events"):
        asyncio.run(run())
    assert caplog.text.count("no KV event received") == 1
    assert "approximate index" in caplog.text


def test_a_dropped_subscription_leaves_the_backend_approximate() -> None:
    async def run() -> None:
        truth = await truth_with_backend()
        truth.on_batch("b0", stored(0))
        assert truth.is_precise("b0")
        await truth.set_backends({})  # a reload removed its kv_events
        assert not truth.is_precise("b0")
        assert truth.stats() == {}

    asyncio.run(run())


def test_settle_applies_events_already_waiting_in_the_socket() -> None:
    """Events an engine published just before its answer may sit in the subscriber's
    socket when the next request comes; ``settle`` lets the loop apply them first."""
    import time

    import zmq
    import zmq.asyncio

    from longroute.prefix.kv_wire import encode_message

    async def run() -> None:
        context = zmq.asyncio.Context()
        pub = context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        index = PrecisePrefixIndex(["b0"], 1000)
        truth = EngineTruth(index, BLOCK, 30.0)
        config = BackendConfig(
            name="b0",
            url="http://127.0.0.1:9",
            model="m",
            kv_events={"endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"},  # type: ignore[arg-type]
        )
        await truth.set_backends({"b0": build_backend(config, None)})
        try:
            sequence = 0
            while not truth.is_precise("b0") and sequence < 50:  # ZeroMQ's slow joiner
                # a clear then the blocks: a complete history whichever batch arrives first
                events = (AllBlocksCleared(), *stored(sequence).events)
                await pub.send_multipart(encode_message("kv", KVEventBatch(sequence, 0.0, events)))
                await asyncio.sleep(0.02)
                sequence += 1
            assert truth.predicted_cached_tokens("b0", request()) == 12
            removed = KVEventBatch(sequence, 0.0, (BlockRemoved((2,)),), 0)
            await pub.send_multipart(encode_message("kv", removed))
            time.sleep(0.05)  # it reaches the socket; the loop has not run since
            await truth.settle("b0")
            assert truth.predicted_cached_tokens("b0", request()) == 4  # blocks 2, 3 gone
        finally:
            await truth.close()
            pub.close()
            context.term()

    asyncio.run(asyncio.wait_for(run(), 30))
