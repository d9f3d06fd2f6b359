"""What the subcommands say on stderr besides errors: where their files went.

Report paths go to stderr (docs/simulate.md), also under ``--json``, whose stdout
holds the JSON object alone: a script reads the object and still learns where
the files are. A path stays on one line whatever its length, so that it can be
grepped and copied.
"""

from __future__ import annotations

from rich.console import Console


def print_report_path(line: str) -> None:
    """``line`` (e.g. ``report: reports/default (5 files)``) on stderr, unwrapped and taken
    literally (a ``[`` in a path is not markup)."""
    Console(stderr=True, soft_wrap=True).print(line, markup=False, highlight=False)


__all__ = ["print_report_path"]
