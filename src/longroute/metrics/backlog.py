"""Did the fleet keep up? A run that goes on long after its last arrival measured a backlog.

When a workload overloads the fleet, queues grow without bound and the
simulation drains them for a long time after the last request arrived; the
latencies then describe the backlog, not the routing. :func:`find_backlog`
flags a run whose drain (last finish minus last arrival) exceeds
``max(min_drain_s, factor x arrival span)`` and names the endpoints that fell
behind (their own last finish is that late), slowest first. One pass over the
records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from longroute.metrics.records import RequestRecord

DEFAULT_FACTOR = 0.5
DEFAULT_MIN_DRAIN_S = 60.0
MAX_NAMED = 5


@dataclass(frozen=True, slots=True)
class Backlog:
    """``drain_s`` after ``arrival_span_s`` of arrivals; ``endpoints``: (name, its drain)."""

    arrival_span_s: float
    drain_s: float
    endpoints: tuple[tuple[str, float], ...]

    def describe(self) -> str:
        named = ", ".join(f"{name} (+{drain:.0f} s)" for name, drain in self.endpoints[:MAX_NAMED])
        more = len(self.endpoints) - MAX_NAMED
        if more > 0:
            named += f" and {more} more"
        return (
            f"the run went on {self.drain_s:.0f} s after the last arrival "
            f"({self.arrival_span_s:.0f} s of arrivals): the fleet did not keep up and the "
            f"latencies measure its backlog; fell behind: {named}"
        )


def find_backlog(
    records: Sequence[RequestRecord],
    *,
    factor: float = DEFAULT_FACTOR,
    min_drain_s: float = DEFAULT_MIN_DRAIN_S,
) -> Backlog | None:
    """The run's backlog, or None when it drained within the threshold (or had no records)."""
    if not records:
        return None
    first_arrival = min(r.arrival_s for r in records)
    last_arrival = max(r.arrival_s for r in records)
    last_finish: dict[str, float] = {}
    for r in records:
        if r.finish_s > last_finish.get(r.endpoint, float("-inf")):
            last_finish[r.endpoint] = r.finish_s
    span = last_arrival - first_arrival
    threshold = max(min_drain_s, factor * span)
    drain = max(last_finish.values()) - last_arrival
    if drain <= threshold:
        return None
    behind = sorted(
        ((name, end - last_arrival) for name, end in last_finish.items()
         if end - last_arrival > threshold),
        key=lambda item: (-item[1], item[0]),
    )  # fmt: skip
    return Backlog(span, drain, tuple(behind))


__all__ = ["Backlog", "find_backlog"]
