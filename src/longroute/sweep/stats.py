"""Statistics of a multi-seed comparison: medians with bootstrap confidence intervals.

A verdict ("router A beats B") is a median over seeds with a confidence
interval, never one seed: single runs move by several percent. For one router
and metric, :func:`median_estimate` gives the median over seeds and a
percentile-bootstrap CI of that median (scipy's ``bootstrap``, resamples drawn
from a seeded generator, so the same values always give the same interval).
Against a reference router run on the same seeds, :func:`paired_ratio` takes
the ratio per seed (the pairing removes what a seed does to both: its
workload draw), and gives their median, its CI, and in how many seeds the
router was better.

Pure functions of their inputs; O(num_resamples * num_seeds) each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap

DEFAULT_CONFIDENCE = 0.95
DEFAULT_NUM_RESAMPLES = 9_999
DEFAULT_BOOTSTRAP_SEED = 0


@dataclass(frozen=True, slots=True)
class Estimate:
    """A median over seeds and its confidence interval.

    ``ci`` is None with fewer than two seeds (no interval can be told from one
    run); with two or more it is (low, high) at ``confidence``, and
    ``low <= median <= high`` when the values vary at all.
    """

    median: float
    ci: tuple[float, float] | None
    num_seeds: int
    confidence: float

    def format(self, digits: int = 3) -> str:
        """``1.02 [0.97, 1.08]``, or the median alone when there is no interval."""
        if self.ci is None:
            return f"{self.median:.{digits}g}"
        low, high = self.ci
        return f"{self.median:.{digits}g} [{low:.{digits}g}, {high:.{digits}g}]"


@dataclass(frozen=True, slots=True)
class PairedRatio:
    """A router's metric over a reference's, seed by seed.

    ``ratios[i]`` is value / reference on seed i; ``estimate`` their median and
    CI; ``num_wins`` the seeds where the router was strictly better (a ratio
    below 1 when lower is better, above 1 otherwise).
    """

    ratios: tuple[float, ...]
    estimate: Estimate
    num_wins: int

    @property
    def num_seeds(self) -> int:
        return len(self.ratios)

    def wins_text(self) -> str:
        """``wins in 4 of 5 seeds``."""
        return f"wins in {self.num_wins} of {self.num_seeds} seeds"


def median_estimate(
    values: Sequence[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> Estimate:
    """Median of ``values`` (one per seed) with a percentile-bootstrap CI of the median.

    Raises ValueError for no values, a value that is not finite (a run that
    measured nothing must be fixed or left out, not averaged in), a
    confidence outside (0, 1) or fewer than 1 resample.
    """
    data = _finite_array(values, "values")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    median = float(np.median(data))
    if len(data) < 2:
        return Estimate(median, None, len(data), confidence)
    if np.all(data == data[0]):  # no spread: every resample has the same median
        return Estimate(median, (median, median), len(data), confidence)
    result = bootstrap(
        (data,),
        np.median,
        n_resamples=num_resamples,
        confidence_level=confidence,
        method="percentile",  # BCa is unstable with the handful of seeds sweeps have
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    interval = result.confidence_interval
    low, high = float(interval.low), float(interval.high)
    return Estimate(median, (min(low, median), max(high, median)), len(data), confidence)


def paired_ratio(
    values: Sequence[float],
    reference: Sequence[float],
    *,
    is_lower_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> PairedRatio:
    """Per-seed ratios ``values[i] / reference[i]`` with their median, CI and wins.

    Both sequences are in the same seed order. Raises ValueError when their
    lengths differ, a value is not finite, or a reference value is 0 (the
    ratio would be undefined), naming the seed index.
    """
    data = _finite_array(values, "values")
    base = _finite_array(reference, "reference")
    if len(data) != len(base):
        raise ValueError(
            f"values and reference must cover the same seeds: {len(data)} != {len(base)}"
        )
    zero = np.flatnonzero(base == 0.0)
    if len(zero):
        raise ValueError(f"reference is 0 at seed index {int(zero[0])}: no ratio can be taken")
    ratios = data / base
    wins = ratios < 1.0 if is_lower_better else ratios > 1.0
    estimate = median_estimate(
        ratios.tolist(), confidence=confidence, num_resamples=num_resamples, seed=seed
    )
    return PairedRatio(tuple(float(r) for r in ratios), estimate, int(np.sum(wins)))


def _finite_array(values: Sequence[float], name: str) -> np.ndarray:
    if len(values) == 0:
        raise ValueError(f"{name} is empty: at least one seed's value is needed")
    for index, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(f"{name}[{index}] is {value!r}, not a finite number")
    return np.asarray(values, dtype=float)


__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_NUM_RESAMPLES",
    "Estimate",
    "PairedRatio",
    "median_estimate",
    "paired_ratio",
]
