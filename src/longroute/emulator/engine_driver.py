"""Runs the simulator's engine model in real time and streams its tokens.

The driver owns one discrete-event loop and one ``EngineModel``. Emulated
time is ``(monotonic wall time - start) * speed``. The driver is
event-driven: after every advance it arms one asyncio timer for the wall
time of the engine's next event; a submission advances the loop to *now*
first (so the engine state is current), submits, and re-arms. Nothing polls,
so an idle emulator uses no CPU. Timers are spaced at least
``min_wake_interval_s`` of wall time apart: at high speed factors many
engine iterations fall into one wake-up instead of one wake-up each (at
speed 1, decode steps last milliseconds and the floor never binds).

The engine runs without fast-forward (every decode iteration is an event),
so a token's time is the end of the iteration that produced it, and a
streaming client sees the model's decode step times. Progress of a decoding
sequence is implicit in the engine's decode group (``base_generated + step -
base_step``); after each advance the driver publishes every running
stream's new token count with the wall time of the engine's clock.

The engine's queue policy and batch packer (``EnginePolicies``: FCFS and the
token budget by default, or Medha's EDF/LRS/LARS and time budget) are built by
:class:`~longroute.sim.engine_policies.PolicyBuilder`, as the simulator builds
them, so the same policies run in real time. Requests carry no SLO: the slack
policies give each the default deadline of :mod:`longroute.queueing.slack`.

A request whose client goes away is aborted: its seat and KV memory are
freed at once, as vLLM does.

With a ``kv_event_sink`` the engine's prefix cache reports every block it
stores, evicts or clears to a :class:`~longroute.emulator.kv_capture.KvEventCapture`,
which hands vLLM-style batches (one per engine iteration) to the sink; the
driver registers each request's token ids with it while the request is in the
engine and flushes it after every advance, submission and abort.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence as Seq
from typing import Protocol

from longroute.emulator.kv_capture import BatchSink, KvEventCapture
from longroute.estimators.runtime import RuntimePredictor
from longroute.sim.engine import EngineModel
from longroute.sim.engine_policies import EnginePolicies, PolicyBuilder
from longroute.sim.events import EventLoop
from longroute.sim.sequence import Sequence
from longroute.types import Endpoint, Request

DEFAULT_MIN_WAKE_INTERVAL_S = 0.001


class TokenStream:
    """Token progress of one request: written by the driver, read by one handler.

    ``updates`` receives ``(wall_time_s, num_tokens)`` each time the count
    grows; the last update has ``num_tokens == num_output_tokens``.
    ``finish_reason`` is OpenAI's: "length" when the request's token limit
    ends the reply, "stop" when the emulator chose the length.
    """

    __slots__ = ("finish_reason", "num_output_tokens", "num_published", "request", "seq",
                 "updates")  # fmt: skip

    def __init__(self, request: Request, finish_reason: str) -> None:
        self.request = request
        self.finish_reason = finish_reason
        self.num_output_tokens = request.num_output_tokens
        self.num_published = 0
        self.seq: Sequence | None = None
        self.updates: asyncio.Queue[tuple[float, int]] = asyncio.Queue()

    def publish(self, wall_s: float, num_tokens: int) -> None:
        self.num_published = num_tokens
        self.updates.put_nowait((wall_s, num_tokens))

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (0 before admission)."""
        seq = self.seq
        return 0 if seq is None or seq.num_cached_tokens is None else seq.num_cached_tokens


class EngineObserver(Protocol):
    """Told about engine milestones (metrics); called inside the driver's advance."""

    def on_first_token(self, seq: Sequence, ttft_s: float) -> None: ...

    def on_finish(self, seq: Sequence, e2e_s: float, finish_reason: str) -> None: ...


class EngineDriver:
    """One emulated engine replica advanced in real time on the running asyncio loop."""

    def __init__(
        self,
        endpoint: Endpoint,
        predictor: RuntimePredictor,
        *,
        speed: float,
        prefix_block_tokens: int,
        observer: EngineObserver | None = None,
        min_wake_interval_s: float = DEFAULT_MIN_WAKE_INTERVAL_S,
        policies: EnginePolicies | None = None,
        kv_event_sink: BatchSink | None = None,
    ) -> None:
        self.loop = EventLoop()
        # the simulator's builder: the same queue policy and batch packer as a scenario's
        builder = PolicyBuilder(policies if policies is not None else EnginePolicies())
        queue, packer = builder.build(endpoint, predictor)
        self.engine = EngineModel(
            endpoint,
            predictor,
            self.loop,
            self,
            queue=queue,
            packer=packer,
            prefix_block_tokens=prefix_block_tokens,
            is_fast_forward=False,
        )
        self.speed = speed
        self.observer = observer
        self.min_wake_interval_s = min_wake_interval_s
        self._start_wall_s = time.monotonic()
        self._running: dict[TokenStream, None] = {}  # past their first token
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due_s: float | None = None  # emulated time the timer was armed for
        self._last_wake_wall_s = 0.0
        self._epoch_offset_s = time.time() - time.monotonic()
        self.kv_events: KvEventCapture | None = None
        if kv_event_sink is not None:
            self.kv_events = KvEventCapture(
                prefix_block_tokens,
                kv_event_sink,
                iteration_of=lambda: self.engine.num_iterations,
                ts_of=lambda: self._epoch_offset_s + self.wall_of(self.loop.now_s),
            )
            self.engine.kv.cache.observer = self.kv_events

    # ---- clock ----------------------------------------------------------
    def start(self) -> None:
        """Emulated time 0 is now. Called once, on the serving loop, before requests."""
        self._start_wall_s = time.monotonic()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def now_s(self) -> float:
        """Current emulated time, never behind the engine's clock."""
        now_s = (time.monotonic() - self._start_wall_s) * self.speed
        return now_s if now_s > self.loop.now_s else self.loop.now_s

    def wall_of(self, emulated_s: float) -> float:
        """The monotonic wall time at which emulated time ``emulated_s`` happens."""
        return self._start_wall_s + emulated_s / self.speed

    # ---- requests -------------------------------------------------------
    def submit(self, request: Request, finish_reason: str, token_ids: Seq[int] = ()) -> TokenStream:
        """Hand a request to the engine at the current emulated time.

        ``token_ids`` are the prompt's (the KV events' ``BlockStored`` carries them).
        """
        self.advance()
        stream = TokenStream(request, finish_reason)
        kv_events = self.kv_events
        if kv_events is not None:
            kv_events.register(request.block_hashes, token_ids)
        stream.seq = self.engine.submit(request, self.now_s(), stream)
        if kv_events is not None:
            kv_events.flush()
        self._arm()
        return stream

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block, as vLLM's ``/reset_prefix_cache`` (no-op while in use)."""
        self.advance()
        is_reset = self.engine.kv.cache.clear()
        if self.kv_events is not None:
            self.kv_events.flush()
        return is_reset

    def abort(self, stream: TokenStream) -> bool:
        """The client went away: free the request's seat and KV memory, as vLLM does.

        A no-op once the stream has all its tokens (the sequence finished);
        returns whether unfinished work was stopped.
        """
        seq = stream.seq
        if seq is None or stream.num_published >= stream.num_output_tokens:
            return False
        self.advance()
        if stream.num_published >= stream.num_output_tokens:
            return False  # it finished just now
        if self.engine.abort(seq, self.now_s()):
            self._running.pop(stream, None)
        kv_events = self.kv_events
        if kv_events is not None:
            kv_events.unregister(seq.hashes)
            kv_events.flush()
        self._arm()
        return True

    def advance(self) -> None:
        """Run the engine up to now and publish new tokens (also before /metrics reads)."""
        self._advance_to(self.now_s())

    # ---- engine listener (called inside loop.run) -------------------------
    def on_first_token(self, seq: Sequence, t_s: float) -> None:
        stream = seq.tag
        assert isinstance(stream, TokenStream)
        self._running[stream] = None
        stream.publish(self.wall_of(t_s), seq.num_generated)
        if self.observer is not None:
            self.observer.on_first_token(seq, (t_s - seq.arrival_s) / self.speed)

    def on_finish(self, seq: Sequence, t_s: float) -> None:
        stream = seq.tag
        assert isinstance(stream, TokenStream)
        self._running.pop(stream, None)
        if self.kv_events is not None:
            self.kv_events.unregister(seq.hashes)
        if seq.num_generated > stream.num_published:
            stream.publish(self.wall_of(t_s), seq.num_generated)
        if self.observer is not None:
            e2e_s = (t_s - seq.arrival_s) / self.speed
            self.observer.on_finish(seq, e2e_s, stream.finish_reason)

    # ---- internals --------------------------------------------------------
    def _advance_to(self, until_s: float) -> None:
        loop = self.loop
        num_before = loop.num_events
        loop.run(until_s=until_s)
        if loop.num_events != num_before and self._running:
            self._publish_decoding()
        if self.kv_events is not None:
            self.kv_events.flush()

    def _publish_decoding(self) -> None:
        decoding = self.engine.decoding
        members = decoding.members
        step = decoding.step
        wall_s = self.wall_of(self.loop.now_s)
        for stream in self._running:
            seq = stream.seq
            assert seq is not None
            # outside the decode group (prefilling again after a preemption) progress is frozen
            n = seq.base_generated + step - seq.base_step if seq in members else seq.num_generated
            if n > stream.num_published:
                stream.publish(wall_s, n)

    def _arm(self) -> None:
        due_s = self.loop.next_event_s  # the engine schedules no background events
        if due_s is None:
            self.close()
            return
        if self._timer is not None:
            if self._timer_due_s == due_s:
                return
            self._timer.cancel()
        now_wall_s = time.monotonic()
        delay_s = max(
            self.wall_of(due_s) - now_wall_s,
            self._last_wake_wall_s + self.min_wake_interval_s - now_wall_s,
            0.0,
        )
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)
        self._timer_due_s = due_s

    def _on_timer(self) -> None:
        due_s = self._timer_due_s
        self._timer = None
        self._timer_due_s = None
        self._last_wake_wall_s = time.monotonic()
        now_s = self.now_s()
        # a timer may fire up to a clock tick early (uvloop counts milliseconds):
        # take it as having reached the event it was armed for
        self._advance_to(now_s if due_s is None or now_s > due_s else due_s)
        self._arm()
