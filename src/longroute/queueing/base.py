"""The queue-policy seam: which waiting request an engine (or gateway) serves next.

A policy holds *items* (the engine's sequence objects; they expose at least
``request`` and ``arrival_s``) and is asked at each scheduling point for the
head. Priorities may depend on ``now_s`` (slack shrinks with time), so a
policy may re-evaluate them on every ``peek``.

Called by: the engine scheduler, once per iteration while it admits work.
"""

from __future__ import annotations

from typing import Any, Protocol

from longroute.registry import Registry


class QueuePolicy(Protocol):
    def push(self, item: Any, now_s: float) -> None:
        """A new item arrived."""
        ...

    def push_front(self, item: Any, now_s: float) -> None:
        """A preempted item comes back; FCFS puts it ahead of everything."""
        ...

    def peek(self, now_s: float) -> Any | None:
        """The item to admit next, or None if empty."""
        ...

    def pop(self, now_s: float) -> Any:
        """Remove and return what ``peek`` returned."""
        ...

    def remove(self, item: Any) -> bool:
        """Take ``item`` out (its client went away); False if it is not queued."""
        ...

    def __len__(self) -> int: ...


QUEUE_POLICIES: Registry[QueuePolicy] = Registry("queue policy")
