"""The gateway's fleet view: a grant's candidate list is computed once per decision, and
a long prompt's blocks reach the prefix index after the request is on its way.

:meth:`~longroute.gateway.admission.Admission.try_grant` reads the candidates
to find a free slot, then asks the router, which reads them again (every router
starts with ``fleet.candidates``). Nothing changes the fleet in between, so
while the router decides, admission pins the list it computed to the request
object and the router's call returns it: the list itself, since no router
changes the list it is given and admission is done with it. Any other call
(another request, or none pinned) computes the list as :class:`FleetView` does.

Inserting a prompt's blocks into the prefix index costs about 0.5 us a block
(and as much again for the old blocks it evicts): some 7 ms for a 500 KB prompt
(7,800 blocks of 16 pseudo-tokens), which the router does not need to decide
(it has matched already) and the engine does not need to start. So from
``DEFERRED_INSERT_BLOCKS`` blocks up the insert is scheduled with ``call_soon``
and runs at the event loop's next turn, once the proxy has written the request
and waits for the answer: the request's own latency no longer carries it. A
request routed in between does not see those blocks (as if the two had arrived
together), and an endpoint a reload retired by then is skipped. Shorter prompts,
whose insert costs less than the scheduling is worth, are inserted at once.
"""

from __future__ import annotations

import asyncio

from longroute.routing.fleet_view import FleetView
from longroute.types import EndpointState, Request

DEFERRED_INSERT_BLOCKS = 256
"""Blocks from which the prefix-index insert waits for the loop's next turn (~0.1 ms
of insert below it: 4,096 tokens at 16 a block)."""


class GrantingFleet(FleetView):
    """A :class:`FleetView` whose candidate list can be pinned for one routing call."""

    _pinned_request: Request | None = None
    _pinned: list[EndpointState] | None = None

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
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing to overlap with
            FleetView.record_holdings(self, request, endpoint, now_s)
            return
        loop.call_soon(self._late_holdings, request, endpoint, now_s)

    def _late_holdings(self, request: Request, endpoint: str, now_s: float) -> None:
        if endpoint in self._by_name:  # not retired by a reload meanwhile
            FleetView.record_holdings(self, request, endpoint, now_s)
