"""Session affinity by consistent hashing of the session key over the candidates."""

from __future__ import annotations

import bisect
import hashlib
import random

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision

_RING_SIZE = float(2**64)


def stable_hash64(key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process and run."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class _Ring:
    """Sorted virtual-node points of one candidate set; lookups are O(log points)."""

    __slots__ = ("names", "owners", "points")

    def __init__(self, names: tuple[str, ...], num_virtual_nodes: int) -> None:
        pairs = sorted(
            (stable_hash64(f"{name}#{i}"), name) for name in names for i in range(num_virtual_nodes)
        )
        self.names = names
        self.points = [p for p, _ in pairs]
        self.owners = [n for _, n in pairs]

    def distances(self, key_point: int) -> tuple[str, dict[str, float]]:
        """The owner of ``key_point`` and each name's clockwise distance (ring fraction)."""
        points, owners = self.points, self.owners
        n_points = len(points)
        start = bisect.bisect_left(points, key_point)
        found: dict[str, float] = {}
        for step in range(n_points):
            i = (start + step) % n_points
            name = owners[i]
            if name not in found:
                found[name] = ((points[i] - key_point) % 2**64) / _RING_SIZE
                if len(found) == len(self.names):
                    break
        return owners[start % n_points], {name: found[name] for name in self.names}


@ROUTERS.register("session-affinity")
class SessionAffinityRouter(BaseRouter):
    """Keeps a session on one endpoint with a consistent-hash ring.

    The session key is ``request.session_id``, else ``program_id``, else
    ``request_id``. The ring holds ``num_virtual_nodes`` points per candidate
    (blake2b of ``"name#i"``); a key goes to the first point clockwise. While
    the candidate set is unchanged a key always lands on the same endpoint;
    removing an endpoint moves only the keys it owned. Rings are cached per
    candidate-name tuple (at most ``max_cached_rings``, oldest dropped first).
    Called once per request attempt; O(log points) plus the walk for scores
    (about candidates x log candidates points).
    """

    name = "session-affinity"

    def __init__(
        self,
        *,
        num_virtual_nodes: int = 100,
        max_cached_rings: int = 64,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        if num_virtual_nodes < 1:
            raise ValueError(f"num_virtual_nodes must be >= 1, got {num_virtual_nodes}")
        if max_cached_rings < 1:
            raise ValueError(f"max_cached_rings must be >= 1, got {max_cached_rings}")
        self.num_virtual_nodes = num_virtual_nodes
        self.max_cached_rings = max_cached_rings
        self._rings: dict[tuple[str, ...], _Ring] = {}

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        names = tuple(s.endpoint.name for s in fleet.candidates(request))
        ring = self._ring(names)
        key = request.session_id or request.program_id or request.request_id
        chosen, scores = ring.distances(stable_hash64(key))
        return RouteDecision(
            endpoint=chosen,
            scores=scores,
            score_meaning=(
                "clockwise ring distance (fraction of the ring) from the session key to the "
                "endpoint's nearest virtual node; lowest owns the session, next lowest is "
                "its fallback"
            ),
            reason=f"consistent hash of session key {key!r} over {len(names)} candidates",
        )

    def _ring(self, names: tuple[str, ...]) -> _Ring:
        ring = self._rings.get(names)
        if ring is None:
            if len(self._rings) >= self.max_cached_rings:
                del self._rings[next(iter(self._rings))]
            ring = _Ring(names, self.num_virtual_nodes)
            self._rings[names] = ring
        return ring
