"""A small emulated fleet on loopback: emulator processes and, in front, a gateway.

Called once per demo (or test) before any load is sent; the processes belong
to the given :class:`~longroute.launcher.Launcher`, which stops them. Several
fleets start together: all their emulators at once, then all their gateways.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from longroute.gateway.config import parse_gateway_config
from longroute.launcher import Child, Launcher, emulator_spec, gateway_spec

DEFAULT_PROFILE = "llama-3-8b"


@dataclass(frozen=True, slots=True)
class Replica:
    """One emulated engine: its hardware, and a region standing as an added round trip."""

    name: str
    hardware: str
    region: str
    network_delay_ms: float


#: Three regions of one model on three kinds of GPU (RTTs as seen from us-east).
DEFAULT_REPLICAS = (
    Replica("use-h100", "h100", "us-east", 2.0),
    Replica("euw-a100", "a100-80g", "eu-west", 80.0),
    Replica("apne-l40s", "l40s", "ap-northeast", 160.0),
)


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """A fleet to start. ``router`` None: no gateway (clients talk to the replicas).

    ``gateway_overrides`` are merged into the generated gateway config, one
    level deep (``{"admission": {"max_queue": 1}}`` keeps the other admission
    keys). ``emulator_args`` are extra ``longroute emulate`` options for every replica.
    """

    prefix: str
    replicas: tuple[Replica, ...] = DEFAULT_REPLICAS
    router: str | None = "prefix-cache"
    profile: str = DEFAULT_PROFILE
    speed: float = 10.0
    max_concurrency: int = 64
    gateway_overrides: Mapping[str, object] = field(default_factory=dict)
    emulator_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError(f"fleet {self.prefix!r} has no replica")
        if self.router is None and len(self.replicas) != 1:
            raise ValueError(
                f"fleet {self.prefix!r} has no gateway, so it must have exactly one replica, "
                f"got {len(self.replicas)}"
            )


@dataclass(frozen=True, slots=True)
class Fleet:
    """A started fleet: its emulators (in plan order) and its gateway, if any."""

    plan: FleetPlan
    emulators: tuple[Child, ...]
    gateway: Child | None

    @property
    def url(self) -> str:
        """Where clients send requests: the gateway, else the only replica."""
        front = self.gateway if self.gateway is not None else self.emulators[0]
        return front.base_url

    @property
    def children(self) -> tuple[Child, ...]:
        return (*self.emulators, *(() if self.gateway is None else (self.gateway,)))

    def emulator(self, replica_name: str) -> Child:
        """The emulator process of the replica named ``replica_name``."""
        for replica, child in zip(self.plan.replicas, self.emulators, strict=True):
            if replica.name == replica_name:
                return child
        names = ", ".join(r.name for r in self.plan.replicas)
        raise KeyError(f"no replica {replica_name!r} in fleet {self.plan.prefix!r}; have {names}")


def gateway_config(plan: FleetPlan, urls: Sequence[str]) -> dict[str, object]:
    """The gateway YAML (as data) for ``plan``'s replicas listening at ``urls``."""
    if plan.router is None:
        raise ValueError(f"fleet {plan.prefix!r} has no router, so no gateway config")
    backends = [
        {
            "name": replica.name,
            "url": url,
            "model": plan.profile,
            "region": replica.region,
            "hardware": replica.hardware,
            "max_concurrency": plan.max_concurrency,
        }
        for replica, url in zip(plan.replicas, urls, strict=True)
    ]
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": backends,
        "router": {"name": plan.router},
        "model_aliases": {"auto": "auto"},
    }
    for key, value in plan.gateway_overrides.items():
        current = config.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            config[key] = {**current, **value}
        else:
            config[key] = value
    return config


def start_fleets(launcher: Launcher, plans: Sequence[FleetPlan]) -> tuple[Fleet, ...]:
    """Start every plan's emulators at once, then every gateway; block until all are ready.

    Raises ``ConfigError`` for a gateway config that does not validate (before
    any gateway starts) and ``LaunchError`` for a process that fails to start.
    """
    prefixes = [p.prefix for p in plans]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"fleet prefixes must be unique, got {', '.join(prefixes)}")
    specs = [
        emulator_spec(
            f"{plan.prefix}-{replica.name}",
            profile=plan.profile,
            hardware=replica.hardware,
            speed=plan.speed,
            network_delay_ms=replica.network_delay_ms,
            extra_args=plan.emulator_args,
        )
        for plan in plans
        for replica in plan.replicas
    ]
    started = iter(launcher.start(*specs))
    emulators = [tuple(next(started) for _ in plan.replicas) for plan in plans]
    gateway_specs = []
    for plan, children in zip(plans, emulators, strict=True):
        if plan.router is None:
            continue
        config = gateway_config(plan, [c.base_url for c in children])
        source = f"{plan.prefix}-gateway.yaml"
        parse_gateway_config(config, source)  # fail here, naming the field, not in the child
        gateway_specs.append(
            gateway_spec(f"{plan.prefix}-gateway", launcher.write_yaml(source, config))
        )
    gateways = iter(launcher.start(*gateway_specs))
    return tuple(
        Fleet(plan, children, None if plan.router is None else next(gateways))
        for plan, children in zip(plans, emulators, strict=True)
    )
