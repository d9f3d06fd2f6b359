"""Network between the router's region and the endpoints' regions.

Round-trip times come from a region-to-region matrix (ms). Each request
draws its own RTT: the base value times lognormal jitter, and with a small
probability a peak (a multiple of the base), as seen in cross-region traces.
Regions with a congestion timeline (``longroute.congestion``) multiply their
RTT during congested episodes and refuse connections while down. Half the RTT
is paid on the way to the engine, half on the way back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from longroute.congestion import CongestionTimeline


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
        congestion: Mapping[str, CongestionTimeline] | None = None,
        connect_timeout_s: float = 5.0,
        health_check_interval_s: float = 5.0,
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
        if not (connect_timeout_s > 0 and health_check_interval_s > 0):
            raise ValueError(
                "need connect_timeout_s > 0 and health_check_interval_s > 0; got "
                f"{connect_timeout_s}, {health_check_interval_s}"
            )
        self.connect_timeout_s = connect_timeout_s
        self.health_check_interval_s = health_check_interval_s
        self._congestion = dict(congestion or {})
        unknown = sorted(set(self._congestion) - set(rtt_ms))
        if unknown:
            raise ValueError(
                f"congestion for unknown region(s) {', '.join(unknown)}; "
                f"regions: {', '.join(sorted(rtt_ms))}"
            )

    def base_rtt_ms(self, region: str) -> float:
        try:
            return self._base_ms[region]
        except KeyError:
            raise ValueError(
                f"no RTT from {self.router_region!r} to {region!r}; "
                f"known: {', '.join(sorted(self._base_ms))}"
            ) from None

    def is_down(self, region: str, now_s: float) -> bool:
        """Whether ``region`` refuses connections at ``now_s`` (a down episode)."""
        timeline = self._congestion.get(region)
        return timeline is not None and timeline.state_at(now_s)[0] == "down"

    def sample_rtt_s(self, region: str, now_s: float = 0.0) -> float:
        """One request's RTT to ``region`` if sent at ``now_s``, seconds."""
        rtt_ms = self.base_rtt_ms(region)
        timeline = self._congestion.get(region)
        if timeline is not None:
            rtt_ms *= timeline.state_at(now_s)[1]
        if self.jitter_sigma > 0:
            rtt_ms *= math.exp(self._rng.gauss(self._mu, self.jitter_sigma))
        if self.peak_probability > 0 and self._rng.random() < self.peak_probability:
            rtt_ms *= self.peak_multiplier
        return rtt_ms / 1000.0
