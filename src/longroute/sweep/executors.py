"""Where a sweep's cells run: in this process, on a local process pool, or as Ray tasks.

Every executor calls ``on_result(index, result)`` in the calling thread as each
cell finishes, in completion order; the results themselves do not depend on
the executor (a cell is a pure function of its contents). Faults:

- a cell that raises comes back from :func:`~longroute.sweep.cell.execute_cell`
  as a failed result;
- a worker process that dies (killed, out of memory, a crash in native code)
  breaks a ``concurrent.futures`` pool for every cell in flight; those cells
  are rerun one at a time, each in a pool of its own, so only the cell that
  kills its worker again is marked failed and the rest finish;
- on Ray, a task whose worker dies is not retried and is marked failed.

Ctrl-C (KeyboardInterrupt) cancels what has not started, stops the workers
(pool: terminated; Ray: tasks cancelled), and is re-raised: what finished was
already handed to ``on_result``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from longroute.sweep.cell import Cell, CellResult, execute_cell, failed

CellFn = Callable[[Cell], CellResult]
OnResult = Callable[[int, CellResult], None]
WORKER_DIED = (
    "the worker process died while running this cell (killed, out of memory, or a crash); "
    "rerun alone, it died again"
)
RAY_WORKER_DIED = "the Ray worker died while running this cell (killed, out of memory, or a crash)"
_RAY_POLL_S = 0.25


class Executor(Protocol):
    name: str
    num_workers: int

    def run(self, cells: Sequence[Cell], on_result: OnResult, fn: CellFn = ...) -> None: ...


class SerialExecutor:
    """Cells one after another in this process (``--jobs 1``; the benchmark's baseline)."""

    name = "serial"
    num_workers = 1

    def run(self, cells: Sequence[Cell], on_result: OnResult, fn: CellFn = execute_cell) -> None:
        for index, cell in enumerate(cells):
            on_result(index, fn(cell))


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class PoolExecutor:
    """A ``concurrent.futures`` process pool (spawned workers, one per core by default)."""

    name = "pool"

    def __init__(self, num_workers: int | None = None) -> None:
        self.num_workers = num_workers or os.cpu_count() or 1
        self._context = multiprocessing.get_context("spawn")

    def _pool(self, num_workers: int) -> tuple[ProcessPoolExecutor, set[BaseProcess]]:
        """A pool, and the child processes that were there before it (not its workers)."""
        others = set(multiprocessing.active_children())
        pool = ProcessPoolExecutor(num_workers, self._context, initializer=_ignore_sigint)
        return pool, others

    def run(self, cells: Sequence[Cell], on_result: OnResult, fn: CellFn = execute_cell) -> None:
        pending = deque(range(len(cells)))
        while pending:
            suspects = self._run_until_broken(cells, pending, on_result, fn)
            for index in suspects:  # alone, so a death is this cell's own
                on_result(index, self._run_alone(cells[index], fn))

    def _run_until_broken(
        self, cells: Sequence[Cell], pending: deque[int], on_result: OnResult, fn: CellFn
    ) -> list[int]:
        """Run pending cells until done or the pool breaks; returns the cells it broke under."""
        pool, others = self._pool(self.num_workers)
        in_flight: dict[Future[CellResult], int] = {}
        suspects: list[int] = []
        try:
            while pending or in_flight:
                while pending and not suspects and len(in_flight) < 2 * self.num_workers:
                    index = pending.popleft()
                    in_flight[pool.submit(fn, cells[index])] = index
                if not in_flight:
                    break
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    index = in_flight.pop(future)
                    exc = future.exception()
                    if isinstance(exc, BrokenProcessPool):
                        suspects.append(index)
                    elif exc is not None:
                        on_result(index, failed(f"{type(exc).__name__}: {exc}"))
                    else:
                        on_result(index, future.result())
        except BaseException:
            _stop(pool, in_flight, others)
            raise
        pool.shutdown(wait=True)
        return suspects

    def _run_alone(self, cell: Cell, fn: CellFn) -> CellResult:
        pool, others = self._pool(1)
        future = pool.submit(fn, cell)
        try:
            return future.result()
        except BrokenProcessPool:
            return failed(WORKER_DIED)
        except BaseException:
            _stop(pool, {future: 0}, others)
            raise
        finally:
            pool.shutdown(wait=True)


def _stop(
    pool: ProcessPoolExecutor,
    in_flight: dict[Future[CellResult], int],
    others: set[BaseProcess],
) -> None:
    """Cancel what waits, terminate the pool's workers (they ignore SIGINT), reap them;
    child processes that were there before the pool (``others``) are left alone."""
    for future in in_flight:
        future.cancel()
    pool.shutdown(wait=False, cancel_futures=True)
    workers = [c for c in multiprocessing.active_children() if c not in others]
    for child in workers:
        child.terminate()
    for child in workers:
        child.join(timeout=5)


class RayExecutor:
    """Cells as Ray tasks: on ``address`` (a running cluster), else a local Ray started here.

    ``address`` is what ``ray.init`` takes: ``"auto"`` (a cluster started on
    this machine with ``ray start --head``), ``"ray://HOST:10001"`` (Ray
    Client), or ``"HOST:6379"``. Workers must have the same longroute
    installed, and reach any trace file a scenario names at the same path.
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.num_workers = num_cpus or os.cpu_count() or 1

    def run(self, cells: Sequence[Cell], on_result: OnResult, fn: CellFn = execute_cell) -> None:
        import ray  # the optional extra: pip install -e ".[ray]"

        is_started_here = not ray.is_initialized()
        if is_started_here:
            ray.init(**self._init_args())
        resources: dict[str, float] = getattr(ray, "cluster_resources")()  # noqa: B009
        self.num_workers = max(1, int(resources.get("CPU", 1)))
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs: dict[Any, int] = {}
        try:
            refs = {remote.remote(cell): index for index, cell in enumerate(cells)}
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=_RAY_POLL_S)
                for ref in ready:
                    on_result(refs.pop(ref), _ray_result(ray, ref))
        except BaseException:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise
        finally:
            if is_started_here:
                ray.shutdown()

    def _init_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
        }
        if self.address is not None:
            args["address"] = self.address
        elif self.num_cpus is not None:
            args["num_cpus"] = self.num_cpus
        return args


def _ray_result(ray: Any, ref: Any) -> CellResult:
    try:
        result = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if exc.cause is not None else exc
        return failed(f"{type(cause).__name__}: {cause}")
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError):
        return failed(RAY_WORKER_DIED)
    except ray.exceptions.RayError as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    if not isinstance(result, CellResult):
        return failed(f"a Ray task returned {type(result).__name__}, not a cell result")
    return result


__all__ = ["Executor", "PoolExecutor", "RayExecutor", "SerialExecutor"]
