"""The OpenAI-compatible gateway (``longroute serve``): the simulator's routers, live.

Importing this package starts nothing; :func:`create_app` builds the aiohttp
application and :func:`longroute.gateway.cli.serve_command` runs it.
"""

from longroute.gateway.app import GATEWAY_KEY, Gateway, create_app
from longroute.gateway.config import (
    GatewayConfig,
    GatewaySecrets,
    load_gateway_config,
    parse_gateway_config,
    resolve_secrets,
)

__all__ = [
    "GATEWAY_KEY",
    "Gateway",
    "GatewayConfig",
    "GatewaySecrets",
    "create_app",
    "load_gateway_config",
    "parse_gateway_config",
    "resolve_secrets",
]
