"""A request's deadline on the proxy's hot path: ``asyncio.timeout``'s behaviour, cheaper.

``async with asyncio.timeout(...)`` builds a Timeout, runs two coroutines
(``__aenter__``, ``__aexit__``) and reschedules its timer on entry; the proxy
entered one per attempt and one more per stream, some 3-4% of its samples under
load. :class:`Deadline` is one timer per attempt, armed once for the exchange
with the backend and the relay of its stream both (they end at the same
instant, the request's deadline), and :meth:`Deadline.exit` does what
``Timeout.__aexit__`` does: it stops the timer and, when the timer fired, takes
its cancellation back (``Task.uncancel``) and turns the ``CancelledError`` it
caused into a ``TimeoutError``. A cancellation from elsewhere (the client left,
the drain's deadline) stays a cancellation, as with ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio


class Deadline:
    """Cancels the current task ``delay_s`` from now, unless :meth:`exit` comes first.

    Use: ``deadline = Deadline(delay_s)``; the guarded code in ``try``; every way out
    of it calls :meth:`exit` once, with the exception that ended it (None: none), and
    raises the TimeoutError it returns, if any, from that exception.
    """

    __slots__ = ("_cancelling", "_handle", "_task", "is_expired")

    def __init__(self, delay_s: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self.is_expired = False
        self._handle: asyncio.TimerHandle | None = task.get_loop().call_later(delay_s, self._expire)

    def _expire(self) -> None:
        self._handle = None
        self.is_expired = True
        self._task.cancel()

    def exit(self, exc: BaseException | None) -> TimeoutError | None:
        """Stops the timer (idempotent). A TimeoutError to raise (from ``exc``) when the
        timer fired and ``exc`` is the cancellation it caused; else None."""
        handle = self._handle
        if handle is not None:
            self._handle = None
            handle.cancel()
        if not self.is_expired:
            return None
        self.is_expired = False
        if self._task.uncancel() <= self._cancelling and isinstance(exc, asyncio.CancelledError):
            return TimeoutError()
        return None


__all__ = ["Deadline"]
