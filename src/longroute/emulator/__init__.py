"""OpenAI-compatible engine emulator driven by the simulator's engine model in real time.

``create_app(options)`` builds the aiohttp app; ``run_emulator(options)``
serves it until SIGINT/SIGTERM; ``start_emulator(options)`` starts it inside
a running loop (tests, the demo) and returns the runner and its URL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from longroute.emulator.options import EmulatorOptions
    from longroute.emulator.runner import run_emulator, serve_emulator, start_emulator
    from longroute.emulator.server import create_app

# imported on first use, so `longroute --help` does not pay for this package (PEP 562)
_LAZY = {
    "EmulatorOptions": "longroute.emulator.options",
    "run_emulator": "longroute.emulator.runner",
    "serve_emulator": "longroute.emulator.runner",
    "start_emulator": "longroute.emulator.runner",
    "create_app": "longroute.emulator.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["EmulatorOptions", "create_app", "run_emulator", "serve_emulator", "start_emulator"]
