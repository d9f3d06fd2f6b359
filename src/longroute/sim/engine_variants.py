"""Named engine schedulers a scenario compares, like routers (``engines:`` in its YAML).

A scenario usually names one engine scheduler (``queue_policy``, ``batch_packer``
and their parameters). One that compares schedulers — Medha's ``medha`` sets
Sarathi's FCFS with fixed chunks against EDF, LRS, LARS and Medha's full
scheduler — lists them under ``engines`` instead; every router then runs once
per engine. A run is reported under a *label*: the engine's name when the
scenario compares engines under one router, ``router/engine`` when it compares
several routers too, and the router's name when there are no engines.

:func:`apply_engine` turns a scenario with engines into the plain scenario of
one of them (its policy names and parameters at the top level, its token
budget, if it sets one, on every fleet group), which is how the simulator and
``longroute sweep`` run each.

A scenario may compare gateway set-ups the same way (``gateways:``, named
:class:`~longroute.config.GatewayReplicasConfig`, e.g. 1 to 8 replicas with an
approximate or a precise prefix state): each is a variant like an engine,
labelled alike, and :func:`apply_engine` sets it as the scenario's ``gateway``.
A scenario compares engines or gateways, not both (the config refuses it).
"""

from __future__ import annotations

from collections.abc import Sequence

from longroute.config import ScenarioConfig


def engine_names(config: ScenarioConfig) -> list[str | None]:
    """The scenario's engines (or gateway set-ups) in file order, or ``[None]`` (its one
    scheduler and gateway)."""
    if config.engines:
        return list(config.engines)
    return list(config.gateways) if config.gateways else [None]


def engine_label(router_label: str, engine: str | None, num_routers: int) -> str:
    """The label a run is reported under (see the module docstring)."""
    if engine is None:
        return router_label
    return engine if num_routers == 1 else f"{router_label}/{engine}"


def labels(
    config: ScenarioConfig, router_labels: Sequence[str]
) -> list[tuple[str, str, str | None]]:
    """(label, router label, engine) for every run, engines outermost (file order)."""
    n = len(router_labels)
    return [(engine_label(r, e, n), r, e) for e in engine_names(config) for r in router_labels]


def apply_engine(config: ScenarioConfig, engine: str | None) -> ScenarioConfig:
    """The scenario as run with ``engine``, an engine or gateway set-up (``None``:
    unchanged)."""
    if engine is None:
        return config
    if config.gateways is not None:
        return config.model_copy(update={"gateways": None, "gateway": config.gateways[engine]})
    assert config.engines is not None
    variant = config.engines[engine]
    fleet = config.fleet
    if variant.max_num_batched_tokens is not None:
        budget = variant.max_num_batched_tokens
        fleet = [g.model_copy(update={"max_num_batched_tokens": budget}) for g in fleet]
    # model_copy skips validation, so the scheduler keys are set without
    # tripping the "engines or top-level keys" check, and engines is dropped
    return config.model_copy(
        update={
            "engines": None,
            "queue_policy": variant.queue_policy,
            "queue_policy_params": dict(variant.queue_policy_params),
            "batch_packer": variant.batch_packer,
            "batch_packer_params": dict(variant.batch_packer_params),
            "fleet": fleet,
        }
    )


__all__ = ["apply_engine", "engine_label", "engine_names", "labels"]
