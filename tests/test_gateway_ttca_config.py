"""A ttca gateway checks at start-up that it can time every backend from its profiles.

ttca predicts each backend's times from its ``model`` and ``hardware`` profiles; a
backend that names none is refused when the gateway is built (one ``error:`` line
from ``longroute serve``), not answered 500 at every request.
"""

from __future__ import annotations

from typing import Any

import pytest

from longroute.errors import ConfigError
from longroute.gateway import Gateway, GatewaySecrets
from longroute.gateway.config import parse_gateway_config


def _gateway(*backends: dict[str, Any]) -> Gateway:
    data = {
        "backends": [{"url": f"http://127.0.0.1:{9000 + i}", **b} for i, b in enumerate(backends)],
        "router": {"name": "ttca"},
    }
    return Gateway(parse_gateway_config(data, "test"), GatewaySecrets({}, None))


def test_a_ttca_gateway_builds_when_every_backend_has_profiles() -> None:
    gateway = _gateway(
        {"name": "a", "model": "llama-3-8b", "hardware": "h100"},
        {"name": "b", "model": "qwen2.5-7b", "hardware": "a100-80g"},
    )
    assert gateway.router.name == "ttca"


@pytest.mark.parametrize(
    ("backend", "named"),
    [
        ({"model": "llama-3-8b"}, "unknown hardware profile 'generic'"),  # the default
        ({"model": "meta-llama/Llama-3-8B", "hardware": "h100"}, "unknown model profile"),
    ],
)
def test_a_backend_without_profiles_is_refused_at_start_up(
    backend: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _gateway(
            {"name": "ok", "model": "llama-3-8b", "hardware": "h100"}, {"name": "bad", **backend}
        )
    message = str(info.value)
    assert "router 'ttca'" in message and "backend 'bad'" in message and named in message
    assert "h100" in message  # the valid profiles are listed
