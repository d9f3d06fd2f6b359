"""Hot reload (SIGHUP, ``POST /admin/reload``): a new config, checked whole, swapped in.

:func:`prepare` reads the config file again, resolves its secrets and builds a
complete :class:`~longroute.gateway.wiring.Wiring` from it, keeping the router
object when its config did not change; anything wrong (a YAML or schema error,
an unset key variable, an unknown router, a predictor file missing, a field
that only a restart can change) raises :class:`ReloadError` and nothing
changes. The gateway then applies it (``Gateway.apply_wiring``) in one step of
the event loop, so no request ever sees half of it: backends may come, go or
change, the router and its parameters, the admission limits, the client keys
and the access log may change. State keyed by backend stays with the backends
that stay: the prefix index, RTT estimates, health, in-flight counters and the
router's learned state (a rebuilt router adopts it: ``adopt_state``). A backend
that left serves its requests in flight to their end; :func:`retire` forgets
it once they finished. :func:`describe_changes` says what changed, for the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longroute.clock import WallClock
from longroute.errors import ConfigError
from longroute.gateway.config import GatewayConfig, load_gateway_config
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.observe import RequestObserver
from longroute.gateway.secrets import resolve_secrets
from longroute.gateway.wiring import Wiring, monitors, scrape_timing
from longroute.registry import RegistryError
from longroute.routing.base import Router
from longroute.routing.fleet_view import LoadSource

if TYPE_CHECKING:
    from longroute.gateway.app import Gateway

log = logging.getLogger("longroute.gateway")

RESTART_ONLY = (
    "listen",
    "http",
    "block_size_tokens",
    "precise_prefix",
    "prefix_index_capacity_blocks",
    "otel",
    "admission.queue_policy",
    "admission.queue_policy_params",
)
"""Fields a reload cannot change (the listener, the HTTP limits, the prefix hashing, the
tracer, the queues' order): a config that changes one is refused, naming it."""
RETIRE_POLL_S = 0.2


class ReloadError(Exception):
    """The new config cannot be served; the message says why (the old one still serves)."""


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload did: ``error`` None when the new config serves; ``changes`` as logged."""

    error: str | None
    changes: tuple[str, ...] = ()

    @property
    def is_ok(self) -> bool:
        return self.error is None


def prepare(
    path: Path,
    current: Wiring,
    metrics: GatewayMetrics,
    clock: WallClock,
    request_numbers: Any,
) -> Wiring:
    """The wiring of ``path``'s config, built and checked whole; ReloadError otherwise."""
    try:
        config = load_gateway_config(path)
        refused = restart_only_changes(current.config, config)
        if refused:
            raise ReloadError(
                f"{path}: {', '.join(refused)} cannot change on a reload; restart the "
                "gateway for that (nothing was changed)"
            )
        secrets = resolve_secrets(config)
        kept = current.router if config.router == current.config.router else None
        same_reuse = config.context_reuse == current.config.context_reuse
        wiring = Wiring(
            config, secrets, metrics, clock, request_numbers, router=kept,
            context=current.context if same_reuse else None, tokenizer=current.tokenizer,
        )  # fmt: skip
    except ReloadError:
        raise
    except (ConfigError, RegistryError, ValueError, TypeError, OSError) as exc:
        raise ReloadError(str(exc)) from None
    # what the answers taught of output lengths stays (its prior is the config's default)
    if config.admission.default_max_tokens == current.config.admission.default_max_tokens:
        wiring.requests.lengths = current.requests.lengths
    if kept is None:
        adopt_router_state(wiring.router, current.router)
    return wiring


def adopt_router_state(new: Router, old: Router) -> None:
    """A rebuilt router of the same kind takes over its predecessor's learned and in-flight
    state (``adopt_state``, where the router has one)."""
    adopt = getattr(new, "adopt_state", None)
    if adopt is not None and type(new) is type(old):
        adopt(old)


def restart_only_changes(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The dotted names of RESTART_ONLY fields that differ."""
    changed = []
    for dotted in RESTART_ONLY:
        if _field(old, dotted) != _field(new, dotted):
            changed.append(dotted)
    return changed


def _field(config: GatewayConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def describe_changes(old: GatewayConfig, new: GatewayConfig) -> tuple[str, ...]:
    """One line per change: backends added, removed or changed (which fields), and every
    other field by its dotted name. Values of key fields are never shown (only the names
    of the variables and files that hold keys are in a config anyway)."""
    lines: list[str] = []
    old_backends = {b.name: b.model_dump() for b in old.backends}
    new_backends = {b.name: b.model_dump() for b in new.backends}
    for name in new_backends.keys() - old_backends.keys():
        lines.append(f"backend {name} added (model {new_backends[name]['model']})")
    for name in old_backends.keys() - new_backends.keys():
        lines.append(f"backend {name} removed (its requests in flight finish there)")
    for name in old_backends.keys() & new_backends.keys():
        fields = _changed_paths(old_backends[name], new_backends[name], "")
        if fields:
            lines.append(f"backend {name} changed: {', '.join(fields)}")
    old_rest = old.model_dump(exclude={"backends"})
    new_rest = new.model_dump(exclude={"backends"})
    lines += [f"{path} changed" for path in _changed_paths(old_rest, new_rest, "")]
    return tuple(sorted(lines))


def _changed_paths(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        paths: list[str] = []
        for key in sorted(old.keys() | new.keys(), key=str):
            paths += _changed_paths(old.get(key), new.get(key), f"{prefix}{key}.")
        return paths
    return [] if old == new else [prefix.rstrip(".")]


async def retire(
    names: Iterable[str],
    inflight: Callable[[str], int],
    forget: Callable[[str], None],
    close_idle_pools: Callable[[], Any],
) -> None:
    """Waits for each backend that left to finish its requests in flight, then forgets it
    (fleet view, admission, health) and closes its pool; one task per reload."""
    waiting = set(names)
    while True:
        for name in [n for n in waiting if inflight(n) == 0]:
            forget(name)
            waiting.discard(name)
            log.info("backend %s left the fleet: its last request finished", name)
        if not waiting and await close_idle_pools() == 0:
            return
        await asyncio.sleep(RETIRE_POLL_S)


def apply_wiring(gw: Gateway, wiring: Wiring) -> None:
    """Swaps ``wiring`` into ``gw``, in one step of the event loop (see the module doc)."""
    old, config = gw.wiring, wiring.config
    retired = gw.fleet.set_endpoints([b.endpoint for b in wiring.backends.values()])
    for name, backend in wiring.backends.items():
        before = old.backends.get(name)
        if before is not None and (before.base_url, before.model) != (
            backend.base_url,
            backend.model,
        ):
            gw.fleet.reset_endpoint(name)  # another engine: its cache is not known
    gw.fleet.is_prefix_index_enabled = wiring.router.needs_prefix_index
    gw.wiring = gw.proxy.wiring = wiring
    capacities = {b.name: b.max_concurrency for b in wiring.backends.values()}
    gw.admission.reconfigure(wiring.router, capacities, config.admission.max_queue)
    gw.health.set_backends(wiring.backends, config.health)
    replaced = gw.proxy.set_backends(wiring.backends.values(), config.admission.connect_timeout_s)
    _apply_monitors(gw, config, wiring)
    if wiring.router is not old.router:
        calibration = getattr(wiring.router, "calibration", None)
        gw.metrics.set_calibration(gw.fleet, calibration)
    gw.log_filter.redactor = wiring.redactor
    if config.access_log != old.config.access_log:
        if gw.access_log is not None:
            gw.access_log.close()
        gw.access_log = gw.build_access_log(config)
    elif gw.access_log is not None:
        gw.access_log.redactor = wiring.redactor
        gw.access_log.reopen()  # logrotate moved it: reload opens it again
    gw.observer = RequestObserver(gw.request_sinks())
    gw.set_tuning(wiring)
    gw.routes = gw.route_table()
    gw.sync_loops()
    if gw.engine_truth is not None:  # subscribe to new sources, drop those gone
        task = asyncio.create_task(gw.engine_truth.set_backends(wiring.backends, is_strict=False))
        gw.retiring.add(task)
        task.add_done_callback(gw.retiring.discard)
    if retired or replaced:
        _retire(gw, retired)


def _apply_monitors(gw: Gateway, config: GatewayConfig, wiring: Wiring) -> None:
    interval = config.rtt_probe_interval_s
    if gw.rtt is not None and interval is not None:
        gw.rtt.set_backends(wiring.backends, interval)
    else:
        gw.rtt = monitors(config, wiring.backends, gw.fleet, gw.clock)[0]
    if gw.fleet.load_source != config.load_source:
        gw.fleet.set_load_source(LoadSource(config.load_source))
    interval, stale_after_s = scrape_timing(config)
    if gw.scraper is not None and interval is not None:
        gw.scraper.set_backends(wiring.backends, interval, stale_after_s)
    else:
        gw.scraper = monitors(config, wiring.backends, gw.fleet, gw.clock)[1]


def _retire(gw: Gateway, names: list[str]) -> None:
    def forget(name: str) -> None:
        if name in gw.wiring.backends:
            return  # a later reload brought it back: it is in the fleet again
        gw.fleet.forget(name)
        gw.admission.forget(name)
        gw.health.forget(name)
        gw.proxy.forget(name)

    task = asyncio.create_task(
        retire(names, gw.admission.inflight, forget, gw.proxy.close_idle_retired)
    )
    gw.retiring.add(task)
    task.add_done_callback(gw.retiring.discard)


__all__ = [
    "RESTART_ONLY",
    "ReloadError",
    "ReloadResult",
    "adopt_router_state",
    "apply_wiring",
    "describe_changes",
    "prepare",
    "restart_only_changes",
    "retire",
]
