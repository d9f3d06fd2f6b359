"""Fault injection: which requests fail, hang or lose their connection mid-stream.

Each kind of fault draws from its own RNG, seeded from the emulator's seed
and the kind's name, once per request in arrival order: the n-th request's
fate depends only on the seed and n, and changing one rate leaves the other
kinds' decisions unchanged. :func:`hang_until_gone` and :func:`cut_connection`
are how the server carries out a hang and a crash.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from aiohttp import web

HANG_CHECK_INTERVAL_S = 0.25


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to do to one request. ``crash_after_tokens`` is None when the stream lives."""

    is_error: bool = False
    is_hang: bool = False
    crash_after_tokens: int | None = None


NO_FAULT = FaultPlan()


class FaultInjector:
    """Decides a FaultPlan per request; called by the handler once, at arrival. O(1)."""

    __slots__ = ("_crash_rng", "_error_rng", "_hang_rng", "crash_after_tokens", "crash_rate",
                 "error_rate", "hang_rate")  # fmt: skip

    def __init__(
        self,
        *,
        error_rate: float,
        hang_rate: float,
        crash_rate: float,
        crash_after_tokens: int | None,
        seed: int,
    ) -> None:
        self.error_rate = error_rate
        self.hang_rate = hang_rate
        self.crash_rate = crash_rate
        self.crash_after_tokens = crash_after_tokens
        # str seeds are hashed with SHA-512 by random.Random: stable across processes
        self._error_rng = random.Random(f"{seed}:error")
        self._hang_rng = random.Random(f"{seed}:hang")
        self._crash_rng = random.Random(f"{seed}:crash")

    @property
    def is_active(self) -> bool:
        return self.error_rate > 0.0 or self.hang_rate > 0.0 or self.crash_rate > 0.0

    def next_plan(self) -> FaultPlan:
        if not self.is_active:
            return NO_FAULT
        # every RNG draws for every request, so each kind's sequence is independent
        is_error = self._error_rng.random() < self.error_rate
        is_hang = self._hang_rng.random() < self.hang_rate
        is_crash = self._crash_rng.random() < self.crash_rate
        if is_error:
            return FaultPlan(is_error=True)
        if is_hang:
            return FaultPlan(is_hang=True)
        if is_crash:
            return FaultPlan(crash_after_tokens=self.crash_after_tokens)
        return NO_FAULT


def cut_connection(request: web.Request) -> None:
    """Crash mid-stream: drop the TCP connection without finishing the response."""
    transport = request.transport
    if transport is not None:
        transport.abort()


async def hang_until_gone(request: web.Request) -> web.StreamResponse:
    """Never answer; return once the client has gone (or be cancelled with it)."""
    while True:
        await asyncio.sleep(HANG_CHECK_INTERVAL_S)
        transport = request.transport
        if transport is None or transport.is_closing():
            return web.Response(status=499)
