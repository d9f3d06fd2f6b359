"""What the subcommands say on stderr besides errors: where their files went, and warnings.

Report paths go to stderr (docs/simulate.md), also under ``--json``, whose stdout
holds the JSON object alone: a script reads the object and still learns where
the files are. A path stays on one line whatever its length, so that it can be
grepped and copied (as an ``error:`` naming a file does). A warning is prose:
it is wrapped to the console's width, its lines indented under its first
word, so a long one stays readable in a narrow terminal.
"""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.text import Text


def print_report_path(line: str) -> None:
    """``line`` (e.g. ``report: reports/default (5 files)``) on stderr, unwrapped and taken
    literally (a ``[`` in a path is not markup)."""
    Console(stderr=True, soft_wrap=True).print(line, markup=False, highlight=False)


def print_warning(console: Console, message: str, *, label: str = "warning") -> None:
    """``label: message`` on ``console``, wrapped to its width with a hanging indent;
    ``message`` is plain text (a ``[`` in it is not markup)."""
    prefix = f"{label}: "
    lines = textwrap.wrap(
        prefix + message,
        width=max(console.width, len(prefix) + 20),
        subsequent_indent=" " * len(prefix),
        break_on_hyphens=False,  # router and endpoint names keep their hyphens whole
    )
    style = "yellow" if label == "warning" else "dim"
    for i, line in enumerate(lines):
        text = Text(line)
        if i == 0:
            text.stylize(style, 0, len(label) + 1)
        console.print(text, soft_wrap=True, highlight=False)


__all__ = ["print_report_path", "print_warning"]
