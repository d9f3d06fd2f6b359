"""Regional network congestion that comes in episodes (issue 17).

Wide-area trouble is not a coin flip per request: a region's round-trip time
rises several-fold for seconds to minutes and then recovers, and sometimes the
region is unreachable for a while. Each region here follows a semi-Markov
process over three states:

* ``normal``: the base RTT;
* ``congested``: the base RTT times ``congested_multiplier``;
* ``down``: no connection can be made (the simulator fails the attempt after
  the connect timeout and the request fails over; see ``sim/failover.py``).

A normal spell lasts a draw from ``normal_s``; then an episode starts, ``down``
with probability ``down_fraction`` (else ``congested``), and lasts a draw from
``down_s`` or ``congested_s``; then the region is normal again. A dwell is
exponential with mean ``mean_s`` (a Markov chain) or, with ``sigma`` > 0,
lognormal with that mean and log-sd ``sigma`` (heavier tails: most episodes
short, a few long). A ``schedule`` of fixed episodes replaces the random process
(for tests and reproducible demos).

The timeline of each region is drawn from its own generator, seeded by the run
seed and the region's name, so every router in a comparison meets the same
episodes whatever it sends where. Queries may come in any time order.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

State = Literal["normal", "congested", "down"]
MAX_EPISODES = 1_000_000  # a runaway spec (tiny dwells over a long run) is an error, not a hang


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DwellConfig(_Model):
    mean_s: float = Field(gt=0, le=86_400.0, description="Mean time in the state, seconds.")
    sigma: float = Field(
        0.0, ge=0, le=4.0, description="0: exponential; > 0: lognormal with this log-sd."
    )

    def draw(self, rng: random.Random) -> float:
        if self.sigma == 0:
            return rng.expovariate(1.0 / self.mean_s)
        # lognormal(mu, sigma) has mean exp(mu + sigma^2 / 2)
        mu = math.log(self.mean_s) - 0.5 * self.sigma * self.sigma
        return rng.lognormvariate(mu, self.sigma)


class EpisodeConfig(_Model):
    start_s: float = Field(ge=0, description="Simulated time the episode starts.")
    end_s: float = Field(gt=0, description="Simulated time it ends (normal again).")
    state: Literal["congested", "down"]
    multiplier: float = Field(1.0, ge=1, le=1000, description="RTT multiple when congested.")

    @model_validator(mode="after")
    def _ordered(self) -> EpisodeConfig:
        if not self.end_s > self.start_s:
            raise ValueError(f"episode end_s {self.end_s} must be after start_s {self.start_s}")
        return self


class RegionCongestionConfig(_Model):
    normal_s: DwellConfig | None = Field(None, description="Normal spells between episodes.")
    congested_s: DwellConfig | None = Field(None, description="Length of congested episodes.")
    congested_multiplier: float = Field(4.0, ge=1, le=1000, description="RTT multiple then.")
    down_fraction: float = Field(0.0, ge=0, le=1, description="Share of episodes that are down.")
    down_s: DwellConfig | None = Field(None, description="Length of down episodes.")
    schedule: list[EpisodeConfig] | None = Field(
        None, description="Fixed episodes instead of the random process.", max_length=10_000
    )

    @model_validator(mode="after")
    def _complete(self) -> RegionCongestionConfig:
        if self.schedule is not None:
            ends = sorted(self.schedule, key=lambda e: e.start_s)
            for a, b in itertools.pairwise(ends):
                if b.start_s < a.end_s:
                    raise ValueError(
                        f"schedule episodes overlap: [{a.start_s}, {a.end_s}) and "
                        f"[{b.start_s}, {b.end_s})"
                    )
            return self
        if self.normal_s is None:
            raise ValueError("give normal_s (and congested_s / down_s), or a schedule")
        if self.down_fraction < 1 and self.congested_s is None:
            raise ValueError("congested_s is required unless down_fraction is 1")
        if self.down_fraction > 0 and self.down_s is None:
            raise ValueError("down_s is required when down_fraction > 0")
        return self


@dataclass(frozen=True)
class Episode:
    start_s: float
    end_s: float
    state: State
    multiplier: float  # RTT multiple; meaningless when down


class CongestionTimeline:
    """One region's episodes, drawn lazily as far as the latest query."""

    def __init__(self, spec: RegionCongestionConfig, rng: random.Random) -> None:
        self._spec = spec
        self._rng = rng
        self._episodes: list[Episode] = []
        self._starts: list[float] = []
        self._drawn_until_s = 0.0
        if spec.schedule is not None:
            for e in sorted(spec.schedule, key=lambda e: e.start_s):
                self._append(Episode(e.start_s, e.end_s, e.state, e.multiplier))
            self._drawn_until_s = math.inf

    def _append(self, episode: Episode) -> None:
        if len(self._episodes) >= MAX_EPISODES:
            raise ValueError(
                f"more than {MAX_EPISODES} congestion episodes: dwell times too short "
                "for the run's length"
            )
        self._episodes.append(episode)
        self._starts.append(episode.start_s)

    def _draw_until(self, t_s: float) -> None:
        spec, rng = self._spec, self._rng
        while self._drawn_until_s <= t_s:
            assert spec.normal_s is not None  # a schedule never gets here (drawn to inf)
            start = self._drawn_until_s + spec.normal_s.draw(rng)
            if rng.random() < spec.down_fraction:
                assert spec.down_s is not None
                episode = Episode(start, start + spec.down_s.draw(rng), "down", 1.0)
            else:
                assert spec.congested_s is not None
                length = spec.congested_s.draw(rng)
                episode = Episode(start, start + length, "congested", spec.congested_multiplier)
            self._append(episode)
            self._drawn_until_s = episode.end_s

    def episode_at(self, t_s: float) -> Episode | None:
        """The episode under way at ``t_s`` (None: normal)."""
        self._draw_until(t_s)
        i = bisect.bisect_right(self._starts, t_s) - 1
        if i >= 0 and t_s < self._episodes[i].end_s:
            return self._episodes[i]
        return None

    def state_at(self, t_s: float) -> tuple[State, float]:
        """(state, RTT multiplier) at ``t_s``."""
        episode = self.episode_at(t_s)
        if episode is None:
            return "normal", 1.0
        return episode.state, episode.multiplier

    def episodes_until(self, t_s: float) -> list[Episode]:
        """Every episode that starts before ``t_s`` (for reports and tests)."""
        self._draw_until(t_s)
        return [e for e in self._episodes if e.start_s < t_s]


def timelines(specs: dict[str, RegionCongestionConfig], seed: int) -> dict[str, CongestionTimeline]:
    """One timeline per region, each from a generator seeded by (seed, region)."""
    return {
        region: CongestionTimeline(spec, random.Random(f"congestion:{seed}:{region}"))
        for region, spec in specs.items()
    }
