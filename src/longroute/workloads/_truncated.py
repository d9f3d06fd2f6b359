"""Lognormal token counts truncated to [low, high], drawn by inverting the CDF.

Used by :mod:`longroute.workloads.medha_mix`, whose figures are quantiles of
data that was already bounded (a P90 of 839K tokens under a 1M cap). Clipping
a lognormal to the bounds piles mass on them; a lognormal *conditioned* on
[low, high] does not, and its parameters can be chosen so that the bounded
quantiles land on the published ones.

A draw takes one uniform from the generator (all ``size`` at once, in order)
and maps it through the normal quantile function of ``statistics.NormalDist``
(~0.1 us a draw), so a seed fixes the draws. Checked at construction, before
any draw: a bad knob raises ``ValueError`` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from longroute.workloads._knobs import check_float

_NORMAL = NormalDist()
_SMALLEST = math.ulp(0.0)  # the quantile function needs 0 < p < 1
_BELOW_ONE = math.nextafter(1.0, 0.0)


@dataclass(frozen=True, slots=True)
class TruncatedLognormal:
    """Token counts ``exp(N(log(median), sigma))`` conditioned on [low, high], then rounded.

    ``median`` and ``sigma`` are those of the lognormal *before* truncation.
    Draws come from the probability interval ``[p_low, p_high]`` of the standard
    normal; when both bounds lie above the median the interval is taken in the
    mirrored (upper) tail so that far tails keep their precision. ``constant``
    is set when the draw is degenerate (``sigma == 0`` or ``low == high``).
    """

    median: float
    sigma: float
    low: int
    high: int
    p_low: float
    p_high: float
    mirrored: bool
    constant: int | None

    @classmethod
    def checked(
        cls, kind: str, median: object, sigma: object, low: int, high: int
    ) -> TruncatedLognormal:
        """The distribution of knobs ``median_<kind>_tokens`` and ``<kind>_sigma`` on [low, high].

        ``low <= high`` must already hold. Raises ``ValueError`` naming the knob
        when a value is out of range or when the lognormal puts no probability
        (in double precision) in [low, high].
        """
        median_f = check_float(f"median_{kind}_tokens", median)
        sigma_f = check_float(f"{kind}_sigma", sigma)
        if low == high or sigma_f == 0.0:
            value = low if low == high else round(median_f)
            if not low <= value <= high:
                raise ValueError(
                    f"median_{kind}_tokens ({median_f}) with {kind}_sigma 0 lies outside "
                    f"the bounds [{low}, {high}] of its draws"
                )
            return cls(median_f, sigma_f, low, high, 0.0, 1.0, False, value)
        a = (math.log(low) - math.log(median_f)) / sigma_f
        b = (math.log(high) - math.log(median_f)) / sigma_f
        mirrored = a > 0.0
        p_low, p_high = (
            (_NORMAL.cdf(-b), _NORMAL.cdf(-a)) if mirrored else (_NORMAL.cdf(a), _NORMAL.cdf(b))
        )
        if not p_high > p_low:
            raise ValueError(
                f"median_{kind}_tokens ({median_f}) and {kind}_sigma ({sigma_f}) put no "
                f"probability in the bounds [{low}, {high}] of its draws"
            )
        return cls(median_f, sigma_f, low, high, p_low, p_high, mirrored, None)

    def draw(self, rng: np.random.Generator, size: int) -> list[int]:
        """``size`` token counts in [low, high]; always takes ``size`` uniforms from ``rng``."""
        uniforms = rng.random(size).tolist()
        if self.constant is not None:
            return [self.constant] * size
        inverse, start, span = _NORMAL.inv_cdf, self.p_low, self.p_high - self.p_low
        z = [inverse(min(max(start + u * span, _SMALLEST), _BELOW_ONE)) for u in uniforms]
        sign = -1.0 if self.mirrored else 1.0
        tokens = np.exp(math.log(self.median) + sign * self.sigma * np.asarray(z, dtype=float))
        return [int(x) for x in np.clip(np.rint(tokens), self.low, self.high)]
