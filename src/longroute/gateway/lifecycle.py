"""The gateway's graceful drain: SIGTERM or SIGINT lets every request finish.

:meth:`Drain.run` stops the listener at once (new connections are refused),
makes ``/ready`` answer 503 and every new request on a kept-alive connection a
503 with ``Retry-After`` and ``Connection: close`` (the gateway's dispatch
reads :attr:`Drain.is_draining`), then waits for every request in flight or
queued at the gateway, up to the drain timeout. At the deadline, or when
:meth:`Drain.cut_now` is called (a second signal), each remaining handler is
cancelled and marked *cut*: the completion handler sees the mark
(:meth:`Drain.is_cut`) and ends its request itself, a stream with a
``server_shutdown`` error event and ``[DONE]``, any other request with a 503,
while the cancellation closes its backend connection so the engine aborts the
sequence. Nothing here is on the request path: the handler pays one set lookup,
and only when it is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from longroute.gateway.errors import shutdown_event
from longroute.gateway.http.server import HttpServer
from longroute.gateway.http.stream import ResponseStream

log = logging.getLogger("longroute.gateway")

# how long a cut request may take to write its ending to a client that does not read
CUT_WRITE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain did; also logged when it ends."""

    num_inflight: int  # requests running, queued or pipelined when it began
    num_cut: int  # ended at the deadline (or on a second signal)
    num_refused: int  # new requests answered 503 while it ran
    seconds: float


class Drain:
    """One gateway's drain state; :meth:`run` once, at shutdown."""

    def __init__(self) -> None:
        self.is_draining = False
        self.num_refused = 0
        self._cut: set[asyncio.Task[None]] = set()
        self._cut_now = asyncio.Event()

    def is_cut(self, task: asyncio.Task[object] | None) -> bool:
        """True if ``task`` was cancelled by the drain (not by its client leaving)."""
        return task in self._cut

    def cut_now(self) -> None:
        """End the drain's wait now: the remaining requests are cut (a second signal)."""
        self._cut_now.set()

    async def run(self, server: HttpServer, timeout_s: float) -> DrainReport:
        """Drains ``server`` (see the module doc); returns when no handler runs any more."""
        started_s = time.monotonic()
        self.is_draining = True
        server.stop_accepting()
        num_inflight = len(server.handler_tasks()) + server.num_pending_requests
        log.info(
            "draining: %d request(s) in flight or queued; new connections refused; "
            "the rest is cut after %g s (or on a second signal)",
            num_inflight,
            timeout_s,
        )
        if not await self._wait_for_handlers(server, started_s + timeout_s):
            await self._cut_all(server)
        report = DrainReport(
            num_inflight, len(self._cut), self.num_refused, time.monotonic() - started_s
        )
        log.info(
            "drained in %.1f s: %d request(s) were in flight, %d cut at the deadline, "
            "%d new request(s) refused",
            report.seconds,
            report.num_inflight,
            report.num_cut,
            report.num_refused,
        )
        return report

    async def _wait_for_handlers(self, server: HttpServer, deadline_s: float) -> bool:
        """True once no handler runs; False at the deadline or on :meth:`cut_now`."""
        signal = asyncio.ensure_future(self._cut_now.wait())
        try:
            while tasks := server.handler_tasks():
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0.0 or self._cut_now.is_set():
                    return False
                await asyncio.wait(
                    [*tasks, signal], timeout=remaining_s, return_when=asyncio.FIRST_COMPLETED
                )
            return True
        finally:
            signal.cancel()

    async def _cut_all(self, server: HttpServer) -> None:
        """Cancels every running handler, marked cut, and gives them a moment to write
        their endings; those still writing then are aborted with their connections."""
        tasks = server.handler_tasks()
        for task in tasks:
            self._cut.add(task)
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CUT_WRITE_GRACE_S + 0.5)


async def end_cut_stream(stream: ResponseStream) -> None:
    """Ends a stream the drain cut: its error event and ``[DONE]``, or, for a client that
    does not read them within CUT_WRITE_GRACE_S, a closed connection."""
    if stream.is_ended or stream.is_closed:
        return
    try:
        async with asyncio.timeout(CUT_WRITE_GRACE_S):
            await stream.write(b"\n\n" + shutdown_event())
            await stream.end()
    except (TimeoutError, ConnectionResetError):
        stream.abort()


__all__ = ["CUT_WRITE_GRACE_S", "Drain", "DrainReport", "end_cut_stream"]
