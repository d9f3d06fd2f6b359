"""Warnings after a simulation, on stderr: what a summary table would hide.

Requests no endpoint could take are counted and said, never dropped
silently; a run that drained long after its last arrival (the fleet fell
behind, see :mod:`longroute.metrics.backlog`) is said with the endpoints
that fell behind. Each is wrapped to the terminal's width
(:func:`longroute.cli_output.print_warning`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rich.console import Console

from longroute.cli_output import print_warning

if TYPE_CHECKING:
    from longroute.sim.simulator import SimResult


def warn_results(results: Mapping[str, SimResult], where: str = "") -> int:
    """Print the warnings of each router's run (``where`` prefixes them, e.g. a window);
    returns how many were printed."""
    from longroute.metrics.backlog import find_backlog

    err = Console(stderr=True)
    prefix = f"{where}: " if where else ""
    count = 0
    for router, res in results.items():
        backlog = find_backlog(res.records)
        if backlog is not None:
            print_warning(err, f"{prefix}{router}: {backlog.describe()}")
            count += 1
        if res.num_rejected:
            example = res.rejections[0] if res.rejections else ""
            print_warning(
                err,
                f"{prefix}{router}: {res.num_rejected} request(s) rejected (num_rejected in "
                f"the summary), e.g. {example}",
            )
            count += 1
        failovers = res.num_failovers
        if failovers:
            print_warning(
                err,
                f"{prefix}{router}: {failovers} attempt(s) met a down region and were routed "
                "again (network.congestion)",
                label="note",
            )
    return count


__all__ = ["warn_results"]
