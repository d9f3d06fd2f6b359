"""The emulated network: a round trip that is fixed, follows a schedule, or is set live.

The round trip in force at emulated time ``t`` (seconds since the emulator
started) is, by precedence:

1. the last value set through the admin call (``POST /admin/network-delay``,
   :meth:`NetworkDelay.set_delay_ms`): once set, it holds until the next such
   call and the schedule no longer applies;
2. else the delay of the last schedule step whose ``at_s <= t``;
3. else (no schedule, or before its first step) the fixed ``network_delay_ms``.

The server reads it once per half trip (a request arriving, a response
leaving), so a request that straddles a change pays part of each delay.
Durations are emulated: on the wall clock they are divided by ``speed``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

MAX_SCHEDULE_STEPS = 10_000
MAX_DELAY_MS = 600_000.0  # ten emulated minutes: beyond any region, below any overflow

DelaySchedule = tuple[tuple[float, float], ...]
"""``(at_s, delay_ms)`` steps, ``at_s`` strictly increasing."""


def check_delay_ms(name: str, value: object) -> float:
    """``value`` as a delay in ms: a real number, finite, in [0, MAX_DELAY_MS]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of milliseconds, got {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= MAX_DELAY_MS):
        raise ValueError(f"{name} must be a finite number in [0, {MAX_DELAY_MS:g}] ms, got {value}")
    return float(value)


def check_schedule(name: str, steps: Sequence[Sequence[object]]) -> DelaySchedule:
    """The steps as a :data:`DelaySchedule`; ValueError naming ``name`` and the bad step."""
    if len(steps) > MAX_SCHEDULE_STEPS:
        raise ValueError(f"{name} has {len(steps)} steps; at most {MAX_SCHEDULE_STEPS}")
    checked: list[tuple[float, float]] = []
    for i, step in enumerate(steps, start=1):
        if len(step) != 2:
            raise ValueError(f"{name} step {i} must be (at_s, delay_ms), got {step!r}")
        at_s, delay = step
        if isinstance(at_s, bool) or not isinstance(at_s, int | float):
            raise ValueError(f"{name} step {i}: the time must be a number of seconds, got {at_s!r}")
        if not (math.isfinite(at_s) and at_s >= 0.0):
            raise ValueError(f"{name} step {i}: the time must be finite and >= 0 s, got {at_s}")
        if checked and at_s <= checked[-1][0]:
            raise ValueError(
                f"{name} step {i}: times must increase, got {at_s:g} s after {checked[-1][0]:g} s"
            )
        checked.append((float(at_s), check_delay_ms(f"{name} step {i}: the delay", delay)))
    return tuple(checked)


def parse_schedule(text: str, name: str = "--network-delay-schedule") -> DelaySchedule:
    """``"AT_S:DELAY_MS,..."`` (e.g. ``"0:40,30:400,60:40"``) as a checked schedule."""
    items = text.split(",")
    if len(items) > MAX_SCHEDULE_STEPS:
        raise ValueError(f"{name} has {len(items)} steps; at most {MAX_SCHEDULE_STEPS}")
    steps: list[tuple[float, float]] = []
    for i, item in enumerate(items, start=1):
        at_text, sep, delay_text = item.partition(":")
        try:
            if not sep:
                raise ValueError
            steps.append((float(at_text), float(delay_text)))
        except ValueError:
            raise ValueError(
                f"{name} step {i} is {item.strip()!r}; want AT_S:DELAY_MS, "
                "e.g. 0:40,30:400,60:40 (emulated seconds since start : emulated ms)"
            ) from None
    return check_schedule(name, steps)


class NetworkDelay:
    """The round trip in force (emulated ms); see the module's precedence.

    ``now_s`` returns emulated seconds since the emulator started (the engine
    driver's clock; tests pass their own). Reads are O(log steps).
    """

    __slots__ = ("_delays", "_now_s", "_override_ms", "_times", "base_ms", "speed")

    def __init__(
        self,
        base_ms: float,
        schedule: DelaySchedule,
        *,
        speed: float,
        now_s: Callable[[], float],
    ) -> None:
        self.base_ms = base_ms
        self.speed = speed
        self._times = [at_s for at_s, _ in schedule]
        self._delays = [delay_ms for _, delay_ms in schedule]
        self._now_s = now_s
        self._override_ms: float | None = None

    @property
    def source(self) -> str:
        """Where the delay in force comes from: ``admin``, ``schedule`` or ``fixed``."""
        if self._override_ms is not None:
            return "admin"
        if self._times and self._now_s() >= self._times[0]:
            return "schedule"
        return "fixed"

    def delay_ms(self) -> float:
        """The round trip in force now, emulated ms."""
        if self._override_ms is not None:
            return self._override_ms
        if not self._times:
            return self.base_ms
        i = bisect_right(self._times, self._now_s())
        return self._delays[i - 1] if i else self.base_ms

    def half_trip_wall_s(self) -> float:
        """Half the round trip in force, in wall seconds (one way: in or out)."""
        return self.delay_ms() / 2000.0 / self.speed

    def set_delay_ms(self, delay_ms: float) -> None:
        """Override the fixed delay and the schedule from now on (checked as the admin's)."""
        self._override_ms = check_delay_ms("delay_ms", delay_ms)
