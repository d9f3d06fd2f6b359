"""The OpenAI-compatible gateway (``longroute serve``): the simulator's routers, live.

Importing this package starts nothing; :class:`Gateway` builds the gateway,
:func:`serve_gateway` runs one for an ``async with`` block, and
:func:`longroute.gateway.cli.serve_command` runs it until interrupted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute._lazy import lazy_exports

if TYPE_CHECKING:
    from longroute.gateway.app import Gateway, RunningGateway, serve_gateway
    from longroute.gateway.config import GatewayConfig, load_gateway_config, parse_gateway_config
    from longroute.gateway.secrets import GatewaySecrets, resolve_secrets

# imported on first use, so `longroute --help` does not pay for this package (PEP 562)
_LAZY = {
    "Gateway": "longroute.gateway.app",
    "RunningGateway": "longroute.gateway.app",
    "serve_gateway": "longroute.gateway.app",
    "GatewayConfig": "longroute.gateway.config",
    "GatewaySecrets": "longroute.gateway.secrets",
    "load_gateway_config": "longroute.gateway.config",
    "parse_gateway_config": "longroute.gateway.config",
    "resolve_secrets": "longroute.gateway.secrets",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "Gateway",
    "GatewayConfig",
    "GatewaySecrets",
    "RunningGateway",
    "load_gateway_config",
    "parse_gateway_config",
    "resolve_secrets",
    "serve_gateway",
]
