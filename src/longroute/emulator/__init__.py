"""OpenAI-compatible engine emulator driven by the simulator's engine model in real time.

``create_app(options)`` builds the aiohttp app; ``run_emulator(options)``
serves it until SIGINT/SIGTERM; ``start_emulator(options)`` starts it inside
a running loop (tests, the demo) and returns the runner and its URL.
"""

from longroute.emulator.options import EmulatorOptions
from longroute.emulator.runner import run_emulator, serve_emulator, start_emulator
from longroute.emulator.server import create_app

__all__ = ["EmulatorOptions", "create_app", "run_emulator", "serve_emulator", "start_emulator"]
