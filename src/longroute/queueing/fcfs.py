"""First come, first served: O(1) push, peek and pop on a deque."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from longroute.queueing.base import QUEUE_POLICIES

if TYPE_CHECKING:
    from longroute.queueing.slack import RemainingWork


@QUEUE_POLICIES.register("fcfs")
class FCFSQueue:
    """Arrival order; preempted items return to the front (vLLM's behaviour)."""

    __slots__ = ("_items",)

    is_preemptive = False

    def __init__(self, remaining_work: RemainingWork | None = None) -> None:
        """``remaining_work`` is accepted (longroute passes it to every policy) and unused."""
        self._items: deque[Any] = deque()

    def push(self, item: Any, now_s: float) -> None:
        self._items.append(item)

    def push_front(self, item: Any, now_s: float) -> None:
        self._items.appendleft(item)

    def peek(self, now_s: float) -> Any | None:
        return self._items[0] if self._items else None

    def pop(self, now_s: float) -> Any:
        return self._items.popleft()

    def remove(self, item: Any) -> bool:
        """O(n), and only on an abort."""
        try:
            self._items.remove(item)
        except ValueError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._items)

    def priority(self, item: Any, now_s: float) -> float:
        """Arrival time: earlier first."""
        return float(item.arrival_s)

    def relative_slack(self, item: Any, now_s: float) -> float | None:
        """FCFS has no notion of slack."""
        return None
