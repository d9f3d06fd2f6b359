"""Options and progress shared by the multi-seed evaluation benchmarks (gorgo_eval,
ttca_eval): ``--seeds``, ``--jobs``, ``--quick`` and a timed progress line."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from longroute.sweep.spec import parse_seeds


def eval_parser(description: str, seeds: str, quick_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", default=seeds, help="evaluation seeds (at least 5)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser


def checked_seeds(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *specs: str
) -> list[tuple[int, ...]]:
    """``specs`` parsed as seed lists (a bad one exits with the parser's message); also
    refuses ``--jobs`` below 1."""
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        return [parse_seeds(spec) for spec in specs]
    except ValueError as exc:
        parser.error(str(exc))


def progress_printer() -> Callable[[int, int, str], None]:
    """Prints ``[i/total] what (seconds since this call)``, flushed."""
    start = time.perf_counter()

    def progress(i: int, total: int, what: str) -> None:
        print(f"  [{i}/{total}] {what} ({time.perf_counter() - start:.0f} s)", flush=True)

    return progress
