"""Active RTT probes: time a cheap GET to each backend and keep an EWMA in the FleetView."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp

from longroute.estimators.rtt import RttEwma
from longroute.gateway.backends import Backend
from longroute.gateway.health import PROBE_ERRORS, ReachabilityLog, probe_error_kind
from longroute.routing.fleet_view import FleetView


class RttProber:
    """Every ``interval_s``, GETs each backend's health path over a pooled keep-alive
    connection (no handshake, so the sample is one HTTP round trip) and folds the
    time into that backend's :class:`RttEwma`, seeded by its first sample.

    The first successful probe of a backend only opens its connection: it pays
    the TCP (and TLS) handshake and the client's first-request set-up, tens of
    ms even on loopback, so it is not a round-trip sample; seeding the EWMA with
    it made the estimate start several times too high and take minutes to
    come down. Right after it, a second probe seeds the estimate.
    Failed probes give no sample; they are logged once per change.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        fleet: FleetView,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self.backends = backends
        self.fleet = fleet
        self.estimates: dict[str, RttEwma] = {}
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._reachability = ReachabilityLog("RTT probe")
        self._connected: set[str] = set()

    def set_backends(self, backends: Mapping[str, Backend], interval_s: float) -> None:
        """A reload: the backends probed from the next round on. A backend that stays keeps
        its estimate; one whose URL changed starts over; one that left is forgotten."""
        for name, old in self.backends.items():
            new = backends.get(name)
            if new is None or new.health_url != old.health_url:
                self.estimates.pop(name, None)
                self._connected.discard(name)
                self._reachability.forget(name)
        self.backends = backends
        self._interval_s = interval_s

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Probe forever; cancelled at shutdown."""
        while True:
            await asyncio.gather(*(self.probe(session, b) for b in self.backends.values()))
            await asyncio.sleep(self._interval_s)

    async def probe(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        started_s = time.perf_counter()
        try:
            async with session.get(
                backend.health_url, headers=backend.probe_headers, timeout=self._timeout
            ) as response:
                await response.read()
        except PROBE_ERRORS as exc:
            self._reachability.update(backend.name, False, _probe_failure(exc, self._timeout))
            return
        if self.backends.get(backend.name) is not backend:
            return  # a reload changed or removed it while this probe was out
        self._reachability.update(backend.name, True)
        if backend.name not in self._connected:
            self._connected.add(backend.name)  # warm-up: the connection, not a round trip
            await self.probe(session, backend)
            return
        sample_ms = (time.perf_counter() - started_s) * 1000.0
        estimate = self.estimates.get(backend.name)
        if estimate is None:
            estimate = self.estimates[backend.name] = RttEwma(prior_ms=sample_ms)
        self.fleet.set_rtt(backend.name, estimate.update(sample_ms))


def _probe_failure(exc: BaseException, timeout: aiohttp.ClientTimeout) -> str:
    """What a failed probe saw, without the backend's address (see probe_error_kind)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout.total:g} s"
    return probe_error_kind(exc)
