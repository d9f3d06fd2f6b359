"""Round-trip-time estimate per endpoint: an exponentially weighted moving average."""

from __future__ import annotations


class RttEwma:
    """EWMA of RTT samples (ms), seeded with a prior.

    ``alpha`` is the weight of a new sample: 0.2 forgets a level shift in
    about ten samples yet smooths single peaks. Updates are O(1).
    """

    __slots__ = ("alpha", "value_ms")

    def __init__(self, prior_ms: float, alpha: float = 0.2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if prior_ms < 0:
            raise ValueError(f"prior_ms must be >= 0, got {prior_ms}")
        self.alpha = alpha
        self.value_ms = prior_ms

    def update(self, sample_ms: float) -> float:
        """Fold in one sample; returns the new estimate."""
        self.value_ms += self.alpha * (sample_ms - self.value_ms)
        return self.value_ms
