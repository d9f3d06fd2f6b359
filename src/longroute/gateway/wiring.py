"""The gateway's wiring: what a config makes of it (:class:`Wiring`), and its helpers.

Called when a :class:`~longroute.gateway.app.Gateway` is built and at each reload. Every
problem found here is a ``ConfigError`` or ``ValueError`` naming the field or
file, which ``longroute serve`` prints as one ``error:`` line before anything
listens.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from longroute.clock import WallClock
from longroute.errors import ConfigError
from longroute.gateway.backends import Backend, build_backends
from longroute.gateway.config import GatewayConfig
from longroute.gateway.context_reuse import ContextReuse
from longroute.gateway.intake import RequestBuilder
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.observe import key_id
from longroute.gateway.priority import BackendPriorities
from longroute.gateway.redact import Redactor
from longroute.gateway.rtt_probe import RttProber
from longroute.gateway.scrape import EngineScraper
from longroute.gateway.secrets import GatewaySecrets
from longroute.routing import ROUTERS
from longroute.routing.base import Router
from longroute.routing.fleet_view import FleetView, LoadSource

if TYPE_CHECKING:
    from longroute.features.tokenize import PromptTokenizer
    from longroute.gateway.engine_truth import EngineTruth

log = logging.getLogger("longroute.gateway")


class Wiring:
    """What one config makes of the gateway, built whole and checked before it serves:
    backends, router, the model map, the request builder, context reuse, client keys, the
    redactor and backend priorities. A reload builds a new one and swaps the reference;
    a request reads the wiring in force when it starts. O(backends) to build."""

    __slots__ = (
        "backends",
        "client_api_keys",
        "client_key_ids",
        "config",
        "context",
        "models",
        "models_body",
        "priorities",
        "redactor",
        "requests",
        "router",
        "secrets",
        "served_models",
        "tokenizer",
    )

    def __init__(
        self,
        config: GatewayConfig,
        secrets: GatewaySecrets,
        metrics: GatewayMetrics,
        clock: WallClock,
        request_numbers: Iterator[int],
        *,
        router: Router | None = None,
        context: ContextReuse | None = None,
        tokenizer: PromptTokenizer | None = None,
    ) -> None:
        """``router``: the router to keep (a reload whose router config did not change), checked
        against the new backends; else one is built. ``context``: the context reuse to keep
        (its index of what was sent), else one is built when enabled. ``request_numbers``:
        the gateway's one counter of internal request ids (they key router state, so never
        restart). ``tokenizer``: the engines' (precise_prefix), loaded once per process."""
        self.config = config
        self.tokenizer = tokenizer
        self.secrets = secrets
        self.backends = build_backends(config, secrets.backend_api_keys)
        if router is None:
            self.router = build_router(config, self.backends)
        else:
            check_router(router, config, self.backends)
            self.router = router
        self.models = model_map(config, self.backends)
        self.models_body = models_body(self.models)
        self.served_models = frozenset(b.model for b in self.backends.values())
        self.requests = RequestBuilder.for_router(
            config, clock, self.router, request_numbers, tokenizer=tokenizer
        )
        reuse = config.context_reuse
        if context is None and reuse.enabled:
            context = ContextReuse(reuse, metrics)
        self.context = context
        self.client_api_keys = secrets.client_api_keys
        self.client_key_ids = {key: key_id(key) for key in self.client_api_keys or ()}
        self.redactor = build_redactor(secrets, self.backends)
        self.priorities = BackendPriorities(config, clock)


def build_router(config: GatewayConfig, backends: Mapping[str, Backend]) -> Router:
    """The configured router, checked against the fleet before any request.

    A predictor file that cannot be read names itself (the loaders' errors); one
    fitted without some served model is refused naming the models it lacks (else
    the first request for such a model would fail); a router that prices tokens
    per endpoint (chimera) is asked for every backend's price now, not at the
    first request, and one that times requests from model and hardware profiles
    (ttca) for every backend's predictor.
    """
    spec = config.router
    for kind in getattr(ROUTERS.get(spec.name), "workflow_predictors", ()):
        value = spec.params.get(kind)
        # from YAML a path is a string; code may also pass a fitted object
        if isinstance(value, bool | int | float | list | dict) or value == "":
            raise ConfigError(
                f"router.params.{kind} must be the path of a fitted {kind} model file "
                f"(`longroute fit`), got {repr(value)[:60]}"
            )
    try:
        router = ROUTERS.build(spec.name, spec.params, rng=random.Random(spec.seed))
    except OSError as exc:  # FileNotFoundError and friends name the file
        raise ConfigError(f"router {spec.name!r}: {exc}") from None
    check_router(router, config, backends)
    if spec.weights_file is not None:
        set_frozen_weights(router, Path(spec.weights_file))
    return router


def set_frozen_weights(router: Router, path: Path) -> None:
    """Sets the frozen weights of ``path`` on ``router``; ConfigError naming the file when
    it cannot be read, was tuned for another router or names weights the router lacks."""
    from longroute.tuning import WeightsFileError, as_tunable, load_weights

    try:
        frozen = load_weights(path)
        if frozen.router != router.name:
            raise ConfigError(
                f"router.weights_file {path}: tuned for router {frozen.router!r}, not "
                f"{router.name!r}"
            )
        as_tunable(router).set_weights(frozen.weights)
    except (WeightsFileError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"router.weights_file: {exc}") from None


def check_router(router: Router, config: GatewayConfig, backends: Mapping[str, Backend]) -> None:
    """ConfigError unless ``router`` can serve every backend: its fitted predictors know
    every served model, and it can price (chimera) or time (ttca) every backend."""
    spec = config.router
    served = {b.model for b in backends.values()}
    for kind in getattr(router, "workflow_predictors", ()):
        where = spec.params.get(kind)
        where = str(where) if isinstance(where, str | Path) else f"router {spec.name!r}'s {kind}"
        check_predictor(getattr(router, kind), kind, served, where)
    check = getattr(router, "check_endpoints", None)  # BaseRouter's; a bare Router has none
    if check is None:
        return
    try:
        notes = check([b.endpoint for b in backends.values()])
    except ValueError as exc:
        raise ConfigError(f"router {spec.name!r}: {exc}") from None
    for note in notes:
        log.warning("%s", note)


def build_fleet(
    config: GatewayConfig,
    backends: Mapping[str, Backend],
    router: Router,
    fleet_class: type[FleetView] = FleetView,
) -> FleetView:
    """The fleet view over every backend, with a prefix index where ``router`` reads one
    (the gateway and the endpoint picker build it alike). With ``precise_prefix`` the index
    is a precise one: every backend starts on guesses and turns precise with its events.
    ``fleet_class``: the gateway's :class:`~longroute.gateway.admission.GrantingFleet`."""
    index = None
    if config.precise_prefix is not None:
        from longroute.prefix.precise_index import PrecisePrefixIndex

        index = PrecisePrefixIndex(list(backends), config.prefix_index_capacity_blocks)
    fleet = fleet_class(
        [b.endpoint for b in backends.values()],
        prefix_capacity_blocks=config.prefix_index_capacity_blocks,
        is_prefix_index_enabled=router.needs_prefix_index,
        prefix_index=index,
    )
    fleet.set_load_source(LoadSource(config.load_source))
    return fleet


def build_engine_truth(config: GatewayConfig, fleet: FleetView) -> EngineTruth | None:
    """The sink of the backends' KV-cache events over ``fleet``'s precise index (None
    without ``precise_prefix``); it subscribes when the gateway starts."""
    spec = config.precise_prefix
    if spec is None:
        return None
    from longroute.gateway.engine_truth import EngineTruth
    from longroute.prefix.precise_index import PrecisePrefixIndex

    assert isinstance(fleet.prefix_index, PrecisePrefixIndex)
    return EngineTruth(fleet.prefix_index, spec.block_size_tokens, spec.first_events_timeout_s)


def build_tokenizer(config: GatewayConfig) -> PromptTokenizer | None:
    """The engines' tokenizer of ``precise_prefix`` (None without it); ConfigError naming
    the path when the model directory cannot be loaded. Reads files: call at start-up."""
    spec = config.precise_prefix
    if spec is None:
        return None
    from longroute.features.hf_chat import ModelDirError
    from longroute.features.token_cache import PrefixCacheLimits
    from longroute.features.tokenize import EmulatorPromptTokenizer, HFPromptTokenizer

    limits = PrefixCacheLimits(max_entries=spec.max_cached_prompts)
    if spec.tokenizer == "emulator":
        return EmulatorPromptTokenizer(block_size_tokens=spec.block_size_tokens, limits=limits)
    try:
        return HFPromptTokenizer.from_dir(
            spec.tokenizer, block_size_tokens=spec.block_size_tokens, limits=limits
        )
    except (ModelDirError, OSError) as exc:
        raise ConfigError(f"precise_prefix.tokenizer: {exc}") from None


def build_redactor(secrets: GatewaySecrets, backends: Mapping[str, Backend]) -> Redactor:
    """What keeps every key, and every backend address from client-facing text, out of
    what the gateway (or the endpoint picker) shows."""
    keys = [*secrets.backend_api_keys.values(), *(secrets.client_api_keys or ())]
    return Redactor(keys, addresses=[b.base_url for b in backends.values()])


def check_predictor(predictor: object, kind: str, served: Collection[str], where: str) -> None:
    """ConfigError unless ``predictor`` (read from ``where``) knows every served model."""
    from longroute.estimators.workflow_models import KINDS, check_models

    if isinstance(predictor, tuple(KINDS.values())):
        try:
            check_models(predictor, served, Path(where))  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"router.params.{kind}: {exc}") from None
        return
    models = getattr(predictor, "models", None)  # a hand-made predictor (tests, libraries)
    missing = sorted(set(served) - set(models)) if models is not None else []
    if missing:
        raise ConfigError(
            f"router.params.{kind} ({where}): the {kind} model has no {', '.join(missing)} "
            f"(it knows {', '.join(models or ())}); refit it on outcomes of every served model"
        )


def monitors(
    config: GatewayConfig, backends: Mapping[str, Backend], fleet: FleetView, clock: WallClock
) -> tuple[RttProber | None, EngineScraper | None]:
    """The RTT prober and the engine scraper, each only if its interval is set (the engine
    load source always scrapes, every ``load_scrape_interval_s``)."""
    rtt = scraper = None
    if config.rtt_probe_interval_s is not None:
        rtt = RttProber(
            backends,
            fleet,
            interval_s=config.rtt_probe_interval_s,
            timeout_s=config.health.timeout_s,
        )
    interval_s, stale_after_s = scrape_timing(config)
    if interval_s is not None:
        scraper = EngineScraper(
            backends,
            fleet,
            clock,
            interval_s=interval_s,
            timeout_s=config.health.timeout_s,
            stale_after_s=stale_after_s,
        )
    return rtt, scraper


def scrape_timing(config: GatewayConfig) -> tuple[float | None, float | None]:
    """(seconds between scrapes or None = off, seconds after which a scrape is stale or
    None = never) for ``config``'s load source."""
    if config.load_source == "engine":
        return config.load_scrape_interval_s, config.load_stale_after_s
    return config.scrape_interval_s, None


def model_map(config: GatewayConfig, backends: Mapping[str, Backend]) -> dict[str, str]:
    """Served models map to themselves, aliases to their target (a model or "auto")."""
    models = {b.model: b.model for b in backends.values()}
    models.update(config.model_aliases)
    return models


def models_body(models: dict[str, str]) -> bytes:
    """The /v1/models answer, built once: served models first, then aliases."""
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "longroute"}
        for name in models
    ]
    return json.dumps({"object": "list", "data": data}).encode()
