"""Scenarios that compare engine schedulers (``engines:``), in simulate and in sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from longroute.config import ConfigError
from longroute.metrics.summary import summarize
from longroute.sim.engine_variants import apply_engine, engine_label, labels
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sweep.cell import simulate_cell
from longroute.sweep.grid import expand
from longroute.sweep.spec import SweepSpec
from sweep_helpers import TINY_SCENARIO

ENGINES = """\
routers: [least-load]
engines:
  fcfs-512:
    max_num_batched_tokens: 512
  lars:
    queue_policy: lars
    batch_packer: time-budget
    batch_packer_params: {t_target_s: 0.05}
"""


def _write(tmp_path: Path, extra: str = ENGINES, body: str = TINY_SCENARIO) -> Path:
    path = tmp_path / "engines.yaml"
    path.write_text(body + extra, encoding="utf-8")
    return path


def test_labels_are_engine_names_under_one_router_else_router_slash_engine() -> None:
    assert engine_label("gorgo", None, 3) == "gorgo"
    assert engine_label("gorgo", "lars", 1) == "lars"
    assert engine_label("gorgo", "lars", 2) == "gorgo/lars"


def test_apply_engine_sets_the_scheduler_and_every_groups_token_budget(tmp_path: Path) -> None:
    config = load_scenario(str(_write(tmp_path)))
    assert [label for label, *_ in labels(config, ["least-load"])] == ["fcfs-512", "lars"]
    fcfs = apply_engine(config, "fcfs-512")
    assert fcfs.engines is None and fcfs.queue_policy == "fcfs"
    assert {g.max_num_batched_tokens for g in fcfs.fleet} == {512}
    lars = apply_engine(config, "lars")
    assert (lars.queue_policy, lars.batch_packer) == ("lars", "time-budget")
    assert lars.batch_packer_params == {"t_target_s": 0.05}
    assert [g.max_num_batched_tokens for g in lars.fleet] == [
        g.max_num_batched_tokens for g in config.fleet
    ]


def test_run_scenario_runs_every_engine_on_the_same_workload(tmp_path: Path) -> None:
    config = load_scenario(str(_write(tmp_path)))
    done: list[str] = []
    run = run_scenario(config, seed=1, on_router_done=done.append)
    assert list(run.results) == ["fcfs-512", "lars"] == done
    for name, result in run.results.items():
        plain = run_scenario(apply_engine(config, name), seed=1)
        assert plain.results["least-load"].records == result.records  # same run, relabelled
    # the engines differ: 512-token chunks make prompts take more iterations
    a, b = (summarize(r.records) for r in run.results.values())
    assert a["num_requests"] == b["num_requests"] == 120
    assert a != b


def test_several_routers_are_labelled_router_slash_engine(tmp_path: Path) -> None:
    config = load_scenario(str(_write(tmp_path)))
    run = run_scenario(config, seed=0, routers=["least-load", "random"])
    assert list(run.results) == [
        "least-load/fcfs-512", "random/fcfs-512", "least-load/lars", "random/lars"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("queue_policy: edf\n" + ENGINES, "in `engines` or in queue_policy, not both"),
        ("engines: {}\n", "at least one named engine"),
        ("engines:\n  x: {queue_policy: lras}\n", "engines.x.queue_policy: unknown queue policy"),
        ("engines:\n  x: {batch_packer: tb}\n", "engines.x.batch_packer: unknown batch packer"),
        ("engines:\n  x: {max_num_batched_tokens: 0}\n", "max_num_batched_tokens"),
        ("engines:\n  x: {queue_policies: lars}\n", "queue_policies"),
    ],
)
def test_bad_engines_are_errors_naming_the_field(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_scenario(str(_write(tmp_path, extra)))


def test_a_sweep_expands_engines_into_labels_and_cells_match_simulate(tmp_path: Path) -> None:
    path = _write(tmp_path)
    grid = expand(SweepSpec(scenarios=[str(path)], seeds=(0, 1), reference="fcfs-512"))
    assert grid.labels == ("fcfs-512", "lars")
    assert [(c.label, c.seed) for c in grid.cells] == [
        ("fcfs-512", 0), ("fcfs-512", 1), ("lars", 0), ("lars", 1)
    ]  # fmt: skip
    cell = grid.cells[2]
    assert cell.config.queue_policy == "lars" and cell.config.engines is None
    run = run_scenario(load_scenario(str(path)), seed=0)
    expected = summarize(run.results["lars"].records, num_rejected=run.results["lars"].num_rejected)
    assert simulate_cell(cell) == expected
