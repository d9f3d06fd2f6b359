"""(1+1) evolution strategy with Rechenberg's 1/5 success rule, in log space.

One incumbent point; each generation proposes one candidate
``exp(log(incumbent) + sigma * N(0, 1))`` per weight, clipped into the weight's
bounds, and keeps it if its fitness is strictly lower. Every ``adapt_every``
proposals the step size ``sigma`` grows (success rate above target) or shrinks
(below target) by ``factor``. Pure: no I/O, no clock, randomness only from the
injected ``random.Random``.

Call pattern: ``ask()`` then ``tell(fitness)`` for the point asked, alternating.
The first ``ask`` returns the initial point itself, so its fitness is measured
before anything is compared with it.

Noise: a fitness measured on one short window of live traffic is noisy, and a
plain (1+1)-ES keeps an incumbent that was merely lucky once, rejecting better
candidates against that lucky figure. With ``reevaluate_every = k`` every k-th
ask (after k proposals) re-measures the incumbent instead of proposing, and the
incumbent's fitness becomes the mean of all its measurements, so luck averages
out; re-measurements do not count as proposals for the 1/5 rule.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from longroute.tuning.tunable import WeightBound


class OnePlusOneES:
    """Minimises a noisy black-box fitness over positive, bounded weights.

    Weights are handled in sorted name order so results depend on the seed
    only, not on mapping order. ``ask``/``tell`` are O(number of weights).
    """

    def __init__(
        self,
        initial: Mapping[str, float],
        bounds: Mapping[str, WeightBound],
        rng: random.Random,
        *,
        sigma0: float = 0.5,
        adapt_every: int = 10,
        factor: float = 0.82,
        target_success: float = 0.2,
        sigma_min: float = 1e-3,
        sigma_max: float = 2.0,
        reevaluate_every: int | None = None,
    ) -> None:
        _check_names(initial, bounds)
        if reevaluate_every is not None and reevaluate_every < 1:
            raise ValueError(f"reevaluate_every must be >= 1 or None, got {reevaluate_every}")
        for name in sorted(initial):
            _check_initial(name, initial[name], bounds[name])
        _check_params(sigma0, adapt_every, factor, target_success, sigma_min, sigma_max)
        self._names = tuple(sorted(initial))
        self._bounds = {name: bounds[name] for name in self._names}
        self._log_low = {name: math.log(bounds[name].low) for name in self._names}
        self._log_high = {name: math.log(bounds[name].high) for name in self._names}
        self._rng = rng
        self._sigma = sigma0
        self._adapt_every = adapt_every
        self._factor = factor
        self._target_success = target_success
        self._sigma_min = sigma_min
        self._sigma_max = sigma_max
        self._incumbent = {name: float(initial[name]) for name in self._names}
        self._incumbent_fitness: float | None = None
        self._pending: dict[str, float] | None = None
        self._num_proposals = 0
        self._num_successes = 0
        self._period_proposals = 0
        self._period_successes = 0
        self._reevaluate_every = reevaluate_every
        self._incumbent_sum = 0.0  # of the incumbent's measurements
        self._incumbent_count = 0
        self._since_reevaluation = 0  # proposals since the last re-measurement
        self._is_reevaluating = False

    def ask(self) -> dict[str, float]:
        """The next point to evaluate (a fresh dict); the first call returns the initial point.

        Raises ``RuntimeError`` if the previous point has not been told yet.
        """
        if self._pending is not None:
            raise RuntimeError("ask() called twice without tell(): evaluate the pending point")
        every = self._reevaluate_every
        self._is_reevaluating = (
            self._incumbent_fitness is not None
            and every is not None
            and self._since_reevaluation >= every
        )
        if self._incumbent_fitness is None or self._is_reevaluating:
            point = dict(self._incumbent)
        else:
            point = {name: self._mutate(name) for name in self._names}
        self._pending = point
        return dict(point)

    @property
    def is_reevaluating(self) -> bool:
        """True while the pending (or last told) point is a re-measurement of the incumbent."""
        return self._is_reevaluating

    def tell(self, fitness: float) -> bool:
        """Report the fitness (lower is better) of the point last asked; True if it is kept.

        The first tell only sets the initial point's fitness and returns True;
        so does the tell of a re-measurement (the incumbent's fitness becomes
        the mean of its measurements). Others count as proposals for the 1/5 rule.
        """
        if self._pending is None:
            raise RuntimeError("tell() called without a pending ask(): call ask() first")
        if not math.isfinite(fitness):
            raise ValueError(f"fitness must be a finite number, got {fitness}")
        point, self._pending = self._pending, None
        if self._incumbent_fitness is None or self._is_reevaluating:
            self._incumbent_sum += fitness
            self._incumbent_count += 1
            self._incumbent_fitness = self._incumbent_sum / self._incumbent_count
            self._since_reevaluation = 0
            return True
        self._since_reevaluation += 1
        is_accepted = fitness < self._incumbent_fitness
        if is_accepted:
            self._incumbent = point
            self._incumbent_fitness = fitness
            self._incumbent_sum, self._incumbent_count = fitness, 1
            self._num_successes += 1
            self._period_successes += 1
        self._num_proposals += 1
        self._period_proposals += 1
        if self._period_proposals == self._adapt_every:
            self._adapt_sigma()
        return is_accepted

    def _mutate(self, name: str) -> float:
        log_value = math.log(self._incumbent[name]) + self._sigma * self._rng.gauss(0.0, 1.0)
        log_value = min(max(log_value, self._log_low[name]), self._log_high[name])
        bound = self._bounds[name]
        # exp(log(x)) can miss x by one ulp: clamp again in linear space.
        return min(max(math.exp(log_value), bound.low), bound.high)

    def _adapt_sigma(self) -> None:
        rate = self._period_successes / self._adapt_every
        if rate > self._target_success:
            self._sigma /= self._factor
        elif rate < self._target_success:
            self._sigma *= self._factor
        self._sigma = min(max(self._sigma, self._sigma_min), self._sigma_max)
        self._period_proposals = 0
        self._period_successes = 0

    @property
    def names(self) -> tuple[str, ...]:
        """The weight names, sorted."""
        return self._names

    @property
    def bounds(self) -> dict[str, WeightBound]:
        return dict(self._bounds)

    @property
    def incumbent(self) -> dict[str, float]:
        """The best point so far (a copy); the initial point until something beats it."""
        return dict(self._incumbent)

    @property
    def incumbent_fitness(self) -> float | None:
        """The incumbent's fitness; None before the first tell."""
        return self._incumbent_fitness

    @property
    def sigma(self) -> float:
        """Current step size in log space (standard deviation of the mutation)."""
        return self._sigma

    @property
    def num_proposals(self) -> int:
        """Candidates told so far, the initial point not counted."""
        return self._num_proposals

    @property
    def num_successes(self) -> int:
        """Candidates accepted so far."""
        return self._num_successes

    @property
    def has_pending(self) -> bool:
        """True between an ask() and its tell()."""
        return self._pending is not None


def _check_names(initial: Mapping[str, float], bounds: Mapping[str, WeightBound]) -> None:
    if not initial:
        raise ValueError("initial weights are empty: nothing to tune")
    no_bound = sorted(set(initial) - set(bounds))
    if no_bound:
        raise ValueError(f"weights without a bound: {no_bound}; bounds given for {sorted(bounds)}")
    no_weight = sorted(set(bounds) - set(initial))
    if no_weight:
        raise ValueError(
            f"bounds without an initial weight: {no_weight}; weights given: {sorted(initial)}"
        )


def _check_initial(name: str, value: float, bound: WeightBound) -> None:
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"initial weight {name!r} must be finite and > 0, got {value}")
    if not bound.contains(value):
        raise ValueError(
            f"initial weight {name!r}={value} is outside its bound [{bound.low}, {bound.high}]"
        )


def _check_params(
    sigma0: float,
    adapt_every: int,
    factor: float,
    target_success: float,
    sigma_min: float,
    sigma_max: float,
) -> None:
    if not 0.0 < sigma_min <= sigma_max or not math.isfinite(sigma_max):
        raise ValueError(
            f"need 0 < sigma_min <= sigma_max (finite), got sigma_min={sigma_min}, "
            f"sigma_max={sigma_max}"
        )
    if not sigma_min <= sigma0 <= sigma_max:
        raise ValueError(f"sigma0={sigma0} is outside [sigma_min={sigma_min}, {sigma_max}]")
    if adapt_every < 1:
        raise ValueError(f"adapt_every must be >= 1, got {adapt_every}")
    if not 0.0 < factor < 1.0:
        raise ValueError(f"factor must be in (0, 1), got {factor}")
    if not 0.0 < target_success < 1.0:
        raise ValueError(f"target_success must be in (0, 1), got {target_success}")
