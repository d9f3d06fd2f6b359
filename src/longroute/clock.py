"""The clock seam: policies get time passed in; these are its two sources."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds on a monotonic timeline (origin is the clock's own)."""
        ...


class SimClock:
    """Simulated time, advanced only by the event loop that owns it."""

    __slots__ = ("_now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance_to(self, t_s: float) -> None:
        if t_s < self._now_s:
            raise ValueError(f"simulated time cannot go back: {t_s} < {self._now_s}")
        self._now_s = t_s


class WallClock:
    """Real monotonic time, for the gateway and the emulator."""

    __slots__ = ("_origin_s",)

    def __init__(self) -> None:
        self._origin_s = time.monotonic()

    def now_s(self) -> float:
        return time.monotonic() - self._origin_s
