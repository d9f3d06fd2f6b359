"""Sweeps: spec parsing, grid expansion, cells equal to `simulate`, executors, faults, cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from longroute.config import ConfigError
from longroute.metrics.summary import summarize
from longroute.registry import RegistryError
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sweep.cache import CellCache, cell_key
from longroute.sweep.cell import Cell, CellResult, execute_cell, simulate_cell
from longroute.sweep.executors import WORKER_DIED, PoolExecutor, SerialExecutor
from longroute.sweep.grid import expand
from longroute.sweep.runner import run_grid
from longroute.sweep.spec import SweepSpec, load_spec, parse_seeds, router_variants
from sweep_helpers import KILLER_SEED, kill_worker_on_seed, write_tiny

# ---- spec --------------------------------------------------------------------------


def test_seed_ranges_parse_in_order() -> None:
    assert parse_seeds("0-4") == (0, 1, 2, 3, 4)
    assert parse_seeds("3, 0-1,7") == (3, 0, 1, 7)
    assert parse_seeds("5") == (5,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4-1", "empty"),
        ("a-b", "not N or N-M"),
        ("1,1", "twice"),
        ("", "not N or N-M"),
        ("-2-1", "-2 is negative"),
    ],
)
def test_bad_seed_ranges_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)


def test_spec_file_errors_name_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("scenarios: [default]\nseed: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"s\.yaml: invalid sweep spec\n  seed: Extra"):
        load_spec(path)
    path.write_text("seeds: 5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="range string"):
        load_spec(path)
    path.write_text("router_params: {gorgo: {rtt_weight: []}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="empty list sweeps nothing"):
        load_spec(path)


def test_spec_scenario_paths_are_relative_to_the_spec(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    (tmp_path / "s.yaml").write_text("scenarios: [tiny.yaml, default]\n", encoding="utf-8")
    spec = load_spec(tmp_path / "s.yaml")
    assert spec.scenarios == [str(tmp_path / "tiny.yaml"), "default"]


def test_list_valued_router_params_are_swept_and_labelled() -> None:
    variants = router_variants("gorgo", {"rtt_weight": [0.1, 0.2], "queue_weight": 0.5})
    assert variants == [
        ("gorgo(rtt_weight=0.1)", {"queue_weight": 0.5, "rtt_weight": 0.1}),
        ("gorgo(rtt_weight=0.2)", {"queue_weight": 0.5, "rtt_weight": 0.2}),
    ]
    assert router_variants("x", {"fixed": [[1, 2]]}) == [("x", {"fixed": [1, 2]})]


# ---- grid --------------------------------------------------------------------------


def test_grid_is_the_product_of_every_axis(tmp_path: Path) -> None:
    tiny = str(write_tiny(tmp_path))
    spec = SweepSpec(
        scenarios=[tiny],
        routers=["least-load", "gorgo"],
        seeds=(0, 1, 2),
        load_scales=[0.5, 1.0],
        fleets={"base": {}, "big": {"a": {"replicas": 4}}},
        router_params={"gorgo": {"rtt_weight": [0.1, 1.0]}},
    )
    grid = expand(spec)
    assert len(grid.cells) == 2 * 2 * 3 * 3  # loads x fleets x (least-load + 2 gorgo) x seeds
    assert grid.labels == ("least-load", "gorgo(rtt_weight=0.1)", "gorgo(rtt_weight=1.0)")
    assert grid.reference == "least-load"
    half_big = [c for c in grid.cells if c.load_scale == 0.5 and c.fleet == "big"]
    assert {c.config.clients.rate_per_s for c in half_big} == {4.0}
    assert {next(g.replicas for g in c.config.fleet if g.name == "a") for c in half_big} == {4}
    swept = [c for c in grid.cells if c.label == "gorgo(rtt_weight=0.1)"]
    assert {c.config.router_params["gorgo"]["rtt_weight"] for c in swept} == {0.1}
    assert {c.params for c in swept} == {(("rtt_weight", 0.1),)}


def test_windowed_scenarios_run_each_window_at_its_seed_as_simulate_does() -> None:
    grid = expand(SweepSpec(scenarios=["gorgo"], routers=["gorgo"], seeds=(3,)))
    assert [(c.window, c.run_seed) for c in grid.cells] == [("full", 3), ("half", 4), ("third", 5)]
    half = grid.cells[1].config
    base = load_scenario("gorgo")
    assert base.clients.rate_per_s is not None and half.clients.rate_per_s is not None
    assert half.windows is None and half.clients.rate_per_s == base.clients.rate_per_s * 0.5


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"routers": ["nope"]}, RegistryError, "nope"),
        ({"reference": "random"}, ConfigError, "names no router"),
        ({"fleets": {"x": {"zz": {"replicas": 2}}}}, ConfigError, "no fleet group 'zz'"),
        ({"fleets": {"x": {"a": {"replicas": 0}}}}, ConfigError, r"fleets\.x.*replicas"),
        ({"windows": ["full"]}, ConfigError, "has no windows"),
        ({"router_params": {"gorgo": {"rtt_weight": 1}}}, ConfigError, "not in the sweep"),
    ],
)
def test_grid_errors_come_before_any_simulation(
    tmp_path: Path, fields: dict[str, object], error: type[Exception], message: str
) -> None:
    base: dict[str, object] = {"scenarios": [str(write_tiny(tmp_path))], "routers": ["least-load"]}
    spec = SweepSpec.model_validate({**base, **fields})
    with pytest.raises(error, match=message):
        expand(spec)


def test_a_grid_too_large_is_refused_before_it_is_built() -> None:
    spec = SweepSpec(
        routers=["gorgo"],
        seeds=parse_seeds("0-9999"),
        router_params={
            "gorgo": {"rtt_weight": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2]}
        },
    )
    with pytest.raises(ConfigError, match="at least 110,000 cells, more than 100,000"):
        expand(spec)


# ---- cells -------------------------------------------------------------------------


def test_a_cell_is_exactly_the_routers_run_in_simulate(tmp_path: Path) -> None:
    tiny = str(write_tiny(tmp_path))
    grid = expand(SweepSpec(scenarios=[tiny], routers=["prefix-cache"], seeds=(4,)))
    run = run_scenario(load_scenario(tiny), seed=4, routers=["least-load", "prefix-cache"])
    result = run.results["prefix-cache"]
    assert simulate_cell(grid.cells[0]) == summarize(
        result.records, num_rejected=result.num_rejected
    )


def test_a_cell_that_raises_is_a_failed_result(tmp_path: Path) -> None:
    spec = SweepSpec(
        scenarios=[str(write_tiny(tmp_path))],
        routers=["gorgo"],
        seeds=(0,),
        router_params={"gorgo": {"queue_release": ["complete", "bogus"]}},
    )
    good, bad = (execute_cell(c) for c in expand(spec).cells)
    assert good.is_ok and good.metrics["num_requests"]
    assert not bad.is_ok and bad.metrics == {}
    assert bad.error is not None and bad.error.startswith(
        "RegistryError: cannot build router 'gorgo': gorgo: unknown queue_release 'bogus'"
    )


# ---- executors, faults and the cache ----------------------------------------------


def _tiny_grid(tmp_path: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> list[Cell]:
    spec = SweepSpec(
        scenarios=[str(write_tiny(tmp_path))], routers=["least-load", "prefix-cache"], seeds=seeds
    )
    return list(expand(spec).cells)


def _collect(executor: SerialExecutor | PoolExecutor, cells: list[Cell], fn=execute_cell):  # type: ignore[no-untyped-def]
    out: dict[int, CellResult] = {}

    def on_result(index: int, result: CellResult) -> None:
        assert index not in out
        out[index] = result

    executor.run(cells, on_result, fn)
    return [out[i] for i in range(len(cells))]


def test_pool_and_serial_give_identical_results(tmp_path: Path) -> None:
    cells = _tiny_grid(tmp_path)
    serial = _collect(SerialExecutor(), cells)
    pool = _collect(PoolExecutor(2), cells)
    assert all(r.is_ok for r in serial)
    assert [r.metrics for r in pool] == [r.metrics for r in serial]


def test_a_killed_worker_fails_only_its_own_cell(tmp_path: Path) -> None:
    cells = _tiny_grid(tmp_path)
    serial = _collect(SerialExecutor(), cells)
    results = _collect(PoolExecutor(2), cells, kill_worker_on_seed)
    for cell, result, expected in zip(cells, results, serial, strict=True):
        if cell.seed == KILLER_SEED and cell.router == "least-load":
            assert not result.is_ok and result.error == WORKER_DIED
        else:  # in flight beside the killer, rerun alone, intact
            assert result.is_ok and result.metrics == expected.metrics


class _Counting:
    """An in-process cell function that counts its calls and can stop at the n-th."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.calls = 0
        self.interrupt_at = interrupt_at

    def __call__(self, cell: Cell) -> CellResult:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return execute_cell(cell)


def test_a_resumed_or_extended_sweep_runs_only_missing_cells(tmp_path: Path) -> None:
    cache = CellCache(tmp_path / "cells")
    spec = SweepSpec(
        scenarios=[str(write_tiny(tmp_path))], routers=["least-load", "prefix-cache"], seeds=(0, 1)
    )
    first = _Counting()
    run = run_grid(expand(spec), SerialExecutor(), cache=cache, fn=first)
    assert first.calls == 4 and run.num_computed == 4 and run.num_cached == 0
    again = _Counting()
    rerun = run_grid(expand(spec), SerialExecutor(), cache=cache, fn=again)
    assert again.calls == 0 and rerun.num_cached == 4
    assert [r.metrics for r in rerun.results] == [r.metrics for r in run.results]
    extended = _Counting()
    spec3 = spec.model_copy(update={"seeds": (0, 1, 2)})
    run3 = run_grid(expand(spec3), SerialExecutor(), cache=cache, fn=extended)
    assert extended.calls == 2 and run3.num_computed == 2 and run3.num_cached == 4


def test_an_interrupted_sweep_keeps_finished_cells_and_resumes(tmp_path: Path) -> None:
    cache = CellCache(tmp_path / "cells")
    grid = expand(
        SweepSpec(scenarios=[str(write_tiny(tmp_path))], routers=["least-load"], seeds=(0, 1, 2))
    )
    stopper = _Counting(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        run_grid(grid, SerialExecutor(), cache=cache, fn=stopper)
    assert sum(cache.get(cell_key(c)) is not None for c in grid.cells) == 2
    resumed = _Counting()
    run = run_grid(grid, SerialExecutor(), cache=cache, fn=resumed)
    assert resumed.calls == 1 and run.num_cached == 2 and run.num_failed == 0


def test_failed_cells_are_not_cached_and_are_retried(tmp_path: Path) -> None:
    cache = CellCache(tmp_path / "cells")
    spec = SweepSpec(
        scenarios=[str(write_tiny(tmp_path))],
        routers=["gorgo"],
        seeds=(0,),
        router_params={"gorgo": {"queue_release": ["complete", "bogus"]}},
    )
    run = run_grid(expand(spec), SerialExecutor(), cache=cache)
    assert run.num_failed == 1 and [c.label for c, _ in run.failures()] == [
        "gorgo(queue_release=bogus)"
    ]
    again = _Counting()
    run_grid(expand(spec), SerialExecutor(), cache=cache, fn=again)
    assert again.calls == 1


def test_the_cache_key_follows_content_not_labels(tmp_path: Path) -> None:
    cells = _tiny_grid(tmp_path, seeds=(0,))
    keys = {cell_key(c) for c in cells}
    assert len(keys) == 2  # two routers
    cell = cells[0]
    other_seed = Cell(**{**{f: getattr(cell, f) for f in Cell.__slots__}, "run_seed": 9})
    assert cell_key(other_seed) != cell_key(cell)
    renamed = Cell(**{**{f: getattr(cell, f) for f in Cell.__slots__}, "fleet": "other"})
    assert cell_key(renamed) == cell_key(cell)


def test_a_damaged_cache_file_is_a_miss_not_an_error(tmp_path: Path) -> None:
    cache = CellCache(tmp_path)
    cell = _tiny_grid(tmp_path, seeds=(0,))[0]
    key = cell_key(cell)
    cache.put(key, cell, CellResult("ok", {"x": 1.0}, None, 0.5))
    assert cache.get(key) == CellResult("ok", {"x": 1.0}, None, 0.5, is_cached=True)
    path = tmp_path / key[:2] / f"{key}.json"
    path.write_text('{"key": "', encoding="utf-8")
    assert cache.get(key) is None
