"""The gateway's fleet view: a grant's candidate list is computed once per decision, and
a long prompt's blocks reach the prefix index when the loop would otherwise wait.

:meth:`~longroute.gateway.admission.Admission.try_grant` reads the candidates
to find a free slot, then asks the router, which reads them again (every router
starts with ``fleet.candidates``). Nothing changes the fleet in between, so
while the router decides, admission pins the list it computed to the request
object and the router's call returns it: the list itself, since no router
changes the list it is given and admission is done with it. Any other call
(another request, or none pinned) computes the list as :class:`FleetView` does.

Inserting a prompt's blocks into the prefix index costs about 0.5 to 2 us a block
(and as much again for the old blocks it evicts: dict and ``OrderedDict`` entries,
mostly cache misses once the index is large): 7 to 20 ms for a 500 KB prompt
(7,800 blocks of 16 pseudo-tokens), which the router does not need to decide (it
has matched already) and the engine does not need to start. So from
``DEFERRED_INSERT_BLOCKS`` blocks up the insert waits, with the ``now_s`` of its
dispatch, until the first of:

* a read of :attr:`prefix_index` (every router's, the metrics', a reload's): pending
  inserts are applied first, in dispatch order, so every decision sees every prompt
  dispatched before it, as if each had been inserted at its dispatch (the
  simulator's order; the same index state);
* an answer's end (:meth:`record_complete`, at the loop's next turn: the answer is
  written by then), so an engine that answers at once is not kept waiting by it;
* ``LATE_INSERT_DELAY_S`` after the dispatch, so against an engine still
  prefilling it runs while the gateway waits, not on the next request's path;
* ``MAX_PENDING_INSERTS`` waiting (then at once: the list is bounded).

An endpoint a reload retires before its insert ran is skipped (it takes no new
requests; its holdings are forgotten when its last one ends). Shorter prompts,
whose insert costs less than the scheduling is worth, are inserted at once, and so
is every prompt without a running event loop (a synchronous caller).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from longroute.prefix.precise_index import PrecisePrefixIndex
from longroute.prefix.router_index import RouterPrefixIndex
from longroute.routing.fleet_view import FleetView
from longroute.types import Endpoint, EndpointState, Request

DEFERRED_INSERT_BLOCKS = 256
"""Blocks from which the prefix-index insert waits (~0.1 ms of insert below it: 4,096
tokens at 16 a block)."""
LATE_INSERT_DELAY_S = 0.02
"""The longest a waiting insert waits for an answer's end: longer than an answer that
comes at once takes to be relayed, shorter than a long prompt's prefill."""
MAX_PENDING_INSERTS = 64
"""Waiting inserts beyond which they are applied at once."""


class LateFlush:
    """When waiting work (``apply``) runs: :meth:`after_dispatch` at the latest
    ``LATE_INSERT_DELAY_S`` later, :meth:`after_answer` at the loop's next turn (the
    answer is written by then); without a running loop (a synchronous caller), at once.
    Used by the fleet's prefix index and by a router's deferred inserts (admission)."""

    __slots__ = ("_apply", "_handle")

    def __init__(self, apply: Callable[[], None]) -> None:
        self._apply = apply
        self._handle: asyncio.Handle | None = None

    def after_dispatch(self) -> None:
        """Work was queued: run it within the delay (a pending run stays as it is)."""
        if self._handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # nothing to overlap with
            self._apply()
        else:
            self._handle = loop.call_later(LATE_INSERT_DELAY_S, self._run)

    def after_answer(self) -> None:
        """An answer ended: run the work at the loop's next turn."""
        self.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # the loop is gone: nothing left to wait for
            self._apply()
        else:
            self._handle = loop.call_soon(self._run)

    def cancel(self) -> None:
        """The work ran some other way: nothing is due."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _run(self) -> None:
        self._handle = None
        self._apply()


class GrantingFleet(FleetView):
    """A :class:`FleetView` whose candidate list can be pinned for one routing call, and
    whose long prompts reach the prefix index when the loop would otherwise wait."""

    _pinned_request: Request | None = None
    _pinned: list[EndpointState] | None = None
    _index: RouterPrefixIndex | PrecisePrefixIndex
    _late: LateFlush | None = None

    @property
    def prefix_index(self) -> RouterPrefixIndex | PrecisePrefixIndex:
        """The index, with every waiting insert applied first (see the module doc)."""
        if self._pending:
            self.apply_pending_inserts()
        return self._index

    @prefix_index.setter
    def prefix_index(self, index: RouterPrefixIndex | PrecisePrefixIndex) -> None:
        self._index = index
        self._pending: list[tuple[Request, str, float]] = []

    @property
    def num_pending_inserts(self) -> int:
        """Dispatched prompts whose blocks the index has not taken yet (applies none)."""
        return len(self._pending)

    def candidates(self, request: Request) -> list[EndpointState]:
        pinned = self._pinned
        if pinned is not None and request is self._pinned_request:
            return pinned
        return FleetView.candidates(self, request)

    def pin(self, request: Request, candidates: list[EndpointState]) -> None:
        """``candidates(request)`` returns ``candidates`` until :meth:`unpin`."""
        self._pinned_request = request
        self._pinned = candidates

    def unpin(self) -> None:
        self._pinned_request = self._pinned = None

    def record_holdings(self, request: Request, endpoint: str, now_s: float) -> None:
        if len(request.block_hashes) < DEFERRED_INSERT_BLOCKS or not self.is_prefix_index_enabled:
            FleetView.record_holdings(self, request, endpoint, now_s)
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing to overlap with
            FleetView.record_holdings(self, request, endpoint, now_s)
            return
        self._pending.append((request, endpoint, now_s))
        if len(self._pending) >= MAX_PENDING_INSERTS:
            self.apply_pending_inserts()
        else:
            self._late_flush().after_dispatch()

    def record_complete(self, request: Request, endpoint: str, is_prefill_counted: bool) -> None:
        FleetView.record_complete(self, request, endpoint, is_prefill_counted)
        if self._pending:  # after this turn: the answer is written by then
            self._late_flush().after_answer()

    def _late_flush(self) -> LateFlush:
        late = self._late
        if late is None:
            late = self._late = LateFlush(self.apply_pending_inserts)
        return late

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> list[str]:
        names = {e.name for e in endpoints}  # an endpoint retired now learns nothing more
        self._pending = [entry for entry in self._pending if entry[1] in names]
        return FleetView.set_endpoints(self, endpoints)

    def apply_pending_inserts(self) -> None:
        """Insert every waiting prompt's blocks, in dispatch order; O(their blocks)."""
        if self._late is not None:
            self._late.cancel()
        pending, self._pending = self._pending, []
        index = self._index
        for request, endpoint, now_s in pending:
            if endpoint in self._by_name:  # not retired by a reload meanwhile
                index.insert(request.block_hashes, endpoint, now_s)
