"""A small emulated fleet on loopback: emulator processes and, in front, a gateway.

Called once per demo (or test) before any load is sent; the processes belong
to the given :class:`~longroute.launcher.Launcher`, which stops them. Several
fleets start together: all their emulators at once, then all their gateways.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from longroute.gateway.config import parse_gateway_config
from longroute.launcher import Child, Launcher, ProcessSpec, emulator_spec, gateway_spec
from longroute.ports import reserved_ports

DEFAULT_PROFILE = "llama-3-8b"
#: KV block size of emulators that publish KV events, and of the gateways' precise index.
KV_EVENTS_BLOCK_TOKENS = 16
MAX_GATEWAYS = 8


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
    ``num_gateways`` gateway replicas share one config; with ``kv_events`` every
    emulator publishes its KV-cache events and the gateways route on them
    (``precise_prefix`` with the emulator's tokenizer, ``load_source: engine``).
    """

    prefix: str
    replicas: tuple[Replica, ...] = DEFAULT_REPLICAS
    router: str | None = "prefix-cache"
    profile: str = DEFAULT_PROFILE
    speed: float = 10.0
    max_concurrency: int = 64
    gateway_overrides: Mapping[str, object] = field(default_factory=dict)
    emulator_args: tuple[str, ...] = ()
    num_gateways: int = 1
    kv_events: bool = False

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError(f"fleet {self.prefix!r} has no replica")
        if not 1 <= self.num_gateways <= MAX_GATEWAYS:
            raise ValueError(
                f"fleet {self.prefix!r}: num_gateways must be 1 to {MAX_GATEWAYS}, "
                f"got {self.num_gateways}"
            )
        if self.router is None and (self.num_gateways != 1 or self.kv_events):
            raise ValueError(
                f"fleet {self.prefix!r} has no gateway, so no gateway replicas or KV events"
            )
        if self.router is None and len(self.replicas) != 1:
            raise ValueError(
                f"fleet {self.prefix!r} has no gateway, so it must have exactly one replica, "
                f"got {len(self.replicas)}"
            )


@dataclass(frozen=True, slots=True)
class Fleet:
    """A started fleet: its emulators (in plan order) and its gateway replicas, if any."""

    plan: FleetPlan
    emulators: tuple[Child, ...]
    gateways: tuple[Child, ...]

    @property
    def gateway(self) -> Child | None:
        """The first gateway replica; None without a gateway."""
        return self.gateways[0] if self.gateways else None

    @property
    def url(self) -> str:
        """Where clients send requests: the first gateway, else the only replica."""
        front = self.gateway if self.gateway is not None else self.emulators[0]
        return front.base_url

    @property
    def children(self) -> tuple[Child, ...]:
        return (*self.emulators, *self.gateways)

    def emulator(self, replica_name: str) -> Child:
        """The emulator process of the replica named ``replica_name``."""
        for replica, child in zip(self.plan.replicas, self.emulators, strict=True):
            if replica.name == replica_name:
                return child
        names = ", ".join(r.name for r in self.plan.replicas)
        raise KeyError(f"no replica {replica_name!r} in fleet {self.plan.prefix!r}; have {names}")


@dataclass(frozen=True, slots=True)
class KvPorts:
    """Where one emulator publishes its KV events (PUB) and answers replays (ROUTER)."""

    events_port: int
    replay_port: int

    @classmethod
    def pick(cls, count: int) -> list[KvPorts]:
        """Ports for ``count`` emulators: free now, distinct, and outside the kernel's
        ephemeral range, so no process starting meanwhile is handed one (``ports``)."""
        ports = reserved_ports(2 * count)
        return [cls(ports[2 * i], ports[2 * i + 1]) for i in range(count)]

    def emulator_args(self) -> tuple[str, ...]:
        """``longroute emulate`` options that publish on these ports (binding, as vLLM's ``*``)."""
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.events_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": "kv",
        }
        block = str(KV_EVENTS_BLOCK_TOKENS)
        return ("--prefix-block-tokens", block, "--kv-events-config", json.dumps(config))

    def gateway_kv_events(self) -> dict[str, object]:
        """A backend's ``kv_events`` key: connect to this emulator's sockets."""
        return {
            "endpoint": f"tcp://127.0.0.1:{self.events_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{self.replay_port}",
            "topic": "kv",
        }


def gateway_config(
    plan: FleetPlan, urls: Sequence[str], kv_ports: Sequence[KvPorts] = ()
) -> dict[str, object]:
    """The gateway YAML (as data) for ``plan``'s replicas listening at ``urls``;
    with ``plan.kv_events``, ``kv_ports`` are each replica's event sockets."""
    if plan.router is None:
        raise ValueError(f"fleet {plan.prefix!r} has no router, so no gateway config")
    if plan.kv_events and len(kv_ports) != len(urls):
        raise ValueError(f"fleet {plan.prefix!r} publishes KV events: give each replica's ports")
    backends: list[dict[str, object]] = [
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
    if plan.kv_events:
        for backend, ports in zip(backends, kv_ports, strict=True):
            backend["kv_events"] = ports.gateway_kv_events()
        block = KV_EVENTS_BLOCK_TOKENS
        config["precise_prefix"] = {"tokenizer": "emulator", "block_size_tokens": block}
        config["load_source"] = "engine"  # every replica sees the engines' global load
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
    picked = iter(KvPorts.pick(sum(len(p.replicas) for p in plans if p.kv_events)))
    kv_ports = [
        tuple(next(picked) for _ in plan.replicas) if plan.kv_events else () for plan in plans
    ]
    specs = [
        emulator_spec(
            f"{plan.prefix}-{replica.name}",
            profile=plan.profile,
            hardware=replica.hardware,
            speed=plan.speed,
            network_delay_ms=replica.network_delay_ms,
            extra_args=(*plan.emulator_args, *(ports[i].emulator_args() if ports else ())),
        )
        for plan, ports in zip(plans, kv_ports, strict=True)
        for i, replica in enumerate(plan.replicas)
    ]
    started = iter(launcher.start(*specs))
    emulators = [tuple(next(started) for _ in plan.replicas) for plan in plans]
    gateway_specs: list[ProcessSpec] = []
    for plan, children, ports in zip(plans, emulators, kv_ports, strict=True):
        if plan.router is None:
            continue
        config = gateway_config(plan, [c.base_url for c in children], ports)
        source = f"{plan.prefix}-gateway.yaml"
        parse_gateway_config(config, source)  # fail here, naming the field, not in the child
        path = launcher.write_yaml(source, config)
        names = (
            [f"{plan.prefix}-gateway"]
            if plan.num_gateways == 1
            else [f"{plan.prefix}-gateway{i}" for i in range(plan.num_gateways)]
        )
        gateway_specs.extend(gateway_spec(name, path) for name in names)
    gateways = iter(launcher.start(*gateway_specs))
    return tuple(
        Fleet(
            plan,
            children,
            () if plan.router is None else tuple(next(gateways) for _ in range(plan.num_gateways)),
        )
        for plan, children in zip(plans, emulators, strict=True)
    )
