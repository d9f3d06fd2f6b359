"""The router seam.

A router is called once per request attempt:

* ``route(request, fleet, now_s)`` picks an endpoint among
  ``fleet.candidates(request)`` and returns a :class:`RouteDecision` with the
  per-endpoint scores that explain the choice. It must not do I/O or read a
  wall clock; randomness comes only from the ``rng`` given at construction.
* ``on_dispatch`` is called right after the request was sent to the chosen
  endpoint, ``on_complete`` when its last token came back (or it failed).
  They update router-side state (e.g. learned weights); the fleet view's own
  counters and prefix index are updated by its owner, not by routers.

The same router objects run in the simulator and the gateway.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from longroute.registry import Registry
from longroute.routing.fleet_view import FleetView, NoCandidateError
from longroute.types import Endpoint, Request, RouteDecision


class Router(Protocol):
    name: str
    needs_prefix_index: bool
    needs_language: bool

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision: ...

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None: ...

    def on_first_token(self, request: Request, endpoint: str, now_s: float) -> None: ...

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None: ...


class BaseRouter:
    """Convenience base: no-op hooks and an injected RNG.

    ``needs_prefix_index`` tells the fleet view's owner whether to keep the
    router-side prefix index up to date (it costs time per dispatch);
    ``needs_language`` tells the gateway whether to detect each prompt's
    language (the simulator's workloads carry it anyway);
    ``needs_observed_length`` tells the gateway whether :meth:`on_complete` reads the
    answer's length (``request.num_output_tokens``), so that it hands over a request
    carrying the observed one (a copy per request, only where it is read).
    """

    name = "base"
    needs_prefix_index = False
    needs_language = False
    needs_observed_length = False

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random(0)

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        return None

    def on_first_token(self, request: Request, endpoint: str, now_s: float) -> None:
        return None

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None:
        return None

    def check_endpoints(self, endpoints: Sequence[Endpoint]) -> list[str]:
        """What this router needs of the endpoints it will serve, checked before it serves
        them (the gateway calls it at start-up and on every reload, so it knows no router
        by name): ``ValueError`` naming the first endpoint it cannot serve, else notes for
        the operator (an endpoint priced from a prior, say). Needs nothing by default."""
        return []


ROUTERS: Registry[Router] = Registry("router", code_params=("rng",))

__all__ = ["ROUTERS", "BaseRouter", "NoCandidateError", "Router", "pick_min"]


def pick_min(scores: dict[str, float]) -> str:
    """The endpoint with the lowest score; ties go to the first in fleet order."""
    best_name = ""
    best = float("inf")
    for name, score in scores.items():
        if score < best:
            best, best_name = score, name
    if not best_name:
        raise NoCandidateError("no candidate endpoint to choose from")
    return best_name
