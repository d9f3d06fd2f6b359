"""A minimal deterministic discrete-event loop.

Events are ``(time_s, seq_no, fn, a, b)`` in a binary heap; ties in time run
in scheduling order (``seq_no``), which makes runs deterministic. Cancelling
is lazy: owners carry a version in ``a``/``b`` and ignore stale events.
*Background* events (periodic scrapes, samplers) do not keep the loop alive:
it stops when only background events remain. Push and pop are O(log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

EventFn = Callable[[Any, Any], None]


class EventLoop:
    __slots__ = ("_heap", "_num_live", "_seq_no", "now_s", "num_events")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, EventFn, Any, Any, bool]] = []
        self._seq_no = 0
        self._num_live = 0
        self.now_s = 0.0
        self.num_events = 0

    def at(
        self,
        time_s: float,
        fn: EventFn,
        a: Any = None,
        b: Any = None,
        *,
        is_background: bool = False,
    ) -> None:
        """Run ``fn(a, b)`` at ``time_s`` (not before the current time)."""
        if time_s < self.now_s:
            time_s = self.now_s
        heapq.heappush(self._heap, (time_s, self._seq_no, fn, a, b, is_background))
        self._seq_no += 1
        if not is_background:
            self._num_live += 1

    @property
    def next_event_s(self) -> float | None:
        """Time of the earliest pending event (background ones included), or None."""
        return self._heap[0][0] if self._heap else None

    @property
    def has_live_events(self) -> bool:
        """True while some event other than background ones is pending."""
        return self._num_live > 0

    def run(self, until_s: float | None = None) -> None:
        heap = self._heap
        pop = heapq.heappop
        n = 0
        while self._num_live > 0:
            if until_s is not None and heap[0][0] > until_s:
                break
            t, _, fn, a, b, is_background = pop(heap)
            if not is_background:
                self._num_live -= 1
            self.now_s = t
            fn(a, b)
            n += 1
        self.num_events += n
