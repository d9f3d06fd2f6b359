"""The gateway's KV-event subscriber against real ZeroMQ sockets on loopback.

A fake engine publishes vLLM's frames (kv_wire.encode_message) from an XPUB socket
(it sees the subscription arrive, so nothing is published before the subscriber
listens) and answers replay requests on a ROUTER socket as vLLM's _service_replay.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
import zmq.asyncio

from longroute.gateway.kv_sequence import SequenceTracker, SequenceVerdict
from longroute.gateway.kv_subscriber import (
    KVEventsSource,
    KVEventSubscriber,
)
from longroute.prefix.kv_decode import MAX_HASHES_PER_EVENT
from longroute.prefix.kv_events import AllBlocksCleared, BlockStored, KVEventBatch
from longroute.prefix.kv_wire import (
    decode_replay_request,
    encode_message,
    encode_replay_end,
    encode_sequence,
)

TOPIC = "kv"


class Recorder:
    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []
        self.log: list[str] = []  # "batch <seq>", "lost", "synced", in call order

    def on_batch(self, backend: str, batch: KVEventBatch) -> None:
        assert backend == "b0"
        self.batches.append(batch)
        self.log.append(f"batch {batch.sequence}")

    def on_lost(self, backend: str, reason: str) -> None:
        self.log.append("lost")
        self.reason = reason

    def on_synced(self, backend: str) -> None:
        self.log.append("synced")

    def sequences(self) -> list[int]:
        return [b.sequence for b in self.batches]


def batch(sequence: int, rank: int | None = 0) -> KVEventBatch:
    stored = BlockStored((sequence + 1000,), None, (sequence, sequence), 2)
    return KVEventBatch(sequence, 1.0 + sequence, (stored,), rank)


class FakeEngine:
    """vLLM's publisher side: XPUB for events, ROUTER for replay (answers if told to)."""

    def __init__(self, ctx: zmq.asyncio.Context, *, answer_replay: bool = True) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.history: dict[int, list[bytes]] = {}
        self.answer_replay = answer_replay
        self.replay_requests: list[int] = []
        self._task = asyncio.create_task(self._serve_replay())

    def bind(self, port: int | None = None) -> int:
        if port is None:
            return self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.pub.bind(f"tcp://127.0.0.1:{port}")
        return port

    async def subscribed(self) -> None:
        assert (await asyncio.wait_for(self.pub.recv(), 5))[:1] == b"\x01"

    async def publish(self, sequence: int, *, live: bool = True) -> None:
        frames = encode_message(TOPIC, batch(sequence))
        self.history[sequence] = frames
        if live:
            await self.pub.send_multipart(frames)

    async def _serve_replay(self) -> None:
        while True:
            client, empty, start_frame = await self.router.recv_multipart()
            start = decode_replay_request(start_frame)
            self.replay_requests.append(start)
            if not self.answer_replay:
                continue
            for sequence in sorted(self.history):
                if sequence >= start:
                    await self.router.send_multipart([client, empty, *self.history[sequence]])
            await self.router.send_multipart([client, empty, *encode_replay_end()])

    def close(self) -> None:
        self._task.cancel()
        self.pub.close(0)
        self.router.close(0)


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def started(
    engine: FakeEngine, recorder: Recorder, *, replay: bool = True, timeout_s: float = 2.0
) -> KVEventSubscriber:
    port = engine.bind()
    replay_endpoint = f"tcp://127.0.0.1:{engine.router_port}" if replay else None
    source = KVEventsSource(f"tcp://127.0.0.1:{port}", replay_endpoint, TOPIC)
    subscriber = KVEventSubscriber("b0", source, recorder, replay_timeout_s=timeout_s)
    await subscriber.start()
    await engine.subscribed()
    return subscriber


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop, bounded (no pytest-asyncio here)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 20))

    return run


@in_loop
async def test_events_arrive_in_order_and_sync() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Recorder()
    subscriber = await started(engine, recorder)
    for sequence in range(3):
        await engine.publish(sequence)
    await until(lambda: len(recorder.batches) == 3)
    assert recorder.log == ["batch 0", "synced", "batch 1", "batch 2"]
    assert recorder.batches[1] == batch(1)
    stats = subscriber.snapshot()
    assert (stats.num_batches, stats.num_events, stats.num_gaps, stats.is_synced) == (3, 3, 0, True)
    await subscriber.close()
    await subscriber.close()  # twice is fine
    engine.close()


@in_loop
async def test_gap_is_filled_by_replay_and_live_duplicates_dropped() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Recorder()
    subscriber = await started(engine, recorder)
    await engine.publish(0)
    await until(lambda: len(recorder.batches) == 1)
    await engine.publish(1, live=False)  # dropped on the way
    await engine.publish(2, live=False)
    await engine.publish(3)
    await engine.publish(4)  # queued live while the replay (1..4) runs
    await until(lambda: len(recorder.batches) == 5)
    await engine.publish(5)
    await until(lambda: len(recorder.batches) == 6)
    assert recorder.sequences() == [0, 1, 2, 3, 4, 5]
    assert "lost" not in recorder.log
    assert engine.replay_requests == [1]
    stats = subscriber.snapshot()
    assert (stats.num_gaps, stats.num_resyncs_ok, stats.num_losses) == (1, 1, 0)
    assert stats.is_synced
    await subscriber.close()
    engine.close()


@in_loop
async def test_late_join_replays_the_engines_history_from_zero() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Recorder()
    for sequence in range(3):  # before the gateway came up
        await engine.publish(sequence, live=False)
    subscriber = await started(engine, recorder)
    await engine.publish(3)
    await until(lambda: len(recorder.batches) == 4)
    assert recorder.log == ["batch 0", "synced", "batch 1", "batch 2", "batch 3"]
    assert engine.replay_requests == [0]
    await subscriber.close()
    engine.close()


@in_loop
async def test_replay_that_never_answers_loses_within_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx, answer_replay=False), Recorder()
    subscriber = await started(engine, recorder, timeout_s=0.3)
    await engine.publish(0)
    await until(lambda: len(recorder.batches) == 1)
    began = time.monotonic()
    await engine.publish(5)
    await until(lambda: "lost" in recorder.log)
    assert time.monotonic() - began < 1.5
    assert "gap 1..4 not filled" in recorder.reason and "0.3 s" in recorder.reason
    assert any("precise state lost" in r.getMessage() for r in caplog.records)
    await engine.publish(6)  # still listening
    await until(lambda: recorder.sequences() == [0, 5, 6])
    stats = subscriber.snapshot()
    assert (stats.num_resyncs_failed, stats.num_losses, stats.is_synced) == (1, 1, False)
    await subscriber.close()
    engine.close()


@in_loop
async def test_gap_without_replay_endpoint_is_a_loss() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Recorder()
    subscriber = await started(engine, recorder, replay=False)
    await engine.publish(0)
    await engine.publish(2)
    await until(lambda: len(recorder.batches) == 2)
    assert recorder.log == ["batch 0", "synced", "lost", "batch 2"]
    assert "no replay_endpoint" in recorder.reason
    await subscriber.close()
    engine.close()


@in_loop
async def test_restart_is_a_loss_then_a_fresh_stream() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Recorder()
    subscriber = await started(engine, recorder)
    for sequence in (0, 1, 2, 0, 1):  # the engine restarted after 2
        await engine.publish(sequence)
    await until(lambda: len(recorder.batches) == 5)
    assert recorder.log == [
        "batch 0", "synced", "batch 1", "batch 2", "lost", "batch 0", "synced", "batch 1",
    ]  # fmt: skip
    assert "restarted" in recorder.reason
    assert subscriber.snapshot().num_restarts == 1
    await subscriber.close()
    engine.close()


@in_loop
async def test_all_blocks_cleared_makes_a_lost_backend_trusted_again() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Recorder()
    subscriber = await started(engine, recorder, replay=False)
    await engine.publish(4)  # late join, no replay: lost
    cleared = KVEventBatch(5, 2.0, (AllBlocksCleared(),), 0)
    await engine.pub.send_multipart(encode_message(TOPIC, cleared))
    await until(lambda: len(recorder.batches) == 2)
    assert recorder.log == ["lost", "batch 4", "batch 5", "synced"]
    await subscriber.close()
    engine.close()


@in_loop
async def test_garbage_and_huge_batches_are_counted_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx, answer_replay=False), Recorder()
    subscriber = await started(engine, recorder, timeout_s=0.2)
    await engine.publish(0)
    huge = {"type": "BlockRemoved", "block_hashes": [1] * (MAX_HASHES_PER_EVENT + 1)}
    await engine.pub.send_multipart([b"kv", encode_sequence(1), msgpack.packb([1.0, [huge], 0])])
    for _ in range(50):  # a flood of garbage: bad payload, wrong frame counts
        await engine.pub.send_multipart([b"kv", encode_sequence(2), b"\xc1\x00garbage"])
        await engine.pub.send_multipart([b"kv", b"x"])
        await engine.pub.send_multipart([b"kv", b"x", b"y", b"z"])
    await engine.publish(3)
    await until(lambda: recorder.sequences() == [0, 3])
    stats = subscriber.snapshot()
    assert stats.num_decode_errors == 151
    assert stats.num_losses == 2  # batch 1 (huge) and batch 2 (garbage), each once
    decode_lines = [r for r in caplog.records if "bad KV-event message" in r.getMessage()]
    assert 1 <= len(decode_lines) <= 2  # rate-limited, not one per frame
    assert "block_hashes has 65537 entries" in decode_lines[0].getMessage()
    await subscriber.close()
    engine.close()


@in_loop
async def test_gateway_binds_and_the_engine_connects() -> None:
    ctx, recorder = zmq.asyncio.Context.instance(), Recorder()
    source = KVEventsSource("tcp://127.0.0.1:0", None, TOPIC, bind=True)
    subscriber = KVEventSubscriber("b0", source, recorder)
    await subscriber.start()
    (bound,) = subscriber.bound_endpoints
    publisher = ctx.socket(zmq.XPUB)
    publisher.connect(bound)
    assert (await asyncio.wait_for(publisher.recv(), 5))[:1] == b"\x01"
    await publisher.send_multipart(encode_message(TOPIC, batch(0)))
    await until(lambda: recorder.log == ["batch 0", "synced"])
    publisher.close(0)
    await subscriber.close()


@in_loop
async def test_data_parallel_rank_one_publishes_on_port_plus_one() -> None:
    ctx = zmq.asyncio.Context.instance()
    rank0, rank1, recorder = FakeEngine(ctx), FakeEngine(ctx), Recorder()
    for _ in range(50):  # two adjacent free ports
        port = rank0.bind()
        try:
            rank1.bind(port + 1)
            break
        except zmq.ZMQError:
            rank0.pub.unbind(f"tcp://127.0.0.1:{port}")
    source = KVEventsSource(f"tcp://127.0.0.1:{port}", None, TOPIC, num_dp_ranks=2)
    subscriber = KVEventSubscriber("b0", source, recorder)
    await subscriber.start()
    await rank0.subscribed()
    await rank1.subscribed()
    await rank0.publish(0)
    await until(lambda: len(recorder.batches) == 1)
    assert "synced" not in recorder.log  # rank 1 has said nothing yet
    frames = encode_message(TOPIC, batch(0, rank=None))  # rank unset: the subscriber's
    await rank1.pub.send_multipart(frames)
    await until(lambda: recorder.log[-1] == "synced")
    assert [b.data_parallel_rank for b in recorder.batches] == [0, 1]
    await subscriber.close()
    rank0.close()
    rank1.close()


@in_loop
async def test_a_failing_sink_does_not_stop_the_stream() -> None:
    class Failing(Recorder):
        def on_batch(self, backend: str, batch: KVEventBatch) -> None:
            super().on_batch(backend, batch)
            raise RuntimeError("consumer bug")

    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx), Failing()
    subscriber = await started(engine, recorder)
    await engine.publish(0)
    await engine.publish(1)
    await until(lambda: recorder.sequences() == [0, 1])
    assert subscriber.snapshot().num_sink_errors == 2
    await subscriber.close()
    engine.close()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"endpoint": "tcp://*:5557"}, "bind address"),
        ({"endpoint": "tcp://engine"}, "tcp://host:port"),
        ({"endpoint": "http://engine:1"}, "starts with"),
        ({"replay_endpoint": "tcp://*:5558"}, "replay socket"),
        ({"num_dp_ranks": 0}, "num_dp_ranks"),
        ({"endpoint": "tcp://e:65535", "num_dp_ranks": 2}, "65535"),
        ({"topic": "t" * 300}, "topic"),
    ],
)
def test_bad_config_is_refused_with_the_reason(kwargs: dict[str, object], words: str) -> None:
    values: dict[str, object] = {"endpoint": "tcp://e:5557", "replay_endpoint": None, "topic": ""}
    values.update(kwargs)
    with pytest.raises(ValueError, match=words):
        KVEventsSource(**values)  # type: ignore[arg-type]


def test_sequence_tracker_verdicts() -> None:
    tracker = SequenceTracker()
    assert tracker.classify(0) is SequenceVerdict.IN_ORDER
    assert tracker.classify(3) is SequenceVerdict.GAP
    for sequence in range(5):
        tracker.accept(sequence)
    tracker.replayed(2)  # 2..4 came by replay
    assert tracker.classify(3) is SequenceVerdict.DUPLICATE
    assert tracker.classify(1) is SequenceVerdict.RESTART
    tracker.accept(5)
    assert tracker.classify(3) is SequenceVerdict.RESTART  # window closed


@in_loop
async def test_close_while_replaying_is_prompt() -> None:
    ctx = zmq.asyncio.Context.instance()
    engine, recorder = FakeEngine(ctx, answer_replay=False), Recorder()
    subscriber = await started(engine, recorder, timeout_s=30)
    await engine.publish(3)  # late join: the replay waits, and never hears back
    await until(lambda: engine.replay_requests == [0])
    began = time.monotonic()
    await subscriber.close()
    assert time.monotonic() - began < 1.0
    engine.close()
