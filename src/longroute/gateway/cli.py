"""``longroute serve --config fleet.yaml``: run the gateway until interrupted.

The verb is listed in :data:`longroute.cli_verbs.VERBS` as
``longroute.gateway.cli:serve_command``; the root CLI imports this module only
when ``serve`` is run or its help is asked for. A missing or invalid config,
an unknown router or queue policy, or an unset API-key variable prints one
clear error and exits 2 before anything listens.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable
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
GC_YOUNG_THRESHOLD = 10_000
"""Net new container objects that start a young-generation collection (CPython's default:
700). The objects of the requests in flight alone cross 700 at a few dozen concurrent
requests, so at 32 clients the collector ran every ~50 requests, for nothing (they die by
reference counting): ~5 us of CPU per request. At 10,000 it did not run in 8,000."""


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
    workers: Annotated[
        int,
        typer.Option(
            help="Gateway processes on one port (SO_REUSEPORT), under a parent that forwards "
            "signals and restarts a worker that dies; 1 = this process serves (no parent)."
        ),
    ] = 1,
    metrics_port_base: Annotated[
        int | None,
        typer.Option(
            help="Worker i also serves its own /metrics, /health, /ready and /admin/* on this "
            "port + i (0: any free port, logged); off when unset."
        ),
    ] = None,
    worker_index: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run the OpenAI-compatible gateway in front of the configured backends."""
    from longroute.gateway.app import Gateway
    from longroute.gateway.config import load_gateway_config
    from longroute.gateway.secrets import resolve_secrets
    from longroute.gateway.workers import check_num_workers, check_wiring

    err = Console(stderr=True, soft_wrap=True)

    def fail(message: str, code: int = 2) -> typer.Exit:
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
        return typer.Exit(code=code)

    if log_level not in LOG_LEVELS:
        raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    try:
        check_num_workers(workers)
        if metrics_port_base is not None and not 0 <= metrics_port_base <= 65536 - workers:
            raise ValueError(
                f"--metrics-port-base must be 0 (any free port) or leave room for {workers} "
                f"port(s) below 65536, got {metrics_port_base}"
            )
        gateway_config = load_gateway_config(config)
        secrets = resolve_secrets(gateway_config)
        is_parent = workers > 1 and worker_index is None
        if is_parent:  # the parent checks what each worker will, and serves nothing
            check_wiring(gateway_config, secrets)
        else:
            gateway = Gateway(gateway_config, secrets, config_path=config)
    except (ConfigError, RegistryError, ValueError) as exc:
        raise fail(str(exc)) from None
    where = "" if worker_index is None else f"[worker {worker_index}]"
    logging.basicConfig(
        level=log_level.upper(), format=f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s"
    )
    bind_host = host if host is not None else gateway_config.listen.host
    bind_port = port if port is not None else gateway_config.listen.port
    if is_parent:
        raise typer.Exit(
            _supervise(
                config,
                bind_host,
                bind_port,
                log_level,
                workers,
                metrics_port_base,
                fail,
                gateway_config.load_source,
            )
        )
    for handler in logging.getLogger().handlers:  # every library's records too (aiohttp, ...)
        handler.addFilter(gateway.log_filter)
    logging.getLogger("longroute.gateway").info(
        "router %s, %d backend(s)", gateway_config.router.name, len(gateway_config.backends)
    )
    gateway.worker_index = worker_index
    ops_port = None
    if metrics_port_base is not None:
        # base 0 stays 0: any free port for each worker
        ops_port = metrics_port_base and metrics_port_base + (worker_index or 0)
    try:
        _run(gateway, bind_host, bind_port, worker_index is not None, ops_port)
    except OSError as exc:  # e.g. the port is taken
        where = f"{bind_host}:{bind_port}"
        raise fail(f"cannot listen on {where}: {exc.strerror}", code=1) from None


def _supervise(
    config: Path,
    host: str,
    port: int,
    log_level: str,
    num_workers: int,
    metrics_port_base: int | None,
    fail: Callable[..., typer.Exit],
    load_source: str,
) -> int:
    """The parent of ``num_workers`` workers (:mod:`longroute.gateway.workers`); its exit
    status."""
    from longroute.gateway.workers import Supervisor, reserve_port

    try:
        reserved = reserve_port(host, port)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror}", code=1) from None
    with reserved:
        port = reserved.getsockname()[1]

        def argv_for(index: int) -> list[str]:
            argv = [sys.executable, "-m", "longroute", "serve", "--config", str(config),
                    "--host", host, "--port", str(port), "--log-level", log_level,
                    "--worker-index", str(index)]  # fmt: skip
            if metrics_port_base is not None:
                argv += ["--metrics-port-base", str(metrics_port_base)]
            return argv

        workers_log = logging.getLogger("longroute.gateway.workers")
        workers_log.info("starting %d workers on %s:%d (SO_REUSEPORT)", num_workers, host, port)
        if load_source == "local":
            workers_log.warning(
                "load_source is local: each worker routes on its own requests in flight "
                "only; load_source: engine gives every worker the engines' global load"
            )
        return Supervisor(argv_for, num_workers).run()


def _run(
    gateway: Gateway, host: str, port: int, reuse_port: bool = False, ops_port: int | None = None
) -> None:
    """Serve on a fresh event loop until SIGINT/SIGTERM, then stop gracefully."""
    loop = _new_event_loop()
    try:
        loop.run_until_complete(_serve(gateway, host, port, reuse_port, ops_port))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(
    gateway: Gateway, host: str, port: int, reuse_port: bool = False, ops_port: int | None = None
) -> None:
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
        addresses = await gateway.start(host, port, reuse_port=reuse_port, ops_port=ops_port)
        # what exists now lives as long as the process: keep the collector's full
        # passes (tens of ms each, a few per 10,000 requests) from walking it
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        for address in addresses:
            logging.getLogger("longroute.gateway").info("listening on http://%s:%d", *address)
        for address in gateway.ops_addresses:
            logging.getLogger("longroute.gateway").info("ops port on http://%s:%d", *address)
        await stopping.wait()
        await gateway.drain_requests(gateway.config.shutdown.drain_timeout_s)
    finally:
        await gateway.stop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)
