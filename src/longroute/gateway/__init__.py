"""The OpenAI-compatible gateway (``longroute serve``): the simulator's routers, live.

Importing this package starts nothing; :class:`Gateway` builds the gateway,
:func:`serve_gateway` runs one for an ``async with`` block, and
:func:`longroute.gateway.cli.serve_command` runs it until interrupted.
"""

from longroute.gateway.app import Gateway, RunningGateway, serve_gateway
from longroute.gateway.config import (
    GatewayConfig,
    GatewaySecrets,
    load_gateway_config,
    parse_gateway_config,
    resolve_secrets,
)

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
