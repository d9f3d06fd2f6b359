"""The queue-policy seam: which waiting request an engine (or gateway) serves next.

A policy holds *items* (the engine's sequence objects; they expose at least
``request`` and ``arrival_s``) and is asked at each scheduling point for the
head. Priorities may depend on ``now_s`` (slack shrinks with time), so a
policy may re-evaluate them on every ``peek``. ``priority`` ranks any item,
queued or not, by the same rule: the engine re-orders its prefills in progress
by it every iteration and evicts the highest under KV pressure.

Policies are built with ``QUEUE_POLICIES.build(name, params, remaining_work=...)``:
``remaining_work`` (a remaining-prefill-time table) is passed by code, never by
config; policies that do not use it accept and ignore it.

Called by: the engine scheduler, once per iteration while it admits work.
"""

from __future__ import annotations

from typing import Any, Protocol

from longroute.registry import Registry


class QueuePolicy(Protocol):
    @property
    def is_preemptive(self) -> bool:
        """Re-order prefills in progress by ``priority`` every iteration (slack policies)."""
        ...

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

    def priority(self, item: Any, now_s: float) -> float:
        """Rank of ``item`` at ``now_s`` (queued or not): lower is served first."""
        ...

    def relative_slack(self, item: Any, now_s: float) -> float | None:
        """Medha's rho = slack / whole prefill time, or None when the policy has none."""
        ...


QUEUE_POLICIES: Registry[QueuePolicy] = Registry("queue policy", code_params=("remaining_work",))
