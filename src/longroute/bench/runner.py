"""The load loop: sessions of chat requests against each target, one target after another.

``run_bench`` (or ``run_bench_async`` inside a running event loop) is called
once per benchmark. It builds the workload once, probes every target first
(so an unreachable one fails before any load is sent), then runs the same
workload with the same seed against each target in turn, through one
``aiohttp.ClientSession`` with an unlimited connection pool (the load loop
alone bounds what is in flight). A KV-lookup workload's answers are checked
(its sessions parsed into questions here, once); see
:mod:`longroute.bench.target_run` for one target's loop and retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp

from longroute.bench.client import AuthRejected, ChatClient
from longroute.bench.kv import KvQuery, is_kv_workload, kv_queries
from longroute.bench.options import (
    BenchError,
    BenchOptions,
    BenchResult,
    Target,
    TargetResult,
    resolve_targets,
)
from longroute.bench.target_run import TargetRun
from longroute.bench.workload import load_workload
from longroute.workloads.types import Workload

#: The longest wait for a target's ``GET /v1/models`` before the run starts.
PROBE_TIMEOUT_S = 10.0
__all__ = ["BenchProgress", "load_workload", "run_bench", "run_bench_async"]


class BenchProgress(Protocol):
    """What a progress display hears of a run (``longroute bench`` draws a bar from it).

    ``target_started`` once per target as its load begins, with the most requests it
    will send when known (None with retries and no --num-requests); ``request_done``
    once per request that got its answer or failed. Called on the event loop's thread.
    """

    def target_started(self, label: str, num_planned: int | None) -> None: ...

    def request_done(self, label: str, is_failed: bool) -> None: ...


def _num_planned(workload: Workload, options: BenchOptions) -> int | None:
    """The most requests one target is sent, when known (retries add an unknown number)."""
    turns = workload.num_requests if options.max_attempts == 1 else None
    if options.num_requests is None:
        return turns
    return options.num_requests if turns is None else min(turns, options.num_requests)


def _checked_queries(workload: Workload, options: BenchOptions) -> dict[str, KvQuery] | None:
    """The KV-lookup question of each session, or None when answers cannot be checked.

    Raises ``ValueError`` when retries are asked for (``max_attempts`` > 1)
    but the workload's answers cannot be checked.
    """
    if is_kv_workload(workload):
        return kv_queries(workload)
    if options.max_attempts > 1:
        raise ValueError(
            f"max_attempts={options.max_attempts} needs answers that can be checked, and "
            f"workload {workload.name!r} has none; use the kv-lookup workload, or max_attempts 1"
        )
    return None


async def _pick_model(client: ChatClient, target: Target, options: BenchOptions) -> str:
    """Probe the target (GET /v1/models): unreachable -> BenchError naming its URL."""
    try:
        models = await client.list_models(min(options.timeout_s, PROBE_TIMEOUT_S))
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        raise BenchError(f"cannot reach target {target.label} at {target.url}: {exc}") from None
    except AuthRejected as exc:
        how = "pass its key with --api-key" if options.api_key is None else "check --api-key"
        raise BenchError(
            f"target {target.label} at {target.url} refused the credentials ({exc}): {how}"
        ) from None
    except (aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if options.model is not None:
            return options.model  # listing models is optional when the model is given
        raise BenchError(
            f"target {target.label} at {target.url}: cannot list models ({exc}); "
            "name the model with --model"
        ) from None
    if options.model is not None:
        return options.model
    if not models:
        raise BenchError(
            f"target {target.label} at {target.url} lists no model; name one with --model"
        )
    return models[0]


async def run_bench_async(
    targets: Sequence[str | Target], options: BenchOptions, progress: BenchProgress | None = None
) -> BenchResult:
    """Run the workload against every target in order; see the module docstring.

    Raises :class:`BenchError` (a target unreachable or without a model),
    ``ValueError`` (bad targets) and the workload's errors (``RegistryError``,
    ``TraceError``). Failed requests never raise: they are counted.
    """
    resolved = resolve_targets(targets)
    workload = load_workload(options)
    queries = _checked_queries(workload, options)
    timeout_s = options.timeout_s
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        clients = {
            t.label: ChatClient(
                http, t.url, api_key=t.api_key or options.api_key, timeout_s=timeout_s
            )
            for t in resolved
        }
        models = {t.label: await _pick_model(clients[t.label], t, options) for t in resolved}
        results: dict[str, TargetResult] = {}
        for t in resolved:
            on_done = None
            if progress is not None:
                progress.target_started(t.label, _num_planned(workload, options))
                on_done = progress.request_done
            run = TargetRun(
                clients[t.label], t, models[t.label], workload, options, queries, on_done=on_done
            )
            results[t.label] = await run.run()
    return BenchResult(workload.name, options.seed, results)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop


def run_bench(
    targets: Sequence[str | Target], options: BenchOptions, progress: BenchProgress | None = None
) -> BenchResult:
    """Blocking :func:`run_bench_async` on a fresh (uvloop) event loop; not inside a loop."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(run_bench_async(targets, options, progress))
