"""The `mixed` scenario: heterogeneous models and GPUs in three congested regions under a
blend of long multi-turn sessions and judged KV-lookup questions."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from longroute.config import ScenarioConfig, parse_scenario
from longroute.sim.scenario import (
    build_endpoints,
    build_predictors,
    build_workload,
    fit_context_limits,
    load_scenario,
    resolve_routers,
    run_scenario,
)
from longroute.workloads.kv_prompts import KV_TASK

LAAR_MODELS = {
    "phi-3-mini",
    "phi-3-medium",
    "granite-3.1-2b",
    "granite-3.1-8b",
    "llama-3.1-swallow-8b",
}


def _shortened() -> ScenarioConfig:
    """The scenario on 20 chat sessions and 3 eval queries per setting (45 questions)."""
    data: dict[str, Any] = load_scenario("mixed").model_dump(exclude_defaults=True)
    chat, kv = data["workload"]["params"]["parts"]
    chat["params"]["num_sessions"] = 20
    kv["params"]["num_queries"] = 6
    data["capability"]["fit_workload"]["params"]["num_queries"] = 6
    data["clients"]["rate_per_s"] = 0.2
    return parse_scenario(data, "mixed-shortened")


def test_mixed_scenario_is_the_case_no_seed_covers() -> None:
    config = load_scenario("mixed")
    assert {g.model for g in config.fleet} == LAAR_MODELS
    assert {g.hardware for g in config.fleet} == {"h100", "h200", "a100-80g", "l40s"}
    regions = {g.region for g in config.fleet}
    assert len(regions) == 3 and config.network.router_region in regions
    far = regions - {config.network.router_region}
    assert set(config.network.congestion) == far
    rtt = config.network.rtt_ms[config.network.router_region]
    assert all(80 <= rtt[r] <= 460 for r in far)
    regions_of: dict[str, set[str]] = defaultdict(set)
    for group in config.fleet:
        regions_of[group.model].add(group.region)
    assert sum(len(r) > 1 for r in regions_of.values()) >= 3  # network vs cache trade-offs
    assert 8 <= len(build_endpoints(config)) <= 10
    assert config.workload.generator == "blend"
    assert [p["generator"] for p in config.workload.params["parts"]] == [
        "long-sessions",
        "kv-lookup",
    ]
    assert config.correctness is not None and config.correctness.max_attempts == 10
    assert config.correctness.temperature == 0
    assert config.capability is not None and config.capability.fit_workload is not None
    assert config.capability.fit_workload.params["split"] == "fit"
    assert config.clients.kind == "open" and config.clients.arrival == "poisson"
    assert config.routers is not None and config.routers[:3] == ["ttca", "laar", "gorgo"]
    assert "round-robin" in config.routers
    assert set(resolve_routers(config)) == set(config.routers)
    assert "ours" in config.description


def test_every_prompt_fits_every_endpoint() -> None:
    config = load_scenario("mixed")
    endpoints = build_endpoints(config)
    limits = fit_context_limits(endpoints, build_predictors(endpoints))
    smallest = min(e.max_model_len_tokens or 0 for e in limits)
    workload = build_workload(config, seed=0)
    longest = max(
        t.num_prompt_tokens + t.num_output_tokens for s in workload.sessions for t in s.turns
    )
    assert longest <= smallest
    kinds = {s.session_id[:3] for s in workload.sessions}
    assert kinds == {"p0-", "p1-"}
    assert sum(s.session_id.startswith("p1-") for s in workload.sessions) == 1500


def test_shortened_run_judges_kv_questions_and_not_chat_turns() -> None:
    config = _shortened()
    run = run_scenario(config, seed=0, routers=["laar", "least-load"])
    assert run.capability is not None
    ttca = run.ttca()
    assert list(ttca) == ["laar", "least-load"]
    assert all(summary.num_queries == 45 for summary in ttca.values())
    assert all(0.0 < summary.final_success <= 1.0 for summary in ttca.values())
    for router, result in run.results.items():
        judged = [r for r in result.records if r.is_correct is not None]
        unjudged = [r for r in result.records if r.is_correct is None]
        assert judged and unjudged, router
        assert all(r.session_id is not None for r in result.records)
        assert all((r.query_id or "").startswith("p1-kv") for r in judged), router
        assert all((r.query_id or "").startswith("p0-long-sessions") for r in unjudged), router
        assert {r.session_id[:3] for r in result.records if r.session_id} == {"p0-", "p1-"}
    kv_turns = {t.task for s in run.workload.sessions for t in s.turns}
    assert kv_turns == {None, KV_TASK}
