"""What the tuner needs from a router: named positive weights it may read and replace.

Any router with ``get_weights`` / ``set_weights`` can be tuned (GORGO's RTT and
queue weights, a load-aware router's penalty, ...). The tuner calls
``get_weights`` once when it starts and ``set_weights`` between requests, never
while a routing decision is being made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable


@dataclass(frozen=True, slots=True)
class WeightBound:
    """Closed range ``[low, high]`` (linear scale) a weight may take; ``0 < low < high``."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"weight bound must be finite, got low={self.low}, high={self.high}")
        if self.low <= 0.0:
            raise ValueError(f"weight bound low must be > 0 (weights are positive), got {self.low}")
        if self.low >= self.high:
            raise ValueError(f"weight bound needs low < high, got low={self.low}, high={self.high}")

    def contains(self, value: float) -> bool:
        """True if ``low <= value <= high``."""
        return self.low <= value <= self.high


UNBOUNDED = WeightBound(1e-6, 1e6)
"""Practically no bound: for the ablation showing what the bounds prevent (reward hacking)."""


@runtime_checkable
class TunableRouter(Protocol):
    """A router with named positive numeric weights that may change between requests.

    ``get_weights`` returns a fresh dict of the current weights;
    ``set_weights`` replaces them all and raises ``ValueError`` for unknown
    names or invalid values (the router validates, not the tuner).
    """

    def get_weights(self) -> dict[str, float]: ...

    def set_weights(self, weights: Mapping[str, float]) -> None: ...


def as_tunable(router: object) -> TunableRouter:
    """``router`` typed as a :class:`TunableRouter`; ``TypeError`` naming it if it is not one."""
    missing = [
        method
        for method in ("get_weights", "set_weights")
        if not callable(getattr(router, method, None))
    ]
    if missing:
        name = getattr(router, "name", type(router).__name__)
        raise TypeError(
            f"router {name!r} cannot be tuned: it lacks {', '.join(missing)} "
            "(a tunable router needs get_weights() and set_weights(weights))"
        )
    return cast(TunableRouter, router)
