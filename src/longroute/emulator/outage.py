"""A region that is down: every request but the admin call loses its connection.

While :meth:`~longroute.emulator.network.NetworkDelay.is_down`, a request on
any path but the exempt ones (the admin call's, with ``--admin``) has its
connection aborted as soon as its head has been read: no status line, no
byte, and the client sees its connection reset (aiohttp's client raises
``ServerDisconnectedError``; a gateway sees a backend that broke off before
answering). The listening socket stays open, since the admin call needs it,
so a TCP connect still succeeds: what fails is every request sent on it.

When the region goes down (an admin call, or a ``down`` step of the schedule
coming due) every request in flight is cut at once, streamed or not, whether
it waits for the engine, is being generated or is streaming tokens; its
handler is cancelled with its connection and its engine work aborted. A
kept-alive connection that is idle then is cut at its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection

from aiohttp import web

from longroute.emulator.faults import cut_connection
from longroute.emulator.network import NetworkDelay

_PAST_STEP_S = 0.001
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Outage:
    """Carries out the down state of ``network`` on one app; see the module doc.

    ``wall_of(emulated_s)`` is the monotonic time of an emulated instant (the
    engine driver's), for the schedule's ``down`` steps. O(1) per request;
    going down is O(requests in flight).
    """

    def __init__(
        self,
        network: NetworkDelay,
        wall_of: Callable[[float], float],
        exempt_paths: Collection[str] = (),
    ) -> None:
        self.network = network
        self.wall_of = wall_of
        self.exempt_paths = frozenset(exempt_paths)
        self.num_cut = 0
        """Requests cut so far, on arrival or in flight."""
        self._in_flight: dict[int, web.Request] = {}  # by id: a request is not hashable
        self._watcher: asyncio.Task[None] | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Cuts a request that arrives while down; tracks the others until they finish."""
        if request.path in self.exempt_paths:
            return await handler(request)
        if self.network.is_down():
            self._cut(request)
            return web.Response(status=503)  # never sent: the connection is gone
        key = id(request)
        self._in_flight[key] = request
        try:
            return await handler(request)
        finally:
            del self._in_flight[key]

    def cut_if_down(self) -> None:
        """If the region is down, cut every request in flight (called on every change)."""
        if self.network.is_down():
            for request in list(self._in_flight.values()):
                self._cut(request)

    def _cut(self, request: web.Request) -> None:
        self.num_cut += 1
        cut_connection(request)

    # ---- the schedule's down steps ----------------------------------------------
    async def on_startup(self, _: web.Application) -> None:
        """Watch the schedule's ``down`` steps (after the driver started: its clock)."""
        if self.network.down_times_s():
            self._watcher = asyncio.create_task(self._watch_schedule())

    async def on_cleanup(self, _: web.Application) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def _watch_schedule(self) -> None:
        for at_s in self.network.down_times_s():
            # a hair past the step, so that the emulated clock has surely reached it
            due_s = self.wall_of(at_s) + _PAST_STEP_S
            while (wait_s := due_s - time.monotonic()) > 0.0:
                await asyncio.sleep(wait_s)
            self.cut_if_down()  # unless the admin call brought the region up meanwhile


def install_outage(app: web.Application, outage: Outage) -> None:
    """Outermost middleware (before any other), and the schedule watcher's lifecycle."""
    app.middlewares.insert(0, outage.middleware)
    app.on_startup.append(outage.on_startup)
    app.on_cleanup.append(outage.on_cleanup)
