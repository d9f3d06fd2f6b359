"""OpenAI-compatible engine emulator driven by the simulator's engine model in real time.

``create_app(options)`` builds the aiohttp app; ``run_emulator(options)``
serves it until SIGINT/SIGTERM; ``start_emulator(options)`` starts it inside
a running loop (tests, the demo) and returns the runner and its URL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute._lazy import lazy_exports

if TYPE_CHECKING:
    from longroute.emulator.kv_events_config import KvEventsConfig
    from longroute.emulator.options import EmulatorOptions
    from longroute.emulator.runner import run_emulator, serve_emulator, start_emulator
    from longroute.emulator.server import create_app

# imported on first use, so `longroute --help` does not pay for this package (PEP 562)
_LAZY = {
    "EmulatorOptions": "longroute.emulator.options",
    "KvEventsConfig": "longroute.emulator.kv_events_config",
    "run_emulator": "longroute.emulator.runner",
    "serve_emulator": "longroute.emulator.runner",
    "start_emulator": "longroute.emulator.runner",
    "create_app": "longroute.emulator.server",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "EmulatorOptions",
    "KvEventsConfig",
    "create_app",
    "run_emulator",
    "serve_emulator",
    "start_emulator",
]
