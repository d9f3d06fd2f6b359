"""``longroute serve --config fleet.yaml``: run the gateway until interrupted.

The lead's CLI registers :func:`serve_command` as a typer command
(``app.command("serve")(serve_command)``). A missing or invalid config, an
unknown router or queue policy, or an unset API-key variable prints one
clear error and exits 2 before anything listens.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer
from aiohttp import web
from rich.console import Console
from rich.markup import escape

from longroute.config import ConfigError
from longroute.registry import RegistryError

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
    from longroute.gateway.app import create_app
    from longroute.gateway.config import load_gateway_config

    err = Console(stderr=True, soft_wrap=True)
    if log_level not in LOG_LEVELS:
        err.print(f"[bold red]error:[/] --log-level must be one of {', '.join(LOG_LEVELS)}")
        raise typer.Exit(code=2)
    try:
        gateway_config = load_gateway_config(config)
        app = create_app(gateway_config)
    except (ConfigError, RegistryError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    bind_host = host if host is not None else gateway_config.listen.host
    bind_port = port if port is not None else gateway_config.listen.port
    logging.getLogger("longroute.gateway").info(
        "router %s, %d backend(s)", gateway_config.router.name, len(gateway_config.backends)
    )
    try:
        _run(app, bind_host, bind_port)
    except OSError as exc:  # e.g. the port is taken
        where = escape(f"{bind_host}:{bind_port}")
        err.print(f"[bold red]error:[/] cannot listen on {where}: {escape(str(exc.strerror))}")
        raise typer.Exit(code=1) from None


def _run(app: web.Application, host: str, port: int) -> None:
    """Serve on a fresh event loop until SIGINT/SIGTERM, then clean up."""
    loop = _new_event_loop()
    main = loop.create_task(_serve(app, host, port))
    try:
        loop.run_until_complete(main)
    except (KeyboardInterrupt, web.GracefulExit):  # SIGINT / SIGTERM
        pass
    finally:
        # the signal interrupted the loop, not the task: cancel it so its cleanup runs
        main.cancel()
        loop.run_until_complete(asyncio.gather(main, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(app: web.Application, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM; logs the bound address (the real port when 0 was asked)."""
    # no access log: a log line per request costs more than the routing decision
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=1024).start()
        for address in runner.addresses:
            logging.getLogger("longroute.gateway").info("listening on http://%s:%d", *address[:2])
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
