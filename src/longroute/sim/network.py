"""Network between the router's region and the endpoints' regions.

Round-trip times come from a region-to-region matrix (ms). Each request
draws its own RTT: the base value times lognormal jitter, and with a small
probability a peak (a multiple of the base), as seen in cross-region traces.
Half the RTT is paid on the way to the engine, half on the way back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping


class Network:
    def __init__(
        self,
        rtt_ms: Mapping[str, Mapping[str, float]],
        router_region: str,
        rng: random.Random,
        *,
        jitter_sigma: float = 0.0,
        peak_probability: float = 0.0,
        peak_multiplier: float = 1.0,
    ) -> None:
        if router_region not in rtt_ms:
            raise ValueError(
                f"router region {router_region!r} is not in the RTT matrix; "
                f"regions: {', '.join(sorted(rtt_ms))}"
            )
        # written so that NaN fails every comparison and is rejected
        if not (jitter_sigma >= 0 and 0 <= peak_probability <= 1 and peak_multiplier >= 1):
            raise ValueError(
                "need jitter_sigma >= 0, 0 <= peak_probability <= 1, peak_multiplier >= 1; got "
                f"{jitter_sigma}, {peak_probability}, {peak_multiplier}"
            )
        self.router_region = router_region
        self._base_ms = dict(rtt_ms[router_region])
        self._rng = rng
        self.jitter_sigma = jitter_sigma
        self.peak_probability = peak_probability
        self.peak_multiplier = peak_multiplier
        # mean of lognormal(-s^2/2, s) is 1, so jitter leaves the mean RTT unchanged
        self._mu = -0.5 * jitter_sigma * jitter_sigma

    def base_rtt_ms(self, region: str) -> float:
        try:
            return self._base_ms[region]
        except KeyError:
            raise ValueError(
                f"no RTT from {self.router_region!r} to {region!r}; "
                f"known: {', '.join(sorted(self._base_ms))}"
            ) from None

    def sample_rtt_s(self, region: str) -> float:
        rtt_ms = self.base_rtt_ms(region)
        if self.jitter_sigma > 0:
            rtt_ms *= math.exp(self._rng.gauss(self._mu, self.jitter_sigma))
        if self.peak_probability > 0 and self._rng.random() < self.peak_probability:
            rtt_ms *= self.peak_multiplier
        return rtt_ms / 1000.0
