"""Medians over seeds with bootstrap confidence intervals, and paired ratios."""

from __future__ import annotations

import math

import numpy as np
import pytest

from longroute.sweep import median_estimate, paired_ratio


def test_median_and_ci_bracket_it_and_are_reproducible() -> None:
    values = [1.00, 1.10, 0.95, 1.05, 1.20, 0.90, 1.02]
    first = median_estimate(values)
    assert first.median == pytest.approx(1.02)
    assert first.ci is not None
    low, high = first.ci
    assert min(values) <= low < first.median < high <= max(values)
    assert median_estimate(values) == first  # same seed, same interval
    assert first.format() == f"1.02 [{low:.3g}, {high:.3g}]"


def test_more_seeds_narrow_the_interval() -> None:
    rng = np.random.default_rng(1)
    draws = rng.normal(1.0, 0.05, size=200)
    few = median_estimate(draws[:5].tolist()).ci
    many = median_estimate(draws.tolist()).ci
    assert few is not None and many is not None
    assert many[1] - many[0] < (few[1] - few[0]) / 2
    assert many[0] < 1.0 < many[1]  # the true median is covered


def test_one_seed_has_no_interval_and_no_spread_has_a_point_interval() -> None:
    single = median_estimate([3.5])
    assert (single.median, single.ci, single.num_seeds) == (3.5, None, 1)
    assert single.format() == "3.5"
    flat = median_estimate([2.0, 2.0, 2.0])
    assert flat.ci == (2.0, 2.0)


def test_paired_ratio_counts_wins_per_seed() -> None:
    reference = [100.0, 110.0, 90.0, 105.0, 95.0]
    router = [90.0, 99.0, 95.0, 94.5, 85.5]  # better on 4 seeds, worse on seed 2
    result = paired_ratio(router, reference)
    assert result.ratios[2] == pytest.approx(95 / 90)
    assert (result.num_wins, result.num_seeds) == (4, 5)
    assert result.wins_text() == "wins in 4 of 5 seeds"
    assert result.estimate.median == pytest.approx(0.9)
    higher = paired_ratio(router, reference, is_lower_better=False)
    assert higher.num_wins == 1


def test_pairing_removes_what_a_seed_does_to_both() -> None:
    """Seeds move both routers a lot, the router is 5% better on each: the paired
    interval is tight and below 1, the unpaired medians' intervals overlap."""
    seed_effect = np.array([0.6, 1.4, 0.9, 1.2, 0.8, 1.1, 1.0])
    reference = (100.0 * seed_effect).tolist()
    router = (95.0 * seed_effect).tolist()
    paired = paired_ratio(router, reference).estimate
    assert paired.ci == pytest.approx((0.95, 0.95))
    a, b = median_estimate(router).ci, median_estimate(reference).ci
    assert a is not None and b is not None and a[1] > b[0]  # unpaired: they overlap


@pytest.mark.parametrize(
    ("values", "reference", "message"),
    [
        ([], [], "empty"),
        ([1.0, math.nan], [1.0, 1.0], r"values\[1\] is nan"),
        ([1.0], [1.0, 2.0], "same seeds"),
        ([1.0, 2.0], [1.0, 0.0], "seed index 1"),
        ([1.0], [math.inf], r"reference\[0\] is inf"),
    ],
)
def test_bad_input_is_a_clear_error(
    values: list[float], reference: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        paired_ratio(values, reference)


def test_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError, match="confidence"):
        median_estimate([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="num_resamples"):
        median_estimate([1.0, 2.0], num_resamples=0)
