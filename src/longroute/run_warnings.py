"""Warnings after a simulation, on stderr: what a summary table would hide.

Requests no endpoint could take are counted and said, never dropped
silently; a run that drained long after its last arrival (the fleet fell
behind, see :mod:`longroute.metrics.backlog`) is said with the endpoints
that fell behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from longroute.sim.simulator import SimResult


def warn_results(results: Mapping[str, SimResult], where: str = "") -> int:
    """Print the warnings of each router's run (``where`` prefixes them, e.g. a window);
    returns how many were printed."""
    from longroute.metrics.backlog import find_backlog

    err = Console(stderr=True, soft_wrap=True)
    prefix = f"{where}: " if where else ""
    count = 0
    for router, res in results.items():
        backlog = find_backlog(res.records)
        if backlog is not None:
            err.print(
                f"[yellow]warning:[/] {escape(prefix + router)}: {escape(backlog.describe())}",
                highlight=False,
            )
            count += 1
        if res.num_rejected:
            example = escape(res.rejections[0]) if res.rejections else ""
            err.print(
                f"[yellow]warning:[/] {escape(prefix + router)}: {res.num_rejected} request(s) "
                f"rejected (num_rejected in the summary), e.g. {example}",
                highlight=False,
            )
            count += 1
        failovers = res.num_failovers
        if failovers:
            err.print(
                f"[dim]note:[/] {escape(prefix + router)}: {failovers} attempt(s) met a down "
                "region and were routed again (network.congestion)",
                highlight=False,
            )
    return count


__all__ = ["warn_results"]
