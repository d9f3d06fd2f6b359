"""benchmarks/_ttca_ideal.py: the ideal router that bounds ttca_eval's `mixed` figures."""

from __future__ import annotations

import itertools
import random
from types import ModuleType

import pytest

from bench_modules import load_benchmark
from longroute.config import ScenarioConfig
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.workloads.types import Workload


def _module() -> ModuleType:
    return load_benchmark("_ttca_ideal.py")


def _quiet_mixed(num_queries: int) -> ScenarioConfig:
    """`mixed` with no network (0 ms, no jitter, peaks or episodes), KV questions only
    (``num_queries // 2`` x 5 lengths x 3 languages), one every ~1,000 s: every attempt
    finds the fleet idle."""
    config = load_scenario("mixed")
    regions = ("us-east", "eu-west", "ap-northeast")
    rtt = {a: {b: 0.0 for b in regions[i:]} for i, a in enumerate(regions)}
    network = config.network.model_copy(
        update={"rtt_ms": rtt, "jitter_sigma": 0.0, "peak_probability": 0.0, "congestion": {}}
    )
    params = {"num_queries": num_queries, "split": "eval", "order": "shuffled",
              "block_size_tokens": 256}  # fmt: skip
    workload = config.workload.model_copy(update={"generator": "kv-lookup", "params": params})
    clients = config.clients.model_copy(update={"rate_per_s": 0.001})
    return config.model_copy(update={"network": network, "workload": workload, "clients": clients})


def test_lone_times_are_what_the_simulator_gives_an_uncached_request_on_an_idle_fleet() -> None:
    """Round-robin spreads 30 questions and their retries over all nine endpoints; each
    uncached attempt's TTFT and E2E match lone_times to 1e-9 relative. Cached retries
    (round-robin coming back to an endpoint) are cheaper, which is why the ideal router
    never counts on one: its model would only repeat the wrong answer."""
    module = _module()
    config = _quiet_mixed(4)
    run = run_scenario(config, seed=3, routers=["round-robin"])
    records = run.results["round-robin"].records
    checked = set()
    for r in records:
        if r.num_cached_tokens:
            continue
        model, ttft_s, e2e_s = module.lone_times(config, r.num_prompt_tokens,
                                                 r.num_output_tokens)[r.endpoint]  # fmt: skip
        assert model == r.model
        assert r.first_token_s - r.arrival_s == pytest.approx(ttft_s, rel=1e-9)
        assert r.finish_s - r.arrival_s == pytest.approx(e2e_s, rel=1e-9)
        checked.add(r.endpoint)
    assert len(checked) == len(config.fleet), checked


def test_ideal_run_answers_what_any_model_answers() -> None:
    """On the quiet fleet the ideal router answers every question some model answers:
    at least as many as laar and ttca, which try every model too."""
    module = _module()
    config = _quiet_mixed(4)
    ideal = module.ideal_run(config, seed=3)
    run = run_scenario(config, seed=3, routers=["laar", "ttca"])
    ttca = run.ttca()
    assert ideal.num_queries == 30
    assert ideal.final_success >= ttca["laar"].final_success > 0.5
    assert ideal.final_success >= ttca["ttca"].final_success
    assert ideal.num_queries < ideal.num_requests <= 5 * ideal.num_queries
    assert 0.0 < ideal.ttft_p95_first_attempt_s <= ideal.ttft_p95_s


def test_the_cost_over_accuracy_order_has_the_least_expected_cost() -> None:
    """The exchange argument, checked by brute force: over 200 random draws of five
    models' costs and accuracies (some never right), no permutation is cheaper in
    expectation than best_order's."""
    module = _module()
    rng = random.Random(7)
    for _ in range(200):
        models = [f"m{i}" for i in range(5)]
        cost = {m: rng.uniform(0.1, 10.0) for m in models}
        accuracy = {m: rng.choice([0.0, rng.uniform(0.01, 1.0)]) for m in models}
        best = module.expected_cost(module.best_order(cost, accuracy), cost, accuracy)
        for order in itertools.permutations(models):
            assert best <= module.expected_cost(list(order), cost, accuracy) + 1e-12


def test_a_judged_turn_whose_prompt_could_be_cached_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound prices every attempt as a fresh prefill: a workload that asks one
    question's prompt twice is refused, naming the session."""
    module = _module()
    config = _quiet_mixed(4)
    workload = module.build_workload(config, 0)
    twice = Workload(workload.name, workload.sessions + workload.sessions[:1],
                     workload.block_size_tokens)  # fmt: skip
    monkeypatch.setattr(module, "build_workload", lambda config, seed: twice)
    with pytest.raises(ValueError, match="fresh one-turn prompt"):
        module.ideal_run(config, seed=0)


def test_report_ideal_sets_the_ideal_over_each_router_per_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Paired by seed: the ideal's 3 s against a router's 4 s is 0.75 on every seed, and
    its success (0.9 against 0.5) is 1.8x, a win on every seed."""
    module = _module()
    from longroute.sweep.stats import paired_ratio

    def ratio(mine: list[float], ref: list[float], *, lower: bool) -> dict[str, object]:
        pair = paired_ratio(mine, ref, is_lower_better=lower)
        return {"median": pair.estimate.median, "num_wins": pair.num_wins}

    ideal = {"mean_ttca_s": [3.0] * 5, "ttft_p95_s": [4.0] * 5, "final_success": [0.9] * 5}
    theirs = {"mean_ttca_s": [4.0] * 5, "ttft_p95_s": [2.0] * 5, "final_success": [0.5] * 5}
    lines: list[tuple[str, list[str]]] = []

    def cell(c: dict[str, float]) -> str:
        return f"{c['median']:.2f}"

    out = module.report_ideal(
        ideal.__getitem__,
        lambda r, m: theirs[m],
        ["gorgo"],
        ratio,
        lambda *a: lines.append(a),
        cell,
    )
    row = out["gorgo"]
    assert row["mean_ttca"] == {"median": pytest.approx(0.75), "num_wins": 5}
    assert row["ttft_p95"] == {"median": pytest.approx(2.0), "num_wins": 0}
    assert row["final_success"] == {"median": pytest.approx(1.8), "num_wins": 5}
    assert lines[-1] == ("gorgo", ["0.75", "2.00", "1.80"])
    assert "an ideal router" in capsys.readouterr().out
