"""Routers: the seam (``base``), the fleet view, and the built-in routers.

Importing this package registers every built-in router in :data:`ROUTERS`,
so ``ROUTERS.build("least-load")`` works right after ``import longroute.routing``.
"""

from __future__ import annotations

import importlib

from longroute.routing.base import ROUTERS, BaseRouter, NoCandidateError, Router, pick_min

BUILTIN_ROUTER_MODULES = (
    "longroute.routing.random_router",
    "longroute.routing.round_robin",
    "longroute.routing.least_request",
    "longroute.routing.least_load",
    "longroute.routing.load_aware",
    "longroute.routing.session_affinity",
    "longroute.routing.prefix_cache",
    "longroute.routing.aibrix_prefix_cache",
    "longroute.routing.laar",
    "longroute.routing.gorgo",
    "longroute.routing.vllm_lb",
    "longroute.routing.mlfq",
    "longroute.routing.ltr",
    "longroute.routing.oracle_stjf",
    "longroute.routing.chimera",
    "longroute.routing.ttca",
)


def load_builtin_routers() -> None:
    """Import the built-in router modules so they register; safe to call any number of times."""
    for module in BUILTIN_ROUTER_MODULES:
        importlib.import_module(module)


load_builtin_routers()

__all__ = [
    "BUILTIN_ROUTER_MODULES",
    "ROUTERS",
    "BaseRouter",
    "NoCandidateError",
    "Router",
    "load_builtin_routers",
    "pick_min",
]
