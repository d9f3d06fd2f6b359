"""Multi-seed sweeps and their statistics (``longroute sweep``; in progress).

So far: :mod:`longroute.sweep.stats`, medians over seeds with bootstrap
confidence intervals and paired ratios against a reference router.
"""

from longroute.sweep.stats import Estimate, PairedRatio, median_estimate, paired_ratio

__all__ = ["Estimate", "PairedRatio", "median_estimate", "paired_ratio"]
