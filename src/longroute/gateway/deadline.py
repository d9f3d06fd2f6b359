"""A request's deadline on the proxy's hot path: ``asyncio.timeout``'s behaviour, cheaper.

``async with asyncio.timeout(...)`` builds a Timeout, runs two coroutines
(``__aenter__``, ``__aexit__``) and reschedules its timer on entry; the proxy
entered one per attempt and one more per stream, some 3-4% of its samples under
load. :class:`Deadline` is one deadline per attempt, armed once for the exchange
with the backend and the relay of its stream both (they end at the same
instant, the request's deadline), and :meth:`Deadline.exit` does what
``Timeout.__aexit__`` does: it disarms the deadline and, when it fired, takes
its cancellation back (``Task.uncancel``) and turns the ``CancelledError`` it
caused into a ``TimeoutError``. A cancellation from elsewhere (the client left,
the drain's deadline) stays a cancellation, as with ``asyncio.timeout``.

The deadlines of an event loop share ONE loop timer (:class:`_DeadlineHeap`): a
loop timer (``call_later`` and its ``cancel``) cost about 1.5 us per attempt
under uvloop, a heap push and a flag about a quarter of that. The timer is armed
for the earliest deadline in the heap and fires at its instant, so every deadline
still fires at its own time (within the clock's millisecond), as its own timer would have.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

# below this many entries the heap is not compacted (exited deadlines wait to be popped)
_MIN_COMPACT_ENTRIES = 64
# a deadline this close is due when the timer fires: uvloop's clock and timers count whole
# milliseconds and fire up to one early, as its own per-deadline timers did; waiting for
# the exact instant would re-arm and spin the loop (~170 turns) until the clock caught up
_EARLY_S = 0.001


class Deadline:
    """Cancels the current task ``delay_s`` from now, unless :meth:`exit` comes first.

    Use: ``deadline = Deadline(delay_s)``; the guarded code in ``try``; every way out
    of it calls :meth:`exit` once, with the exception that ended it (None: none), and
    raises the TimeoutError it returns, if any, from that exception. ``loop``: the running
    loop when the caller knows it (the current task is then found without
    ``get_running_loop``, which on Python 3.11 costs a ``getpid`` system call).
    """

    __slots__ = ("_cancelling", "_heap", "_task", "is_armed", "is_expired")

    def __init__(self, delay_s: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self.is_expired = False
        self.is_armed = True
        global _last_heap
        heap = _last_heap
        if loop is None:
            loop = task.get_loop()
        if heap is None or heap.loop is not loop:
            heap = _last_heap = _DeadlineHeap(loop)
        self._heap = heap
        heap.push(self, delay_s)

    def _expire(self) -> None:
        """Called by the heap at the deadline (only while armed)."""
        self.is_armed = False
        self.is_expired = True
        self._task.cancel()

    def exit(self, exc: BaseException | None) -> TimeoutError | None:
        """Disarms the deadline (idempotent). A TimeoutError to raise (from ``exc``) when it
        fired and ``exc`` is the cancellation it caused; else None."""
        if self.is_armed:
            self.is_armed = False
            self._heap.num_armed -= 1
        if not self.is_expired:
            return None
        self.is_expired = False
        if self._task.uncancel() <= self._cancelling and isinstance(exc, asyncio.CancelledError):
            return TimeoutError()
        return None


class _DeadlineHeap:
    """The armed deadlines of one loop, earliest first, behind one loop timer.

    A binary heap of ``(when_s, seq, deadline)``: a push is O(log n); an exited
    deadline stays until it reaches the top or the heap is compacted, which happens
    when exited entries outnumber armed ones (O(n), so O(1) amortised per push).
    The heap holds O(armed deadlines) entries. The timer is re-armed only when it
    fires or a deadline earlier than its instant arrives.
    """

    __slots__ = ("_entries", "_handle", "_seq", "_timer_s", "loop", "num_armed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.num_armed = 0
        self._entries: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._timer_s = 0.0  # the instant the timer is armed for (when _handle is set)

    def push(self, deadline: Deadline, delay_s: float) -> None:
        when_s = self.loop.time() + delay_s
        entries = self._entries
        self.num_armed += 1
        if len(entries) >= _MIN_COMPACT_ENTRIES and len(entries) > 2 * self.num_armed:
            entries[:] = [entry for entry in entries if entry[2].is_armed]
            heapq.heapify(entries)
        heapq.heappush(entries, (when_s, next(self._seq), deadline))
        if self._handle is None or when_s < self._timer_s:
            self._arm(when_s)

    def _arm(self, when_s: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._timer_s = when_s
        self._handle = self.loop.call_at(when_s, self._fire)

    def _fire(self) -> None:
        """The timer's instant: expires every armed deadline due, drops exited ones from
        the top, and re-arms for the earliest armed deadline left."""
        self._handle = None
        entries = self._entries
        due_s = self.loop.time() + _EARLY_S
        while entries:
            when_s, _, deadline = entries[0]
            if deadline.is_armed:
                if when_s > due_s:
                    self._arm(when_s)
                    return
                self.num_armed -= 1
                deadline._expire()
            heapq.heappop(entries)


# the heap of the loop that armed the last deadline: a process serves on one loop; one that
# runs another makes that loop a heap of its own (a heap lives while its loop's timer or one
# of its deadlines refers to it)
_last_heap: _DeadlineHeap | None = None


__all__ = ["Deadline"]
