"""Running a grid: cached cells first, the rest on an executor, each stored as it finishes.

:func:`run_grid` returns one result per cell, in the grid's order. A cell
found in the cache is not run again; a finished one is stored at once (so
Ctrl-C, which re-raises from here, keeps every cell finished before it).
``on_result`` is called once per cell, cached ones included, for progress.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longroute.sweep.cache import CellCache, cell_key
from longroute.sweep.cell import Cell, CellResult, execute_cell
from longroute.sweep.executors import CellFn, Executor
from longroute.sweep.grid import Grid

Progress = Callable[[Cell, CellResult], None]


@dataclass(frozen=True, slots=True)
class SweepRun:
    """Every cell's result, in grid order, and how many were computed in this run."""

    grid: Grid
    results: tuple[CellResult, ...]
    num_computed: int
    executor: str

    @property
    def num_failed(self) -> int:
        return sum(not r.is_ok for r in self.results)

    @property
    def num_cached(self) -> int:
        return sum(r.is_cached for r in self.results)

    def failures(self) -> list[tuple[Cell, str]]:
        return [
            (cell, result.error or "failed")
            for cell, result in zip(self.grid.cells, self.results, strict=True)
            if not result.is_ok
        ]


def run_grid(
    grid: Grid,
    executor: Executor,
    *,
    cache: CellCache | None = None,
    on_result: Progress | None = None,
    fn: CellFn = execute_cell,
) -> SweepRun:
    """Every cell's result; only cells missing from ``cache`` are handed to ``executor``."""
    cells = grid.cells
    results: list[CellResult | None] = [None] * len(cells)
    keys = [cell_key(c) for c in cells] if cache is not None else []
    todo: list[int] = []
    for index, cell in enumerate(cells):
        hit = cache.get(keys[index]) if cache is not None else None
        if hit is None:
            todo.append(index)
            continue
        results[index] = hit
        if on_result is not None:
            on_result(cell, hit)

    def finished(position: int, result: CellResult) -> None:
        index = todo[position]
        results[index] = result
        if cache is not None:
            cache.put(keys[index], cells[index], result)
        if on_result is not None:
            on_result(cells[index], result)

    executor.run([cells[i] for i in todo], finished, fn)
    missing = [cells[i].describe() for i, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"executor {executor.name} returned no result for {missing[:3]}")
    return SweepRun(grid, tuple(r for r in results if r is not None), len(todo), executor.name)


__all__ = ["SweepRun", "run_grid"]
