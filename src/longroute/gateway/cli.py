"""``longroute serve --config fleet.yaml``: run the gateway until interrupted.

The lead's CLI registers :func:`serve_command` as a typer command
(``app.command("serve")(serve_command)``). A missing or invalid config, an
unknown router or queue policy, or an unset API-key variable prints one
clear error and exits 2 before anything listens.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from longroute.errors import ConfigError
from longroute.registry import RegistryError

if TYPE_CHECKING:
    from longroute.gateway.app import Gateway
    from longroute.gateway.reload import ReloadResult

LOG_LEVELS = ("debug", "info", "warning", "error")


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (faster sockets and timers), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve_command(
    config: Annotated[
        Path, typer.Option(help="Gateway YAML: backends, router, admission, health.")
    ],
    host: Annotated[
        str | None, typer.Option(help="Bind address (default: the config's listen.host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="TCP port (default: the config's listen.port).")
    ] = None,
    log_level: Annotated[
        str, typer.Option(help=f"Logging level: {', '.join(LOG_LEVELS)}.")
    ] = "info",
) -> None:
    """Run the OpenAI-compatible gateway in front of the configured backends."""
    from longroute.gateway.app import Gateway
    from longroute.gateway.config import load_gateway_config, resolve_secrets

    err = Console(stderr=True, soft_wrap=True)
    if log_level not in LOG_LEVELS:
        err.print(f"[bold red]error:[/] --log-level must be one of {', '.join(LOG_LEVELS)}")
        raise typer.Exit(code=2)
    try:
        gateway_config = load_gateway_config(config)
        gateway = Gateway(gateway_config, resolve_secrets(gateway_config), config_path=config)
    except (ConfigError, RegistryError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:  # every library's records too (aiohttp, ...)
        handler.addFilter(gateway.log_filter)
    bind_host = host if host is not None else gateway_config.listen.host
    bind_port = port if port is not None else gateway_config.listen.port
    logging.getLogger("longroute.gateway").info(
        "router %s, %d backend(s)", gateway_config.router.name, len(gateway_config.backends)
    )
    try:
        _run(gateway, bind_host, bind_port)
    except OSError as exc:  # e.g. the port is taken
        where = escape(f"{bind_host}:{bind_port}")
        err.print(f"[bold red]error:[/] cannot listen on {where}: {escape(str(exc.strerror))}")
        raise typer.Exit(code=1) from None


def _run(gateway: Gateway, host: str, port: int) -> None:
    """Serve on a fresh event loop until SIGINT/SIGTERM, then stop gracefully."""
    loop = _new_event_loop()
    try:
        loop.run_until_complete(_serve(gateway, host, port))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(gateway: Gateway, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then drain (a second signal cuts the drain short); logs
    the bound address (the real port when 0 was asked)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_stop_signal() -> None:
        if stopping.is_set():
            logging.getLogger("longroute.gateway").info("second signal: ending the drain now")
            gateway.drain.cut_now()
        stopping.set()

    reloads: set[asyncio.Task[ReloadResult]] = set()

    def on_reload_signal() -> None:
        logging.getLogger("longroute.gateway").info("SIGHUP: reloading the config")
        task = asyncio.ensure_future(gateway.reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_stop_signal)
    loop.add_signal_handler(signal.SIGHUP, on_reload_signal)
    try:
        addresses = await gateway.start(host, port)
        # what exists now lives as long as the process: keep the collector's full
        # passes (tens of ms each, a few per 10,000 requests) from walking it
        gc.collect()
        gc.freeze()
        for address in addresses:
            logging.getLogger("longroute.gateway").info("listening on http://%s:%d", *address)
        await stopping.wait()
        await gateway.drain_requests(gateway.config.shutdown.drain_timeout_s)
    finally:
        await gateway.stop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)
