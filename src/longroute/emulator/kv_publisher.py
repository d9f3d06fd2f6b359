"""Publishing KV-event batches on ZeroMQ as vLLM 0.32 does, without blocking the engine.

Sockets, as vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``):
a PUB socket on ``endpoint`` (bound or connected, see
:func:`~longroute.prefix.kv_endpoints.is_bind_endpoint`) with the
config's high-water mark, and with a ``replay_endpoint`` a bound ROUTER
socket. Each batch goes out as three frames, ``[topic, sequence as 8-byte
big-endian, msgpack payload]``, encoded by :mod:`longroute.prefix.kv_wire`
(as are the replay request and its end marker).
The last ``buffer_steps`` batches are kept; a replay request (a REQ or DEALER
client sending ``[b"", start sequence as 8 bytes big-endian]``) is answered
with every kept batch from that sequence on, each ``[b"", topic, sequence,
payload]``, then ``[b"", b"", -1 as 8 signed bytes, b""]``.

Why a thread: the engine loop (the asyncio loop of the HTTP server) must
never wait on the network or spend time encoding. :meth:`KvEventPublisher.publish`
puts the batch in a bounded queue without waiting and pokes a pipe; one
background thread owns both sockets, encodes, sends (PUB never blocks: past
the high-water mark ZeroMQ drops, as for vLLM), keeps the replay buffer and
answers replay requests. The thread sleeps in ``zmq.Poller`` on the pipe and
the ROUTER socket, so an idle emulator wakes for nothing. Unlike vLLM, whose
``publish`` blocks when its queue is full, a full queue drops the batch and
counts it (``num_dropped``); its sequence number is then missing on the wire,
so a subscriber sees the gap.

Sockets are opened in :meth:`KvEventPublisher.start` on the caller's thread
(a taken port fails the start) and then used only by the publisher thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable

import zmq

from longroute.emulator.kv_events_config import KvEventsConfig
from longroute.prefix.kv_endpoints import is_bind_endpoint
from longroute.prefix.kv_events import KVEventBatch
from longroute.prefix.kv_wire import (
    KVWireError,
    decode_replay_request,
    encode_message,
    encode_replay_end,
)

log = logging.getLogger(__name__)

Encoder = Callable[[str, KVEventBatch], list[bytes]]
_SHUTDOWN_TIMEOUT_S = 2.0
_MAX_REPLAY_FRAMES = 8  # a valid request has 3 (identity, b"", start); more is garbage


def build_publisher(config: KvEventsConfig | None) -> KvEventPublisher | None:
    """The publisher a config asks for; None when it publishes nothing (vLLM's null)."""
    return None if config is None or not config.is_publishing else KvEventPublisher(config)


class KvEventPublisher:
    """One emulator's PUB (and replay ROUTER) sockets and the thread that serves them."""

    def __init__(self, config: KvEventsConfig, encode: Encoder | None = None) -> None:
        if not config.is_publishing:
            raise ValueError("KvEventPublisher needs enable_kv_cache_events and publisher 'zmq'")
        self.config = config
        self._encode = encode if encode is not None else encode_message
        self._queue: queue.Queue[KVEventBatch] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[list[bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.Socket[bytes] | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._is_closing = False
        self.num_dropped = 0
        self.num_sent = 0
        self.endpoint: str = config.endpoint
        self.replay_endpoint: str | None = config.replay_endpoint

    # ---- the engine's side ------------------------------------------------
    def start(self) -> None:
        """Open the sockets (OSError/zmq.ZMQError if an endpoint cannot be used), then serve."""
        config = self.config
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.set_hwm(config.hwm)
        try:
            if is_bind_endpoint(config.endpoint):
                pub.bind(config.endpoint)
                self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                pub.connect(config.endpoint)
            if config.replay_endpoint is not None:
                replay = self._ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                self._replay = replay
                replay.bind(config.replay_endpoint)
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError:
            pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
                self._replay = None
            raise
        self._pub = pub
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._serve, name="kv-events-publisher", daemon=True)
        self._thread.start()
        log.info("publishing KV events on %s (replay: %s)", self.endpoint, self.replay_endpoint)

    def publish(self, batch: KVEventBatch) -> None:
        """Queue one batch for sending; never waits (a full queue drops it, counted)."""
        if self._thread is None or self._is_closing:
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.num_dropped += 1
            if self.num_dropped == 1 or self.num_dropped % 1000 == 0:
                log.warning(
                    "KV events: the publisher queue is full (%d batches); %d batch(es) dropped",
                    self.config.max_queue_size,
                    self.num_dropped,
                )
            return
        self._poke()

    def close(self) -> None:
        """Send what is queued (up to a timeout), stop the thread, close the sockets."""
        if self._thread is None or self._is_closing:
            return
        self._is_closing = True
        self._poke()
        self._thread.join(timeout=_SHUTDOWN_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("KV events: publisher thread still busy after %.1f s", _SHUTDOWN_TIMEOUT_S)
            return  # it still owns the sockets; the daemon thread dies with the process
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe has wake-ups enough
            os.write(self._wake_w, b"\0")

    # ---- the publisher thread -----------------------------------------------
    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            self._send_queued()
            if self._replay is not None and self._replay in ready:
                self._serve_replays()
            if self._is_closing and self._queue.empty():
                return

    def _send_queued(self) -> None:
        pub = self._pub
        assert pub is not None
        topic = self.config.topic
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                frames = self._encode(topic, batch)
                pub.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # past the high-water mark: dropped on the wire, kept for replay
            except Exception:  # never let one batch stop the thread
                log.exception("KV events: cannot publish batch %d", batch.sequence)
                continue
            self.num_sent += 1
            self._buffer.append(frames)

    def _serve_replays(self) -> None:
        replay = self._replay
        assert replay is not None
        while True:
            try:
                frames = replay.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            try:
                if len(frames) != 3 or frames[1] != b"":
                    raise KVWireError("expected [b'', start sequence]")
                start = decode_replay_request(frames[2])
            except KVWireError as exc:
                shape = [len(f) for f in frames[:_MAX_REPLAY_FRAMES]]
                log.warning("KV events: invalid replay request (frame sizes %s): %s", shape, exc)
                continue
            self._replay_from(frames[0], start)

    def _replay_from(self, client: bytes, start_sequence: int) -> None:
        replay = self._replay
        assert replay is not None
        try:
            for frames in self._buffer:
                if int.from_bytes(frames[1], "big") >= start_sequence:
                    replay.send_multipart([client, b"", *frames], flags=zmq.NOBLOCK)
            replay.send_multipart([client, b"", *encode_replay_end()], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("KV events: replay client is not reading; its replay was cut")
