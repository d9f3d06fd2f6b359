"""The sessions a load-generation run sends: a trace's, or a registered generator's.

Called once per ``run_bench``, before any target is probed.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from longroute.bench.options import DEFAULT_NUM_SESSIONS, DEFAULT_NUM_SESSIONS_TIMED, BenchOptions
from longroute.workloads.types import Workload


def _first(workload: Workload, num_sessions: int | None) -> Workload:
    if num_sessions is None:
        return workload
    return replace(workload, sessions=workload.sessions[:num_sessions])


def load_workload(options: BenchOptions) -> Workload:
    """The sessions to send: the trace's, or the generator's with ``options.seed``.

    A generator that takes ``num_sessions`` gets it (defaulting as
    :class:`BenchOptions` says); one that sizes itself (``kv-lookup``: queries
    x lengths x languages) is built whole and, when ``num_sessions`` or
    ``num_requests`` is given, cut to its first sessions, as a trace is.
    """
    if options.trace is not None:
        from longroute.workloads.traces import load_trace

        return _first(load_trace(options.trace, options.trace_format), options.num_sessions)
    from longroute.workloads.registry import WORKLOADS

    num_sessions = options.num_sessions or options.num_requests
    factory = WORKLOADS.get(options.workload)
    if "num_sessions" not in inspect.signature(factory).parameters:
        workload = WORKLOADS.build(options.workload, options.workload_params, seed=options.seed)
        return _first(workload, num_sessions)
    if num_sessions is None:
        timed = options.duration_s is not None
        num_sessions = DEFAULT_NUM_SESSIONS_TIMED if timed else DEFAULT_NUM_SESSIONS
    return WORKLOADS.build(
        options.workload, options.workload_params, num_sessions=num_sessions, seed=options.seed
    )
