"""Emulators standing for regions, driven through their admin call, and a metrics reader:
shared by the gateway tests that change a region's network mid-run."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.admin import NETWORK_DELAY_PATH

PROFILE = "llama-3-8b"


@contextlib.asynccontextmanager
async def region_emulators(
    wall_delays_ms: Mapping[str, float], speed: float
) -> AsyncIterator[dict[str, str]]:
    """One emulator per region (admin on) at its wall round trip; their URLs by name."""
    async with contextlib.AsyncExitStack() as stack:
        urls = {}
        for name, wall_ms in wall_delays_ms.items():
            options = EmulatorOptions(
                profile=PROFILE, port=0, speed=speed, network_delay_ms=wall_ms * speed,
                admin_enabled=True,
            )  # fmt: skip
            runner, urls[name] = await start_emulator(options)
            stack.push_async_callback(runner.cleanup)
        yield urls


async def change_network(http: aiohttp.ClientSession, url: str, **change: Any) -> float:
    """POSTs ``change`` to the emulator's admin call (200 expected, the new state checked);
    returns the monotonic time just before the call (the change is in force after it)."""
    changed_s = time.monotonic()
    async with http.post(url + NETWORK_DELAY_PATH, json=change) as response:
        assert response.status == 200, await response.text()
        state = await response.json()
    for key, value in change.items():
        assert state[key] == value, (key, state)
    return changed_s


async def metric_samples(http: aiohttp.ClientSession, url: str, name: str) -> dict[str, float]:
    """``name``'s samples on ``url``/metrics, by their ``endpoint`` label ("" without one)."""
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    return {
        sample.labels.get("endpoint", ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
