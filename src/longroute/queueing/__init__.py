"""Queue policies: FCFS, Medha's slack-aware EDF, LRS and LARS, vLLM's priority order and
Chimera's STJF with aging."""

from longroute.queueing import fcfs as _fcfs  # noqa: F401  (registers "fcfs")
from longroute.queueing import slack as _slack  # noqa: F401  (registers "edf", "lrs", "lars")
from longroute.queueing import stjf as _stjf  # noqa: F401  (registers "priority", "stjf")
from longroute.queueing.base import QUEUE_POLICIES, QueuePolicy
from longroute.queueing.slack import RemainingWork

__all__ = ["QUEUE_POLICIES", "QueuePolicy", "RemainingWork"]
