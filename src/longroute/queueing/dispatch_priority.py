"""Medha's slack policies as one integer per request, for engines that sort by it (vLLM).

vLLM started with ``--scheduling-policy priority`` serves its waiting requests in
the order of an integer ``priority`` in the request body (lower first, ties by
arrival) and keeps the number it was given. :class:`DispatchPriority` turns the
key of a slack policy of :mod:`longroute.queueing.slack` into that integer at the
moment a request is dispatched (``now_s``, on the clock whose origin is the
dispatcher's start: a fixed epoch, so the numbers are small and monotonic):

* ``edf``: D = arrival + TTFT deadline, in integer milliseconds. Exact: D does
  not change, so vLLM's order is EDF's at every instant.
* ``lrs``: D - w, with w the predicted prefill time of the whole prompt (a request
  being dispatched has computed nothing), in integer milliseconds. Exact: the
  slack D - t - w orders as D - w at every t.
* ``lars``: rho = (D - now - w) / w_total at dispatch, in thousandths
  (:data:`LARS_SCALE`). **A snapshot**: rho falls at rate 1 / w_total, faster for
  short requests, so the true LARS order changes with time, and two requests
  dispatched at different times are compared by values taken at different
  times; the engine never re-evaluates them.

The keys are the policies' own (``priority`` of an EDF, LRS or LARS queue built
with the same parameters), so the deadline rule, the default deadline of a
request without a TTFT SLO and the arithmetic are those of the simulator's
engines. The remaining work comes from a :class:`RemainingWork`; the gateway uses
:class:`LinearPrefill` (seconds per prompt token), since it has no runtime
predictor of its backends. Every result is bounded to +-:data:`MAX_PRIORITY`.
Pure: no clock, no state; the same request and time give the same integer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longroute.errors import did_you_mean
from longroute.queueing.base import QUEUE_POLICIES, QueuePolicy
from longroute.queueing.slack import RemainingWork
from longroute.types import Request

DISPATCH_POLICIES = ("edf", "lrs", "lars")
"""The slack policies a dispatcher can express as one integer."""

MAX_PRIORITY = 2**53 - 1
"""Largest magnitude sent: exact as an int64 (vLLM's bound) and as a JSON number
that a client reads as a double."""

MS_PER_S = 1000.0
LARS_SCALE = 1000.0
"""LARS sends rho in thousandths: 0.001 of relative slack is the finest step."""


def bound_priority(value: float) -> int:
    """``value`` rounded and clamped to +-MAX_PRIORITY; NaN (never produced from valid
    inputs) is served last."""
    if math.isnan(value):
        return MAX_PRIORITY
    if value >= MAX_PRIORITY:
        return MAX_PRIORITY
    if value <= -MAX_PRIORITY:
        return -MAX_PRIORITY
    return round(value)


@dataclass(frozen=True, slots=True)
class LinearPrefill:
    """Prefill work linear in the prompt: ``seconds_per_token`` per prompt token.

    A :class:`~longroute.queueing.slack.RemainingWork` for a dispatcher without a
    runtime predictor. It ignores attention's growth with context, so set the rate
    from prompts of the length that matters (the long ones, for LARS).
    """

    seconds_per_token: float

    def __post_init__(self) -> None:
        rate = self.seconds_per_token
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise ValueError(f"seconds_per_token must be a number, got {rate!r}")
        if not (0.0 < rate <= 1.0):  # also rejects NaN
            raise ValueError(f"seconds_per_token must be in (0, 1], got {rate}")

    def prefill_s(self, num_tokens: int) -> float:
        return max(num_tokens, 0) * self.seconds_per_token

    def remaining_s(self, total_tokens: int, done_tokens: int) -> float:
        return max(total_tokens - done_tokens, 0) * self.seconds_per_token


@dataclass(frozen=True, slots=True)
class _Dispatched:
    """A request as the slack policies see an item: nothing computed yet."""

    request: Request
    arrival_s: float


class DispatchPriority:
    """The integer priority of a request under one slack policy, at dispatch.

    ``params`` are the policy's (``default_ttft_s``, ``default_ttft_work_factor``),
    as in a scenario's ``queue_policy_params``; ``remaining_work`` is required by
    ``lrs`` and ``lars`` and optional for ``edf`` (with it, a request without an
    SLO gets the work-scaled default deadline, as in the simulator). Raises
    ValueError naming the problem (an unknown policy with a suggestion, a bad
    parameter, a missing ``remaining_work``).
    """

    __slots__ = ("_is_snapshot", "_queue", "policy")

    def __init__(
        self,
        policy: str,
        params: Mapping[str, Any] | None = None,
        remaining_work: RemainingWork | None = None,
    ) -> None:
        check_dispatch_policy(policy)
        if remaining_work is None and policy != "edf":
            raise ValueError(
                f"{policy} needs each request's predicted prefill time: give the backend's "
                "prefill seconds per prompt token"
            )
        self.policy = policy
        self._queue: QueuePolicy = QUEUE_POLICIES.build(
            policy, params, remaining_work=remaining_work
        )
        self._is_snapshot = bool(getattr(self._queue, "is_time_varying", False))

    @property
    def is_snapshot(self) -> bool:
        """True when the key changes with time (LARS): the integer holds at dispatch only."""
        return self._is_snapshot

    def key(self, request: Request, now_s: float) -> float:
        """The policy's key in its own unit (seconds for EDF and LRS, rho for LARS)."""
        item = _Dispatched(request, request.arrival_s)
        # EDF and LRS: the time-invariant part of the key (D, D - w), the same at any now
        return self._queue.priority(item, now_s if self._is_snapshot else 0.0)

    def priority(self, request: Request, now_s: float) -> int:
        """The integer to send: lower is served first."""
        scale = LARS_SCALE if self._is_snapshot else MS_PER_S
        return bound_priority(self.key(request, now_s) * scale)


def check_dispatch_policy(policy: str) -> None:
    """ValueError (with a suggestion and the valid names) unless ``policy`` can be sent."""
    if policy not in DISPATCH_POLICIES:
        raise ValueError(
            f"unknown priority policy {policy!r}{did_you_mean(policy, DISPATCH_POLICIES)}; "
            f"valid: {', '.join(DISPATCH_POLICIES)}"
        )
