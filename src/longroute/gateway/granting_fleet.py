"""The gateway's fleet view: a grant's candidate list is computed once per decision.

:meth:`~longroute.gateway.admission.Admission.try_grant` reads the candidates
to find a free slot, then asks the router, which reads them again (every router
starts with ``fleet.candidates``). Nothing changes the fleet in between, so
while the router decides, admission pins the list it computed to the request
object and the router's call returns it: the list itself, since no router
changes the list it is given and admission is done with it. Any other call
(another request, or none pinned) computes the list as :class:`FleetView` does.
"""

from __future__ import annotations

from longroute.routing.fleet_view import FleetView
from longroute.types import EndpointState, Request


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
