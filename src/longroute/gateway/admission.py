"""Admission: per-backend concurrency slots, a bounded gateway queue, and the routing call.

A request is routed only when at least one of its eligible backends
(healthy, serving its model, fitting its context, not already failed for
it) has a free slot; the router then decides among all candidates, and if
it picks a full or excluded backend the request goes to the eligible
backend with a free slot that the router scored best (every router's
scores are "lower is better"; ties in fleet order). Dispatch is recorded
in the FleetView at once, so the next decision sees the load.

Waiting requests sit in one queue per requested model key (a served model
or ``auto``), each ordered by the configured queue policy (FCFS by
default), so a burst for one model cannot block another. Whenever a slot
frees or health changes, :meth:`Admission.wake` serves queue heads, the
earliest-arrived servable head first, until no head can be served. A head
with no eligible backend left fails at once rather than waiting. Timed-out
and cancelled waiters leave an FCFS queue lazily when they reach its head
(O(1) each; they time out in arrival order anyway) and any other queue at
once (``remove``, O(log n) or better), since a priority order may never bring
them to the head; ``num_waiting`` counts only live ones.

Priorities (Chimera, LTR, MLFQ): a router with ``queue_priority(request)``
gives a request that has to wait its scheduling key (Chimera: ŷ, the predicted
remaining output of its workflow) before it is queued, so the ``priority`` and
``stjf`` queue policies serve waiting requests shortest (total) job first.
Aging: a queue with ``observe_iterations`` (``stjf``) is told of every
*scheduling round*, one grant of a waiting request from that queue, so a
request passed over ``starvation_threshold`` times is promoted ahead of
every shorter one. Requests granted without waiting pass no one over and
count no round. Whatever the queue, the request a grant dispatches
(:attr:`Grant.request`: recorded in the fleet view, given to the router's
``on_dispatch`` and sent on by the proxy) carries the routing decision's
``priority`` (Chimera: ŷ on the chosen model, its in-flight volume).

Deferred inserts: a router with ``deferred_inserts`` (ttca's LRUs of the blocks sent
to each backend) inserts a long prompt's blocks at dispatch like the fleet's prefix
index does (``gateway/granting_fleet.py``): from ``DEFERRED_INSERT_BLOCKS`` blocks up
they wait, with their dispatch's time, for the first of a read (the router applies them
first, in dispatch order, so its decisions are those of inserts at dispatch), an
answer's end (at the loop's next turn), ``LATE_INSERT_DELAY_S`` after the dispatch, or
64 waiting; not in front of the request that sent them.

Called by the proxy: :meth:`acquire` before each attempt, :meth:`first_byte`
when the backend's first byte arrives, :meth:`finish` when the attempt ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from longroute.clock import Clock
from longroute.fast_init import fast_init
from longroute.gateway.granting_fleet import (
    DEFERRED_INSERT_BLOCKS,
    GrantingFleet,
    LateFlush,
)
from longroute.queueing import QUEUE_POLICIES, QueuePolicy
from longroute.routing.base import Router
from longroute.routing.fleet_view import AUTO_MODEL, FleetView, NoCandidateError
from longroute.types import Request, RouteDecision


class QueueFullError(Exception):
    """The gateway queue holds ``max_queue`` waiting requests already."""


class QueueTimeoutError(Exception):
    """A request waited ``queue_timeout_s`` without a free slot."""


@fast_init
@dataclass(frozen=True, slots=True)
class Grant:
    """A slot on ``endpoint``, taken for one attempt; give it back with ``finish``.

    ``request`` is the request as dispatched: the one asked for, with the
    decision's ``priority``; pass it to ``first_byte`` and ``finish``."""

    endpoint: str
    decision: RouteDecision
    decision_s: float
    request: Request


class _DeferredInserts(Protocol):
    """What a router's ``deferred_inserts`` offers (ttca's ``HeldBlocks``)."""

    defer_from_blocks: int | None

    @property
    def num_pending(self) -> int: ...

    def apply_pending(self) -> None: ...


class _Waiter:
    __slots__ = ("arrival_s", "excluded", "future", "is_waiting", "key", "request", "timer")

    def __init__(
        self, request: Request, key: str, excluded: Collection[str], future: asyncio.Future[Grant]
    ) -> None:
        self.request = request
        self.key = key
        self.arrival_s = request.arrival_s
        self.excluded = excluded
        self.future = future
        self.is_waiting = True
        self.timer: asyncio.TimerHandle | None = None


class _Queue:
    """One model key's waiting requests: the policy, and its count of scheduling rounds."""

    __slots__ = ("num_rounds", "observe_iterations", "policy")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.num_rounds = 0
        self.observe_iterations: Callable[[int, float], None] | None = getattr(
            policy, "observe_iterations", None
        )


class Admission:
    def __init__(
        self,
        fleet: FleetView,
        router: Router,
        capacities: Mapping[str, int],
        *,
        max_queue: int,
        queue_policy: str,
        clock: Clock,
        observe_decision_s: Callable[[float], None],
        queue_policy_params: Mapping[str, Any] | None = None,
    ) -> None:
        # unknown names and bad parameters fail here, naming the valid ones
        QUEUE_POLICIES.build(queue_policy, queue_policy_params)
        self.fleet = fleet
        self.router = router
        self.max_queue = max_queue
        self.num_waiting = 0
        self._queue_policy = queue_policy
        self._queue_params = dict(queue_policy_params or {})
        self._is_removing = queue_policy != "fcfs"
        self._queue_priority: Callable[[Request], float] | None = getattr(
            router, "queue_priority", None
        )
        self._needs_observed_length = bool(getattr(router, "needs_observed_length", False))
        self._deferred: _DeferredInserts | None = None
        self._late_deferred = LateFlush(self._apply_deferred)
        self._attach_deferred(router)
        self._capacity = dict(capacities)
        self._inflight = dict.fromkeys(capacities, 0)
        self._queues: dict[str, _Queue] = {}
        self._clock = clock
        self._observe_decision_s = observe_decision_s

    # ---- the proxy's calls ---------------------------------------------------
    async def acquire(self, request: Request, excluded: Collection[str], timeout_s: float) -> Grant:
        """A slot for ``request`` on a backend not in ``excluded``, waiting up to ``timeout_s``.

        Raises NoCandidateError (no eligible backend), QueueFullError, QueueTimeoutError.
        """
        grant = self.grant_now(request, excluded)
        if grant is not None:
            return grant
        return await self.wait_for_grant(request, excluded, timeout_s)

    def grant_now(self, request: Request, excluded: Collection[str]) -> Grant | None:
        """:meth:`acquire`'s first step, without a coroutine: a slot now when no request of
        its model waits, else None (then :meth:`wait_for_grant`, in the same turn of the
        loop). Raises NoCandidateError."""
        queue = self._queues.get(AUTO_MODEL if request.model is None else request.model)
        if queue is None:
            queue = self._queue_of(request)[1]
        if self._live_head(queue) is None:
            return self.try_grant(request, excluded)
        return None

    async def wait_for_grant(
        self, request: Request, excluded: Collection[str], timeout_s: float
    ) -> Grant:
        """:meth:`acquire`'s second step, right after :meth:`grant_now` gave None: queues
        ``request`` and waits up to ``timeout_s``. Raises QueueFullError, QueueTimeoutError."""
        key, queue = self._queue_of(request)
        if self.num_waiting >= self.max_queue:
            raise QueueFullError(f"the gateway queue is full ({self.max_queue} waiting)")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(self._prioritised(request), key, excluded, loop.create_future())
        queue.policy.push(waiter, self._clock.now_s())
        self.num_waiting += 1
        waiter.timer = loop.call_later(timeout_s, self._expire, waiter, timeout_s)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise

    def first_byte(self, request: Request, endpoint: str) -> None:
        """The backend started answering: it no longer owes the prompt."""
        self.fleet.record_prefill_done(request, endpoint)
        self.router.on_first_token(request, endpoint, self._clock.now_s())

    def finish(
        self,
        request: Request,
        endpoint: str,
        *,
        has_first_byte: bool,
        is_ok: bool,
        observed_output_tokens: int | None = None,
    ) -> None:
        """The attempt ended (answered, failed or abandoned); frees its slot. The router's
        completion hook sees ``observed_output_tokens`` (the answer's usage) as the
        request's output length where the engine reported it, as in the simulator."""
        self.fleet.record_complete(request, endpoint, is_prefill_counted=not has_first_byte)
        if observed_output_tokens is not None and self._needs_observed_length:
            request = replace(request, num_output_tokens=observed_output_tokens)
        self.router.on_complete(request, endpoint, self._clock.now_s(), is_ok)
        deferred = self._deferred
        if deferred is not None and deferred.num_pending:  # after this turn: answer written
            self._late_deferred.after_answer()
        self._inflight[endpoint] -= 1
        if self.num_waiting:
            self.wake()

    # ---- reload ---------------------------------------------------------------
    def reconfigure(self, router: Router, capacities: Mapping[str, int], max_queue: int) -> None:
        """A reload: the router and backend slots in force from now on. A backend that left
        keeps its in-flight count (its requests finish as usual) with no free slot, until
        :meth:`forget`; waiting requests stay queued and are served at once if they can."""
        self.router = router
        self._queue_priority = getattr(router, "queue_priority", None)
        self._needs_observed_length = bool(getattr(router, "needs_observed_length", False))
        self._attach_deferred(router)
        self.max_queue = max_queue
        for name in self._capacity:
            if name not in capacities:
                self._capacity[name] = 0
        for name, capacity in capacities.items():
            self._capacity[name] = capacity
            self._inflight.setdefault(name, 0)
        self.wake()

    def inflight(self, name: str) -> int:
        """Attempts in flight on backend ``name`` (0 for one never known)."""
        return self._inflight.get(name, 0)

    def forget(self, name: str) -> None:
        """Drops a backend that left, once nothing is in flight there."""
        if self._inflight.get(name, 0) != 0:
            raise ValueError(f"backend {name!r} still has requests in flight")
        self._inflight.pop(name, None)
        self._capacity.pop(name, None)

    # ---- granting ------------------------------------------------------------
    def try_grant(self, request: Request, excluded: Collection[str]) -> Grant | None:
        """Route and take a slot now, or None when every eligible backend is full."""
        inflight, capacity, fleet = self._inflight, self._capacity, self.fleet
        candidates = fleet.candidates(request)
        eligible = [s.endpoint.name for s in candidates if s.endpoint.name not in excluded]
        if not eligible:
            raise NoCandidateError(
                f"every backend for model {request.model!r} already failed for this request"
            )
        free = [name for name in eligible if inflight[name] < capacity[name]]
        if not free:
            return None
        now_s = self._clock.now_s()
        started_s = time.perf_counter()
        if type(fleet) is GrantingFleet:  # the router reads the list just computed
            fleet.pin(request, candidates)
            try:
                decision = self.router.route(request, fleet, now_s)
            finally:
                fleet.unpin()
        else:
            decision = self.router.route(request, fleet, now_s)
        decision_s = time.perf_counter() - started_s
        self._observe_decision_s(decision_s)
        name = decision.endpoint
        if name not in free:
            name = best_scored(decision.scores, free)
        if decision.priority != request.priority:  # the decision's key goes with the request
            request = replace(request, priority=decision.priority)
        inflight[name] += 1
        self.fleet.record_dispatch(request, name, now_s)
        self.router.on_dispatch(request, name, now_s)
        deferred = self._deferred
        if deferred is not None and deferred.num_pending:
            self._late_deferred.after_dispatch()
        return Grant(name, decision, decision_s, request)

    def _attach_deferred(self, router: Router) -> None:
        """Let ``router``'s deferred inserts (if it has any) wait from
        ``DEFERRED_INSERT_BLOCKS`` blocks up; a previous router's are dropped (a reload's new
        router adopted them, applied, where it takes over the old one's state)."""
        deferred: _DeferredInserts | None = getattr(router, "deferred_inserts", None)
        if deferred is not None:
            deferred.defer_from_blocks = DEFERRED_INSERT_BLOCKS
        self._deferred = deferred

    def _apply_deferred(self) -> None:
        if self._deferred is not None:
            self._deferred.apply_pending()

    def wake(self) -> None:
        """Serve queue heads while any can be served; called on free slots and health changes."""
        while self.num_waiting and self._serve_one_head():
            pass

    def _serve_one_head(self) -> bool:
        heads = [(h, q) for q in self._queues.values() if (h := self._live_head(q)) is not None]
        heads.sort(key=lambda pair: pair[0].arrival_s)
        for head, queue in heads:
            try:
                grant = self.try_grant(head.request, head.excluded)
            except NoCandidateError as exc:
                self._pop(head, queue)
                head.future.set_exception(exc)
                return True
            if grant is not None:
                self._pop(head, queue)
                self._count_round(queue)
                head.future.set_result(grant)
                return True
        return False

    def _prioritised(self, request: Request) -> Request:
        """``request`` with the router's queue priority, when it has one (NaN: none)."""
        if self._queue_priority is None:
            return request
        value = float(self._queue_priority(request))
        priority = None if math.isnan(value) else value
        return request if priority == request.priority else replace(request, priority=priority)

    def _count_round(self, queue: _Queue) -> None:
        """One waiting request of ``queue`` was granted: a scheduling round for aging."""
        queue.num_rounds += 1
        if queue.observe_iterations is not None:
            queue.observe_iterations(queue.num_rounds, self._clock.now_s())

    # ---- queue bookkeeping ---------------------------------------------------
    def _queue_of(self, request: Request) -> tuple[str, _Queue]:
        """The queue of ``request``'s model (made on first use) and its key."""
        key = AUTO_MODEL if request.model is None else request.model
        queue = self._queues.get(key)
        if queue is None:
            policy = QUEUE_POLICIES.build(self._queue_policy, self._queue_params)
            queue = self._queues[key] = _Queue(policy)
        return key, queue

    def _live_head(self, queue: _Queue) -> _Waiter | None:
        now_s = self._clock.now_s()
        policy = queue.policy
        while (head := policy.peek(now_s)) is not None:
            if head.is_waiting and not head.future.done():
                return head  # type: ignore[no-any-return]
            self._stop_waiting(head)
            policy.pop(now_s)
        return None

    def _pop(self, waiter: _Waiter, queue: _Queue) -> None:
        queue.policy.pop(self._clock.now_s())
        self._stop_waiting(waiter)

    def _stop_waiting(self, waiter: _Waiter) -> None:
        if waiter.is_waiting:
            waiter.is_waiting = False
            self.num_waiting -= 1
            if waiter.timer is not None:
                waiter.timer.cancel()

    def _leave(self, waiter: _Waiter) -> None:
        """``waiter`` stops waiting before its grant (timed out, or its client left)."""
        if waiter.is_waiting and self._is_removing:
            self._queues[waiter.key].policy.remove(waiter)
        self._stop_waiting(waiter)

    def _expire(self, waiter: _Waiter, timeout_s: float) -> None:
        if waiter.is_waiting and not waiter.future.done():
            self._leave(waiter)
            waiter.future.set_exception(
                QueueTimeoutError(f"no backend slot became free within {timeout_s:g} s")
            )

    def _abandon(self, waiter: _Waiter) -> None:
        """The waiting task was cancelled; give back a slot granted in the meantime."""
        self._leave(waiter)
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            grant = future.result()
            self.finish(grant.request, grant.endpoint, has_first_byte=False, is_ok=False)


def best_scored(scores: Mapping[str, float], allowed: list[str]) -> str:
    """The allowed endpoint with the lowest score; unscored ones rank last, ties keep order."""
    inf = float("inf")
    return min(allowed, key=lambda name: scores.get(name, inf))
