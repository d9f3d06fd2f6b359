"""Clients: when each session's first turn is issued.

* Open loop: sessions start by an arrival process (Poisson, gamma with a
  coefficient of variation, or the trace's own timestamps), whatever the
  fleet's state; later turns follow their predecessor's answer plus think time.
* Closed loop: ``num_users`` users each run sessions back to back, so at most
  ``num_users`` requests are in flight.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from longroute.workloads.types import Session, Workload

ARRIVALS = ("poisson", "gamma", "trace")


@dataclass(frozen=True, slots=True)
class ClientSpec:
    kind: Literal["open", "closed"] = "open"
    arrival: Literal["poisson", "gamma", "trace"] = "poisson"
    rate_per_s: float | None = None
    cv: float = 1.0
    num_users: int | None = None
    think_time_s: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("open", "closed"):
            raise ValueError(f"client kind must be 'open' or 'closed', got {self.kind!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.kind == "closed" and (self.num_users is None or self.num_users < 1):
            raise ValueError("closed-loop clients need num_users >= 1")
        if self.kind == "open" and self.arrival != "trace" and not (self.rate_per_s or 0) > 0:
            raise ValueError(f"open-loop {self.arrival} arrivals need rate_per_s > 0")
        # written so that NaN fails every comparison and is rejected
        if not (self.cv > 0 and self.time_scale > 0 and self.think_time_s >= 0):
            raise ValueError("need cv > 0, time_scale > 0 and think_time_s >= 0")


def open_loop_starts(
    spec: ClientSpec, workload: Workload, rng: random.Random
) -> list[tuple[float, Session]]:
    """Start time of every session under an open-loop client, sorted by time."""
    sessions = workload.sessions
    if spec.arrival == "trace":
        if not workload.is_timed:
            raise ValueError(
                f"workload {workload.name!r} has no timestamps; use poisson or gamma arrivals"
            )
        starts = [((s.start_s or 0.0) * spec.time_scale, s) for s in sessions]
        starts.sort(key=lambda item: item[0])  # stable: ties keep file order
        return starts
    assert spec.rate_per_s is not None
    rate = spec.rate_per_s
    t = 0.0
    out: list[tuple[float, Session]] = []
    shape = 1.0 / (spec.cv * spec.cv)
    for s in sessions:
        out.append((t, s))
        if spec.arrival == "poisson":
            t += rng.expovariate(rate)
        else:
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
    return out
