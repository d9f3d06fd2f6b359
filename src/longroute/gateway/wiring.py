"""The gateway's wiring helpers: its monitoring loops and its fixed /v1/models answer.

Called once, when a :class:`~longroute.gateway.app.Gateway` is built.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from longroute.clock import WallClock
from longroute.gateway.backends import Backend
from longroute.gateway.config import GatewayConfig
from longroute.gateway.rtt_probe import RttProber
from longroute.gateway.scrape import EngineScraper
from longroute.routing.fleet_view import FleetView


def monitors(
    config: GatewayConfig, backends: Mapping[str, Backend], fleet: FleetView, clock: WallClock
) -> tuple[RttProber | None, EngineScraper | None]:
    """The RTT prober and the engine scraper, each only if its interval is set."""
    rtt = scraper = None
    if config.rtt_probe_interval_s is not None:
        rtt = RttProber(
            backends,
            fleet,
            interval_s=config.rtt_probe_interval_s,
            timeout_s=config.health.timeout_s,
        )
    if config.scrape_interval_s is not None:
        scraper = EngineScraper(
            backends,
            fleet,
            clock,
            interval_s=config.scrape_interval_s,
            timeout_s=config.health.timeout_s,
        )
    return rtt, scraper


def models_body(models: dict[str, str]) -> bytes:
    """The /v1/models answer, built once: served models first, then aliases."""
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "longroute"}
        for name in models
    ]
    return json.dumps({"object": "list", "data": data}).encode()
