"""Multi-seed sweeps and their statistics (``longroute sweep``, ``simulate --seeds``).

A spec (:mod:`~longroute.sweep.spec`) expands into cells (:mod:`~longroute.sweep.grid`),
each one simulation (:mod:`~longroute.sweep.cell`), run on an executor
(:mod:`~longroute.sweep.executors`: serial, process pool, Ray) through a
content-keyed cache (:mod:`~longroute.sweep.cache`), and reported as medians
over seeds with bootstrap CIs and paired ratios (:mod:`~longroute.sweep.stats`,
:mod:`~longroute.sweep.report`). docs/sweeps.md has the user's view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute._lazy import lazy_exports

if TYPE_CHECKING:
    from longroute.sweep.stats import Estimate, PairedRatio, median_estimate, paired_ratio

# imported on first use, so `longroute --help` does not pay for this package (PEP 562)
_LAZY = {
    "Estimate": "longroute.sweep.stats",
    "PairedRatio": "longroute.sweep.stats",
    "median_estimate": "longroute.sweep.stats",
    "paired_ratio": "longroute.sweep.stats",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = ["Estimate", "PairedRatio", "median_estimate", "paired_ratio"]
