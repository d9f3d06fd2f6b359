"""The progress bar of the commands that take a while: simulate, tune, bench, sweep.

One recipe for all of them: a rich bar on stderr, shown only when stderr is a
terminal, and transient (it disappears when the work is done, leaving the
results). So stdout (the tables, or under ``--json`` the one JSON object) is
never touched, and a log file or a pipe gets no control codes. Each command
feeds the bar from a callback of the work it runs (a router done, a tuner
step, a request answered), so the work itself knows nothing about rich.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def stderr_is_terminal() -> bool:
    """Whether progress is shown (tests patch this to see the bar)."""
    return sys.stderr.isatty()


def progress_bar(counter: str, *, eta: bool = False) -> Progress:
    """A transient bar on stderr: description, bar, ``counter``, elapsed time (and the ETA).

    ``counter`` is a rich ``TextColumn`` format, e.g. ``"{task.completed}/{task.total}
    routers"``; a task's extra fields are ``{task.fields[name]}``. Disabled (it draws
    nothing) unless stderr is a terminal.
    """
    columns: list[ProgressColumn] = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn(counter),
        TimeElapsedColumn(),
    ]
    if eta:
        columns += [TextColumn("ETA"), TimeRemainingColumn()]
    is_shown = stderr_is_terminal()
    return Progress(
        *columns,
        console=Console(stderr=True, force_terminal=is_shown or None),
        transient=True,
        disable=not is_shown,
    )


__all__ = ["progress_bar", "stderr_is_terminal"]
