"""Load generator for OpenAI-compatible endpoints (``longroute bench``).

Programmatic use::

    from longroute.bench import BenchOptions, run_bench
    result = run_bench(["http://127.0.0.1:8000"], BenchOptions(concurrency=8, num_requests=200))
    result.targets["127.0.0.1:8000"].summary["ttft_p50_s"]

``run_bench_async`` does the same inside a running event loop. The names are
imported on first use, so importing ``longroute.bench.cli`` (done by every
``longroute`` command) does not load aiohttp or numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from longroute.bench.options import (
        BenchError,
        BenchOptions,
        BenchResult,
        RequestError,
        Target,
        TargetResult,
    )
    from longroute.bench.report import bench_json, bench_payload, write_bench_report
    from longroute.bench.runner import run_bench, run_bench_async
    from longroute.bench.summary import compare_ratios

_HOMES = {
    "BenchError": "options",
    "BenchOptions": "options",
    "BenchResult": "options",
    "RequestError": "options",
    "Target": "options",
    "TargetResult": "options",
    "bench_json": "report",
    "bench_payload": "report",
    "write_bench_report": "report",
    "run_bench": "runner",
    "run_bench_async": "runner",
    "compare_ratios": "summary",
}
__all__ = [
    "BenchError",
    "BenchOptions",
    "BenchResult",
    "RequestError",
    "Target",
    "TargetResult",
    "bench_json",
    "bench_payload",
    "compare_ratios",
    "run_bench",
    "run_bench_async",
    "write_bench_report",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'longroute.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"longroute.bench.{home}"), name)
