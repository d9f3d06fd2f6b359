"""The gateway's subscriber to one backend's KV-cache events (ZeroMQ SUB + replay).

**Topologies.** vLLM binds its PUB socket when its endpoint holds ``*`` (``tcp://*:5557``)
and connects otherwise. ``KVEventsSource.endpoint`` is the address *the gateway* uses:
against an engine that binds ``tcp://*:5557``, connect to ``tcp://<engine host>:5557``;
with ``bind=True`` the gateway binds ``endpoint`` and the engine is started with that
address to connect to. Sequence numbers are per publisher, so each backend (and each
data-parallel rank) needs an address of its own in either topology. Rank ``r`` uses
port + ``r`` (vLLM's rule). The replay ROUTER is always bound by the engine: the
gateway connects a DEALER to ``replay_endpoint`` (port + ``r`` for rank ``r``).

**Trust.** The sink hears ``on_synced`` when every rank's stream is known completely:
contiguous since the engine's batch 0 (directly, or by replaying the engine's buffer
from 0 after a late join) or since an ``AllBlocksCleared``, with no loss since. A gap
is filled through the replay socket (bounded by ``replay_timeout_s`` and
``MAX_REPLAY_BATCHES``); batches that arrive meanwhile wait in the SUB socket and are
applied after, their replayed duplicates dropped. A gap that cannot be filled, a batch
that cannot be decoded, or an engine restart (its sequence starts over) calls
``on_lost``: the consumer clears this backend's precise state and falls back to the
approximate index. Batches keep flowing to ``on_batch`` after a loss, so the state is
rebuilt, but blocks stored before the loss stay unknown until re-stored; the backend is
synced again (``on_synced``) only at a restart's batch 0 or an ``AllBlocksCleared``
(a restarted vLLM's cache is empty). A loss on one rank untrusts every rank, because
``on_lost`` clears the whole backend.

Errors are counted (:meth:`KVEventSubscriber.snapshot`) and logged at most once per
kind per ``LOG_INTERVAL_S``; nothing escapes the receive task.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from longroute.gateway.kv_sequence import SequenceTracker, SequenceVerdict
from longroute.gateway.kv_source import KVEventSink, KVEventsSource, KVSubscriberStats
from longroute.prefix.kv_endpoints import offset_endpoint_port
from longroute.prefix.kv_events import AllBlocksCleared, KVEventBatch
from longroute.prefix.kv_wire import (
    MAX_PAYLOAD_BYTES,
    DecodedMessage,
    KVWireError,
    ReplayEnd,
    decode_frames,
    decode_replay_reply,
    encode_replay_request,
)

__all__ = ["KVEventSink", "KVEventSubscriber", "KVEventsSource", "KVSubscriberStats"]

log = logging.getLogger("longroute.gateway.kv_events")

MAX_REPLAY_BATCHES = 20_000  # vLLM buffers 10,000 by default
LOG_INTERVAL_S = 10.0
RECEIVE_HWM = 10_000  # live batches queued in ZeroMQ while a replay runs
# ZeroMQ drops a peer that sends more than this in one frame (memory bound); the
# decoder refuses, with a log line, anything over MAX_PAYLOAD_BYTES below it.
MAX_FRAME_BYTES = 2 * MAX_PAYLOAD_BYTES


class _ReplayFailed(Exception):
    """The replay socket did not fill a gap; the message says why."""


@dataclass(slots=True)
class _Rank:
    rank: int
    sub: zmq.asyncio.Socket
    replay_endpoint: str | None
    tracker: SequenceTracker = field(default_factory=SequenceTracker)
    replay: zmq.asyncio.Socket | None = None
    is_trusted: bool = False


class KVEventSubscriber:
    """Receives one backend's KV events on every data-parallel rank and feeds ``sink``."""

    def __init__(
        self,
        backend: str,
        source: KVEventsSource,
        sink: KVEventSink,
        *,
        replay_timeout_s: float = 2.0,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        if not 0 < replay_timeout_s <= 60:
            raise ValueError(f"replay_timeout_s must be in (0, 60], got {replay_timeout_s}")
        self.backend = backend
        self._source = source
        self._sink = sink
        self._replay_timeout_s = replay_timeout_s
        self._context = context if context is not None else zmq.asyncio.Context.instance()
        self._ranks: list[_Rank] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._counts: Counter[str] = Counter()
        self._is_synced = False
        self._last_log_s: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    # --- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Open the sockets (binding raises here) and start one receive task per rank."""
        if self._tasks:
            raise RuntimeError(f"KV-event subscriber of {self.backend!r} already started")
        try:
            for rank in range(self._source.num_dp_ranks):
                self._ranks.append(self._open_rank(rank))
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise RuntimeError(f"backend {self.backend!r}: KV-event socket failed: {exc}") from exc
        for state in self._ranks:
            name = f"kv-events-{self.backend}-{state.rank}"
            self._tasks.append(asyncio.create_task(self._receive(state), name=name))

    async def close(self) -> None:
        """Stop the tasks and close the sockets (linger 0). Safe to call twice."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._close_sockets()

    def has_pending(self) -> bool:
        """Whether a message waits in a SUB socket, not yet applied (ZeroMQ's EVENTS flag;
        pyzmq's asyncio sockets re-arm their reader when it is read). O(ranks)."""
        return any(int(state.sub.get(zmq.EVENTS)) & zmq.POLLIN for state in self._ranks)

    @property
    def bound_endpoints(self) -> list[str]:
        """The endpoints the SUB sockets use (with ``bind`` and port 0: the real port)."""
        return [str(s.sub.getsockopt_string(zmq.LAST_ENDPOINT)) for s in self._ranks]

    def snapshot(self) -> KVSubscriberStats:
        c = self._counts
        return KVSubscriberStats(
            c["batches"], c["events"], c["gaps"], c["resyncs_ok"], c["resyncs_failed"],
            c["decode_errors"], c["restarts"], c["losses"], c["duplicates"],
            c["unknown_events"], c["unmappable_events"], c["foreign_topic"],
            c["sink_errors"], self._is_synced,
        )  # fmt: skip

    def _open_rank(self, rank: int) -> _Rank:
        address = offset_endpoint_port(self._source.endpoint, rank)
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        sub.setsockopt(zmq.IPV6, int("[" in address))
        sub.setsockopt(zmq.SUBSCRIBE, self._source.topic.encode("utf-8"))
        state = _Rank(rank, sub, None)
        if self._source.bind:
            sub.bind(address)
        else:
            sub.connect(address)
        if self._source.replay_endpoint is not None:
            state.replay_endpoint = offset_endpoint_port(self._source.replay_endpoint, rank)
        return state

    def _replay_socket(self, state: _Rank, endpoint: str) -> zmq.asyncio.Socket:
        if state.replay is None:
            state.replay = self._context.socket(zmq.DEALER)
            state.replay.setsockopt(zmq.LINGER, 0)
            state.replay.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
            state.replay.setsockopt(zmq.IPV6, int("[" in endpoint))
            state.replay.connect(endpoint)
        return state.replay

    def _drop_replay_socket(self, state: _Rank) -> None:
        # Late replies of a failed replay must not be read as the next one's.
        if state.replay is not None:
            state.replay.close(linger=0)
            state.replay = None

    def _close_sockets(self) -> None:
        for state in self._ranks:
            state.sub.close(linger=0)
            self._drop_replay_socket(state)
        self._ranks = []

    # --- receiving -------------------------------------------------------------------

    async def _receive(self, state: _Rank) -> None:
        while True:
            try:
                frames = await state.sub.recv_multipart()
            except zmq.ZMQError as exc:  # the socket was closed under us
                self._warn("socket", f"receive failed on rank {state.rank}: {exc}")
                return
            try:
                await self._handle(state, frames)
            except Exception as exc:  # a bug must not end the subscription
                self._counts["handler_errors"] += 1
                self._warn("handler", f"rank {state.rank}: {type(exc).__name__}: {exc}")

    async def _handle(self, state: _Rank, frames: list[bytes]) -> None:
        try:
            message = decode_frames(frames)
        except KVWireError as exc:
            self._counts["decode_errors"] += 1
            self._warn("decode", f"rank {state.rank}: dropped a bad KV-event message: {exc}")
            self._lose_undecodable(state, frames)
            return
        if message.topic != self._source.topic:  # a longer topic with our prefix
            self._counts["foreign_topic"] += 1
            return
        sequence = message.batch.sequence
        verdict = state.tracker.classify(sequence)
        if verdict is SequenceVerdict.DUPLICATE:
            self._counts["duplicates"] += 1
            return
        if verdict is SequenceVerdict.RESTART:
            self._counts["restarts"] += 1
            reason = f"engine restarted (sequence {state.tracker.expected - 1} -> {sequence})"
            self._lose(state, reason)
            state.tracker.restart()
            verdict = state.tracker.classify(sequence)
        if verdict is SequenceVerdict.GAP:
            self._counts["gaps"] += 1
            await self._resync(state, message)
            return
        self._deliver(state, message)

    def _lose_undecodable(self, state: _Rank, frames: list[bytes]) -> None:
        """A bad payload under a readable sequence is a batch lost for good."""
        if len(frames) != 3 or len(frames[1]) != 8:
            return  # no sequence: the next good batch shows whether one was lost
        sequence = int.from_bytes(frames[1], "big", signed=True)
        if sequence >= state.tracker.expected:
            self._lose(state, f"batch {sequence} could not be decoded")
            state.tracker.accept(sequence)

    async def _resync(self, state: _Rank, trigger: DecodedMessage) -> None:
        start, stop = state.tracker.expected, trigger.batch.sequence
        try:
            replayed = await self._replay(state, start)
        except _ReplayFailed as exc:
            self._counts["resyncs_failed"] += 1
            self._lose(state, f"sequence gap {start}..{stop - 1} not filled: {exc}")
            state.tracker.accept(stop - 1)
            self._deliver(state, trigger)
            return
        for message in replayed:
            if message.batch.sequence == state.tracker.expected:
                self._deliver(state, message)
        if state.tracker.expected < stop:
            self._counts["resyncs_failed"] += 1
            self._lose(state, f"replay of {start}..{stop - 1} stopped at {state.tracker.expected}")
            state.tracker.accept(stop - 1)
        else:
            self._counts["resyncs_ok"] += 1
        if state.tracker.expected == stop:
            self._deliver(state, trigger)
        state.tracker.replayed(start)

    async def _replay(self, state: _Rank, start: int) -> list[DecodedMessage]:
        """The engine's buffered batches from ``start``, in its order, within the bound."""
        if state.replay_endpoint is None:
            raise _ReplayFailed("no replay_endpoint configured")
        socket = self._replay_socket(state, state.replay_endpoint)
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self._replay_timeout_s
        replies: list[DecodedMessage] = []
        try:
            await socket.send_multipart([b"", encode_replay_request(start)])
            while True:
                remaining_s = deadline_s - loop.time()
                if remaining_s <= 0 or not await socket.poll(timeout=int(remaining_s * 1000) + 1):
                    raise _ReplayFailed(f"no end of replay within {self._replay_timeout_s} s")
                frames = await socket.recv_multipart()
                reply = decode_replay_reply(frames[1:] if frames[:1] == [b""] else frames)
                if isinstance(reply, ReplayEnd):
                    return replies
                replies.append(reply)
                if len(replies) > MAX_REPLAY_BATCHES:
                    raise _ReplayFailed(f"more than {MAX_REPLAY_BATCHES} batches replayed")
        except (_ReplayFailed, KVWireError, zmq.ZMQError) as exc:
            self._drop_replay_socket(state)
            raise _ReplayFailed(str(exc)) from exc

    def _deliver(self, state: _Rank, message: DecodedMessage) -> None:
        batch = message.batch
        state.tracker.accept(batch.sequence)
        if batch.data_parallel_rank is None:
            batch = KVEventBatch(batch.sequence, batch.ts_s, batch.events, state.rank)
        self._counts["batches"] += 1
        self._counts["events"] += len(batch.events)
        self._counts["unknown_events"] += message.num_unknown_events
        self._counts["unmappable_events"] += message.num_unmappable_events
        self._call_sink("on_batch", lambda: self._sink.on_batch(self.backend, batch))
        if batch.sequence == 0 or any(isinstance(e, AllBlocksCleared) for e in batch.events):
            state.is_trusted = True  # the engine's cache from here on is all we heard
        if not self._is_synced and all(s.is_trusted for s in self._ranks):
            self._is_synced = True
            log.info("backend %s: KV events in sync", self.backend)
            self._call_sink("on_synced", lambda: self._sink.on_synced(self.backend))

    def _lose(self, state: _Rank, reason: str) -> None:
        self._counts["losses"] += 1
        for other in self._ranks:
            other.is_trusted = False
        self._is_synced = False
        self._warn("lost", f"rank {state.rank}: precise state lost: {reason}")
        text = f"rank {state.rank}: {reason}"
        self._call_sink("on_lost", lambda: self._sink.on_lost(self.backend, text))

    def _call_sink(self, what: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:  # the consumer's bug must not stop the stream
            self._counts["sink_errors"] += 1
            self._warn("sink", f"{what} raised {type(exc).__name__}: {exc}")

    def _warn(self, kind: str, text: str) -> None:
        """One warning line per ``kind`` per ``LOG_INTERVAL_S``; the rest are counted."""
        now_s = asyncio.get_running_loop().time()
        last_s = self._last_log_s.get(kind)
        if last_s is not None and now_s - last_s < LOG_INTERVAL_S:
            self._unlogged[kind] += 1
            return
        self._last_log_s[kind] = now_s
        more = self._unlogged.pop(kind, 0)
        suffix = f" ({more} more like it not logged)" if more else ""
        log.warning("backend %s: KV events: %s%s", self.backend, text, suffix)
