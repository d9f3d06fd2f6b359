"""The emulated network: a round trip that is fixed, follows a schedule, or is set live,
and a region that is up or down.

The round trip in force at emulated time ``t`` (seconds since the emulator
started) is, by precedence:

1. the last value set through the admin call (``POST /admin/network-delay``,
   :meth:`NetworkDelay.set_delay_ms`): once set, it holds until the next such
   call and the schedule no longer applies;
2. else the delay of the last schedule step with a delay whose ``at_s <= t``
   (a ``down`` step leaves the delay as it was);
3. else (no schedule, or before its first delay step) the fixed ``network_delay_ms``.

Whether the region is down is decided apart from the delay, the same way: the
last ``down`` set through the admin call (:meth:`NetworkDelay.set_down`) holds
from then on, over the schedule; else the region is down from a ``down`` step
until the next step with a delay; else it is up. While it is down nothing but
the admin call answers (:mod:`longroute.emulator.outage`), whatever the delay;
the delay in force is kept (and may still be set) and applies again once up.

The server reads the delay once per half trip (a request arriving, a response
leaving), so a request that straddles a change pays part of each delay.
Durations are emulated: on the wall clock they are divided by ``speed``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Literal

MAX_SCHEDULE_STEPS = 10_000
MAX_DELAY_MS = 600_000.0  # ten emulated minutes: beyond any region, below any overflow

DOWN: Literal["down"] = "down"
"""A schedule step's value for "the region cannot be reached from here on"."""

DelaySchedule = tuple[tuple[float, float | Literal["down"]], ...]
"""``(at_s, delay_ms or DOWN)`` steps, ``at_s`` strictly increasing."""


def check_delay_ms(name: str, value: object) -> float:
    """``value`` as a delay in ms: a real number, finite, in [0, MAX_DELAY_MS]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of milliseconds, got {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= MAX_DELAY_MS):
        raise ValueError(f"{name} must be a finite number in [0, {MAX_DELAY_MS:g}] ms, got {value}")
    return float(value)


def check_down(name: str, value: object) -> bool:
    """``value`` as a down flag: exactly True or False (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_schedule(name: str, steps: Sequence[Sequence[object]]) -> DelaySchedule:
    """The steps as a :data:`DelaySchedule`; ValueError naming ``name`` and the bad step."""
    if len(steps) > MAX_SCHEDULE_STEPS:
        raise ValueError(f"{name} has {len(steps)} steps; at most {MAX_SCHEDULE_STEPS}")
    checked: list[tuple[float, float | Literal["down"]]] = []
    for i, step in enumerate(steps, start=1):
        if len(step) != 2:
            raise ValueError(
                f"{name} step {i} must be (at_s, delay_ms) or (at_s, 'down'), got {step!r}"
            )
        at_s, delay = step
        if isinstance(at_s, bool) or not isinstance(at_s, int | float):
            raise ValueError(f"{name} step {i}: the time must be a number of seconds, got {at_s!r}")
        if not (math.isfinite(at_s) and at_s >= 0.0):
            raise ValueError(f"{name} step {i}: the time must be finite and >= 0 s, got {at_s}")
        if checked and at_s <= checked[-1][0]:
            raise ValueError(
                f"{name} step {i}: times must increase, got {at_s:g} s after {checked[-1][0]:g} s"
            )
        if isinstance(delay, str):
            if delay != DOWN:
                raise ValueError(
                    f"{name} step {i}: the delay must be a number of milliseconds or "
                    f"{DOWN!r}, got {delay!r}"
                )
            checked.append((float(at_s), DOWN))
            continue
        checked.append((float(at_s), check_delay_ms(f"{name} step {i}: the delay", delay)))
    return tuple(checked)


def parse_schedule(text: str, name: str = "--network-delay-schedule") -> DelaySchedule:
    """``"AT_S:DELAY_MS,..."`` (e.g. ``"0:40,30:400,60:40"``; ``AT_S:down`` for a step
    that takes the region down) as a checked schedule."""
    items = text.split(",")
    if len(items) > MAX_SCHEDULE_STEPS:
        raise ValueError(f"{name} has {len(items)} steps; at most {MAX_SCHEDULE_STEPS}")
    steps: list[tuple[float, float | Literal["down"]]] = []
    for i, item in enumerate(items, start=1):
        at_text, sep, delay_text = item.partition(":")
        try:
            if not sep:
                raise ValueError
            is_down = delay_text.strip() == DOWN
            steps.append((float(at_text), DOWN if is_down else float(delay_text)))
        except ValueError:
            raise ValueError(
                f"{name} step {i} is {item.strip()!r}; want AT_S:DELAY_MS or AT_S:down, "
                "e.g. 0:40,30:down,60:40 (emulated seconds since start : emulated ms)"
            ) from None
    return check_schedule(name, steps)


class NetworkDelay:
    """The round trip in force (emulated ms) and whether the region is down; see the
    module's precedence.

    ``now_s`` returns emulated seconds since the emulator started (the engine
    driver's clock; tests pass their own). Reads are O(log steps).
    """

    __slots__ = ("_delays", "_downs", "_now_s", "_override_down", "_override_ms", "_times",
                 "base_ms", "speed")  # fmt: skip

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
        # per step: the delay in force from it on (None: no delay step yet) and whether down
        self._delays: list[float | None] = []
        self._downs: list[bool] = []
        delay_ms: float | None = None
        for _, value in schedule:
            is_down = isinstance(value, str)  # DOWN, the only string a checked step holds
            if not is_down:
                delay_ms = float(value)
            self._delays.append(delay_ms)
            self._downs.append(is_down)
        self._now_s = now_s
        self._override_ms: float | None = None
        self._override_down: bool | None = None

    def _step(self) -> int:
        """How many schedule steps have passed (0: none, or no schedule)."""
        return bisect_right(self._times, self._now_s()) if self._times else 0

    @property
    def source(self) -> str:
        """Where the delay in force comes from: ``admin``, ``schedule`` or ``fixed``."""
        if self._override_ms is not None:
            return "admin"
        i = self._step()
        return "schedule" if i and self._delays[i - 1] is not None else "fixed"

    @property
    def down_source(self) -> str:
        """Who decides whether the region is down: ``admin`` (once set) or ``schedule``."""
        return "schedule" if self._override_down is None else "admin"

    def delay_ms(self) -> float:
        """The round trip in force now, emulated ms."""
        if self._override_ms is not None:
            return self._override_ms
        i = self._step()
        scheduled_ms = self._delays[i - 1] if i else None
        return self.base_ms if scheduled_ms is None else scheduled_ms

    def is_down(self) -> bool:
        """True while the region cannot be reached (only the admin call answers)."""
        if self._override_down is not None:
            return self._override_down
        i = self._step()
        return self._downs[i - 1] if i else False

    def down_times_s(self) -> list[float]:
        """Emulated times of the schedule's ``down`` steps, in order."""
        return [at_s for at_s, is_down in zip(self._times, self._downs, strict=True) if is_down]

    def half_trip_wall_s(self) -> float:
        """Half the round trip in force, in wall seconds (one way: in or out)."""
        return self.delay_ms() / 2000.0 / self.speed

    def set_delay_ms(self, delay_ms: float) -> None:
        """Override the fixed delay and the schedule from now on (checked as the admin's)."""
        self._override_ms = check_delay_ms("delay_ms", delay_ms)

    def set_down(self, is_down: bool) -> None:
        """Take the region down (True) or bring it up, overriding the schedule from now on."""
        self._override_down = check_down("down", is_down)
