"""Envoy + ``longroute epp`` + emulators on loopback: the demo's, the e2e test's and the
benchmark's setup.

:func:`start_epp_stack` starts the emulators and the picker as ``longroute``
processes of a :class:`~longroute.launcher.Launcher` (which stops them), then
Envoy with :func:`~longroute.epp.envoy.epp_config` pointed at the picker; the
caller stops Envoy (:meth:`EppStack.close`, or the ``with`` block). Called
from the main thread, outside any event loop (it blocks while it waits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from longroute.demo.fleet import DEFAULT_REPLICAS, FleetPlan, Replica, gateway_config
from longroute.epp.envoy import EnvoyProcess, epp_config
from longroute.launcher import Child, Launcher, LaunchError, ProcessSpec, emulator_spec

_GRPC = re.compile(rb"ext_proc on grpc://([^\s]+)")


def epp_spec(
    name: str, config_path: Path, *, port: int = 0, response_bodies: str = "auto"
) -> ProcessSpec:
    """A ``longroute epp`` process; ready when its ``/ready`` (a backend answered) is 200."""
    args = (
        *("epp", "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port)),
        *("--response-bodies", response_bodies),
    )
    return ProcessSpec(name, (*args, "--metrics-port", "0", "--log-level", "info"), "/ready")


def grpc_port(child: Child) -> int:
    """The gRPC port a started ``longroute epp`` logged; LaunchError if it logged none."""
    match = _GRPC.search(child.log_path.read_bytes())
    if match is None:
        raise LaunchError(f"{child.name} did not log its gRPC address:\n{child.log_tail()}")
    return int(match.group(1).decode().rsplit(":", 1)[1])


@dataclass(slots=True)
class EppStack:
    """A started stack: ``envoy.url`` is where clients send requests; ``launcher`` owns the
    emulators and the picker (e.g. to kill one in a test)."""

    launcher: Launcher
    emulators: tuple[Child, ...]
    epp: Child
    epp_port: int
    envoy: EnvoyProcess
    replicas: tuple[Replica, ...]

    @property
    def url(self) -> str:
        return self.envoy.url

    def close(self) -> None:
        self.envoy.stop()

    def __enter__(self) -> EppStack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_epp_stack(
    launcher: Launcher,
    envoy_binary: Path,
    *,
    router: str = "prefix-cache",
    speed: float = 10.0,
    replicas: tuple[Replica, ...] = DEFAULT_REPLICAS,
    overrides: Mapping[str, object] | None = None,
    envoy_concurrency: int = 1,
    emulator_args: tuple[str, ...] = (),
    response_bodies: str = "auto",
) -> EppStack:
    """Emulators, then the picker (fleet config as the demo's gateway, plus ``overrides``,
    ``--response-bodies response_bodies``), then Envoy; blocks until all are ready. Raises
    LaunchError or EnvoyError."""
    specs = [
        emulator_spec(
            f"epp-{r.name}",
            profile="llama-3-8b",
            hardware=r.hardware,
            speed=speed,
            network_delay_ms=r.network_delay_ms,
            extra_args=emulator_args,
        )
        for r in replicas
    ]
    emulators = launcher.start(*specs)
    plan = FleetPlan("epp", replicas, router, speed=speed, gateway_overrides=overrides or {})
    config = gateway_config(plan, [c.base_url for c in emulators])
    config_path = launcher.write_yaml("epp-fleet.yaml", config)
    (epp,) = launcher.start(epp_spec("epp", config_path, response_bodies=response_bodies))
    port = grpc_port(epp)
    envoy = EnvoyProcess(
        envoy_binary,
        epp_config(port=0, admin_port=0, epp_port=port),
        launcher.workdir,
        concurrency=envoy_concurrency,
    )
    envoy.start()
    return EppStack(launcher, emulators, epp, port, envoy, replicas)
