"""``longroute epp``: the Envoy endpoint picker (ext_proc over gRPC), its demo, its Envoy.

- ``longroute epp --config fleet.yaml``: serve until SIGINT/SIGTERM; the same
  fleet YAML as ``longroute serve`` (its ``listen`` is not used: ``--host``,
  ``--port`` and ``--metrics-port`` say where the picker listens).
- ``longroute epp --demo``: Envoy + the picker + three emulators on loopback,
  and a conversation sent through Envoy (:mod:`longroute.epp.demo`).
- ``longroute epp --install-envoy``: download Envoy 1.40.0 into the cache
  (:mod:`longroute.epp.envoy_binary`) and print its path.

A bad config or option prints one ``error:`` line and exits 2; a port that is
taken exits 1.
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

if TYPE_CHECKING:
    from longroute.epp.server import EppServer

LOG_LEVELS = ("debug", "info", "warning", "error")
RESPONSE_BODIES = ("auto", "all", "none")
DEFAULT_PORT = 9002
DEFAULT_METRICS_PORT = 9090
log = logging.getLogger("longroute.epp")


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=code)


def epp_command(
    config: Annotated[
        Path | None, typer.Option(help="Fleet YAML, as for `longroute serve`.")
    ] = None,
    host: Annotated[str, typer.Option(help="Bind address of both servers.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="gRPC port: ext_proc and gRPC health (0 = any free port).")
    ] = DEFAULT_PORT,
    metrics_port: Annotated[
        int, typer.Option(help="HTTP port of /health, /ready and /metrics (0 = any free port).")
    ] = DEFAULT_METRICS_PORT,
    num_fallbacks: Annotated[
        int,
        typer.Option(
            help="Fallback endpoints listed after the picked one (needs Envoy's override_host "
            "load balancing policy; the ORIGINAL_DST cluster takes exactly one address)."
        ),
    ] = 0,
    response_bodies: Annotated[
        str,
        typer.Option(
            help="Response bodies the picker reads (each costs messages): all, none, or auto "
            "(streamed answers; all when the router learns answer lengths). See docs/envoy.md."
        ),
    ] = "auto",
    log_level: Annotated[
        str, typer.Option(help=f"Logging level: {', '.join(LOG_LEVELS)}.")
    ] = "info",
    demo: Annotated[
        bool, typer.Option("--demo", help="Run Envoy + the picker + 3 emulators and show it.")
    ] = False,
    install_envoy: Annotated[
        bool, typer.Option("--install-envoy", help="Download Envoy 1.40.0 into the cache.")
    ] = False,
) -> None:
    """Serve longroute's routing as an Envoy endpoint picker (Gateway API Inference Extension)."""
    if install_envoy:
        _install_envoy()
        return
    if demo:
        from longroute.epp.demo import run_demo

        raise typer.Exit(code=run_demo())
    if config is None:
        raise _fail("--config is required (or --demo, or --install-envoy)", 2)
    if log_level not in LOG_LEVELS:
        raise _fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}", 2)
    for name, value in (("--port", port), ("--metrics-port", metrics_port)):
        if not 0 <= value <= 65535:
            raise _fail(f"{name} must be from 0 to 65535, got {value}", 2)
    if num_fallbacks < 0:
        raise _fail(f"--num-fallbacks must be 0 or more, got {num_fallbacks}", 2)
    if response_bodies not in RESPONSE_BODIES:
        raise _fail(f"--response-bodies must be one of {', '.join(RESPONSE_BODIES)}", 2)
    server = _build(config, num_fallbacks, response_bodies)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        with asyncio.Runner(loop_factory=_new_event_loop) as runner:
            runner.run(_serve(server, host, port, metrics_port))
    except OSError as exc:
        raise _fail(f"cannot listen on {host}: {exc.strerror or exc}", 1) from None


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed, else asyncio's own loop. grpc.aio runs on either; uvloop
    took about a quarter off the CPU of a 3-message ext_proc stream (see docs/envoy.md)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _build(config: Path, num_fallbacks: int, response_bodies: str) -> EppServer:
    from longroute.errors import ConfigError
    from longroute.gateway.config import load_gateway_config
    from longroute.gateway.secrets import resolve_secrets
    from longroute.registry import RegistryError

    try:
        from longroute.epp.exchange import ResponseBodies
        from longroute.epp.server import EppServer
    except ImportError as exc:  # grpcio or xds-protos missing
        raise _fail(f"the endpoint picker needs grpcio and xds-protos: {exc}", 2) from None
    try:
        gateway_config = load_gateway_config(config)
        return EppServer(
            gateway_config,
            resolve_secrets(gateway_config),
            num_fallbacks=num_fallbacks,
            response_bodies=ResponseBodies(response_bodies),
        )
    except (ConfigError, RegistryError, ValueError) as exc:
        raise _fail(str(exc), 2) from None


async def _serve(server: EppServer, host: str, port: int, metrics_port: int) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        grpc_address, metrics_url = await server.start(host, port, metrics_port)
        gc.collect()
        gc.freeze()  # what exists now lives as long as the process (see gateway/cli.py)
        picker = server.picker
        log.info(
            "router %s, %d backend(s); ext_proc on grpc://%s",
            picker.router.name,
            len(picker.backends),
            grpc_address,
        )
        log.info("metrics listening on %s", metrics_url)
        await stopping.wait()
        log.info("stopping")
    finally:
        await server.stop()


def _install_envoy() -> None:
    from longroute.epp.envoy_binary import EnvoyInstallError, install_envoy

    err = Console(stderr=True, soft_wrap=True)
    try:
        path = install_envoy(lambda line: err.print(f"[dim]{escape(line)}[/]", highlight=False))
    except EnvoyInstallError as exc:
        raise _fail(str(exc), 1) from None
    print(path)
