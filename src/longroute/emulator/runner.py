"""Running an emulator until it is told to stop (SIGINT/SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from aiohttp import web

from longroute.emulator.options import EmulatorOptions
from longroute.emulator.server import create_app

ReadyCallback = Callable[[str], None]


async def start_emulator(options: EmulatorOptions) -> tuple[web.AppRunner, str]:
    """Start serving on ``options.host:options.port`` (0 = any free port).

    Returns the runner (``await runner.cleanup()`` stops it) and the base URL
    with the port actually bound. Handlers are cancelled when their client
    disconnects, as in vLLM.
    """
    app = create_app(options)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, options.host, options.port, backlog=1024)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    host, port = runner.addresses[0][:2]
    if ":" in host:
        host = f"[{host}]"
    return runner, f"http://{host}:{port}"


async def serve_emulator(options: EmulatorOptions, on_ready: ReadyCallback | None = None) -> None:
    """Serve until SIGINT or SIGTERM; ``on_ready(url)`` once the socket listens."""
    runner, url = await start_emulator(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
    finally:
        await runner.cleanup()


def run_emulator(options: EmulatorOptions, on_ready: ReadyCallback | None = None) -> None:
    """Block serving the emulator, on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve_emulator(options, on_ready))
        return
    uvloop.run(serve_emulator(options, on_ready))
