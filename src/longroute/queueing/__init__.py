"""Queue policies (FCFS now; EDF, LRS, LARS and aging STJF come later)."""

from longroute.queueing import fcfs as _fcfs  # noqa: F401  (registers "fcfs")
from longroute.queueing.base import QUEUE_POLICIES, QueuePolicy

__all__ = ["QUEUE_POLICIES", "QueuePolicy"]
