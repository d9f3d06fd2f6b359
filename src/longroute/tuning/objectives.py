"""What the tuner minimises: a weighted sum of latency percentiles over one window.

Called once per closed window (every ``window_requests`` finished requests), so
it is not on the per-request hot path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Objective:
    """``ttft_weight * p95(TTFT) + e2e_weight * p95(end-to-end)``, in seconds; lower is better.

    Percentiles use linear interpolation between order statistics (numpy's
    default method).
    """

    name: str
    ttft_weight: float
    e2e_weight: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("objective name must be non-empty")
        for label, weight in (("ttft_weight", self.ttft_weight), ("e2e_weight", self.e2e_weight)):
            if not math.isfinite(weight) or weight < 0.0:
                raise ValueError(
                    f"objective {self.name!r}: {label} must be finite and >= 0, got {weight}"
                )
        if self.ttft_weight == 0.0 and self.e2e_weight == 0.0:
            raise ValueError(f"objective {self.name!r}: ttft_weight and e2e_weight are both 0")

    def value(self, ttfts_s: Sequence[float], e2es_s: Sequence[float]) -> float:
        """The objective over one window; both sequences must be non-empty. O(n log n)."""
        if len(ttfts_s) == 0 or len(e2es_s) == 0:
            raise ValueError(
                f"objective {self.name!r} needs non-empty samples, got "
                f"{len(ttfts_s)} TTFTs and {len(e2es_s)} end-to-end latencies"
            )
        total = 0.0
        if self.ttft_weight != 0.0:
            total += self.ttft_weight * float(np.percentile(np.asarray(ttfts_s, dtype=float), 95))
        if self.e2e_weight != 0.0:
            total += self.e2e_weight * float(np.percentile(np.asarray(e2es_s, dtype=float), 95))
        return total


OBJECTIVES: dict[str, Objective] = {
    "ttft-p95": Objective("ttft-p95", ttft_weight=1.0, e2e_weight=0.0),
    "e2e-p95": Objective("e2e-p95", ttft_weight=0.0, e2e_weight=1.0),
    "mix": Objective("mix", ttft_weight=0.5, e2e_weight=0.5),
}


def get_objective(name: str) -> Objective:
    """The objective called ``name``; ``ValueError`` listing the valid names otherwise."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(
            f"unknown objective {name!r}; valid objectives: {', '.join(sorted(OBJECTIVES))}"
        ) from None
