"""``longroute bench``'s progress bar: one line per target, requests done and failed.

A :class:`~longroute.bench.runner.BenchProgress` drawn with the commands' shared
bar (:func:`longroute.progress.progress_bar`: stderr, terminal only). With
``--duration-s`` the bar is the time against the duration; otherwise it is the
requests done against the most the target will be sent, when known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.progress import Progress, TaskID

from longroute.progress import progress_bar


class BenchBar:
    """Context manager; pass it to ``run_bench`` as ``progress``."""

    def __init__(
        self, duration_s: float | None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._duration_s = duration_s
        self._clock = clock
        counter = "{task.fields[answered]} answered, {task.fields[failed]} failed"
        if duration_s is not None:
            counter += f", stops at {duration_s:g} s"
        self.progress: Progress = progress_bar(counter)
        self._tasks: dict[str, TaskID] = {}
        self._started_s: dict[str, float] = {}
        self.answered: dict[str, int] = {}
        self.failed: dict[str, int] = {}

    def __enter__(self) -> BenchBar:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def target_started(self, label: str, num_planned: int | None) -> None:
        total = self._duration_s if self._duration_s is not None else num_planned
        self._tasks[label] = self.progress.add_task(
            f"bench {label}", total=total, answered=0, failed=0
        )
        self._started_s[label] = self._clock()
        self.answered[label] = self.failed[label] = 0

    def request_done(self, label: str, is_failed: bool) -> None:
        if is_failed:
            self.failed[label] += 1
        else:
            self.answered[label] += 1
        if self._duration_s is None:
            completed = float(self.answered[label] + self.failed[label])
        else:
            completed = min(self._clock() - self._started_s[label], self._duration_s)
        self.progress.update(
            self._tasks[label],
            completed=completed,
            answered=self.answered[label],
            failed=self.failed[label],
        )


__all__ = ["BenchBar"]
