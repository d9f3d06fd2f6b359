"""``wants_capability``: a router that takes the scenario's Q(m,x) when there is one and
runs without it (and stays in the default router list) when there is none."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from longroute.config import ConfigError, ScenarioConfig, parse_scenario
from longroute.estimators.capability import save_capability
from longroute.routing import ROUTERS
from longroute.routing.round_robin import RoundRobinRouter
from longroute.sim.scenario import (
    needs_capability,
    resolve_routers,
    run_scenario,
    takes_capability,
    wants_capability,
)

WANTS = "test-wants-capability"


class _WantsCapability(RoundRobinRouter):
    """Round robin that records the capability it was built with."""

    name = WANTS
    wants_capability = True
    built: ClassVar[list[object]] = []

    def __init__(self, *, capability: object = None, rng: random.Random | None = None) -> None:
        super().__init__(rng=rng)
        self.capability = capability
        _WantsCapability.built.append(capability)


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The throwaway router is registered for this test only (the registry has no
    unregister: tests own their entries)."""
    monkeypatch.setitem(ROUTERS._factories, WANTS, _WantsCapability)
    _WantsCapability.built = []
    yield


def _data(*, with_capability: bool) -> dict[str, Any]:
    """The laar scenario, shrunk: 2 eval queries per setting (30 questions), 2 fit ones."""
    text = (resources.files("longroute") / "data" / "scenarios" / "laar.yaml").read_text()
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(text))
    data["workload"]["params"]["num_queries"] = 4
    data["capability"]["fit_workload"]["params"]["num_queries"] = 4
    del data["routers"]
    if not with_capability:
        del data["capability"]
    return data


def _config(*, with_capability: bool, **changes: Any) -> ScenarioConfig:
    data = _data(with_capability=with_capability)
    data.update(changes)
    return parse_scenario(data, "test.yaml")


def test_class_attributes_are_read_from_the_registry() -> None:
    assert wants_capability(WANTS) and not needs_capability(WANTS)
    assert needs_capability("laar") and not wants_capability("laar")
    assert takes_capability(WANTS) and takes_capability("laar")
    assert not takes_capability("round-robin")


def test_default_router_list_keeps_a_wanting_router_with_or_without_a_capability() -> None:
    with_section = resolve_routers(_config(with_capability=True))
    without = resolve_routers(_config(with_capability=False))
    assert WANTS in with_section and WANTS in without
    assert "laar" in with_section and "laar" not in without


def test_it_gets_the_scenarios_capability_model_when_there_is_one() -> None:
    run = run_scenario(_config(with_capability=True), routers=[WANTS, "laar"])
    assert run.capability is not None
    assert _WantsCapability.built == [run.capability]
    assert run.ttca()[WANTS].num_queries == 30


def test_it_is_built_without_one_and_without_error_when_there_is_none() -> None:
    run = run_scenario(_config(with_capability=False), routers=[WANTS])
    assert run.capability is None
    assert _WantsCapability.built == [None]
    assert run.ttca()[WANTS].num_queries == 30


def test_its_own_capability_param_is_kept_without_a_section(tmp_path: Path) -> None:
    fitted = run_scenario(_config(with_capability=True), routers=[WANTS]).capability
    assert fitted is not None
    path = tmp_path / "capability.json"
    save_capability(fitted, path)
    _WantsCapability.built = []
    config = _config(with_capability=False, router_params={WANTS: {"capability": str(path)}})
    run_scenario(config, routers=[WANTS])
    assert _WantsCapability.built == [str(path)]  # the router reads its own file


def test_a_capability_given_twice_is_a_config_error() -> None:
    config = _config(with_capability=True, router_params={WANTS: {"capability": "x.json"}})
    with pytest.raises(ConfigError, match=rf"router '{WANTS}': give the capability model once"):
        resolve_routers(config, [WANTS])


def test_a_router_that_neither_needs_nor_wants_one_never_gets_it() -> None:
    # round-robin has no capability parameter: the registry would refuse one
    run = run_scenario(_config(with_capability=True), routers=["round-robin", WANTS])
    assert _WantsCapability.built == [run.capability]
    assert set(run.results) == {"round-robin", WANTS}


def test_no_capability_is_fitted_when_no_router_takes_one() -> None:
    run = run_scenario(_config(with_capability=True), routers=["round-robin"])
    assert run.capability is None
