"""``agent-workflows`` (Chimera-like traces): determinism, workflow structure, the length and
score targets, correlation across models, the outcomes rows, knob errors, the Qwen2.5 and
A6000 profiles and the registry entry."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.registry import RegistryError
from longroute.workloads.agent_models import (
    LENGTH_TARGETS,
    MODELS,
    SCORE_TARGETS,
    WORKFLOW_KINDS,
)
from longroute.workloads.agent_outcomes import OutcomeRow
from longroute.workloads.agent_workflows import agent_outcomes, agent_workflows
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.types import AgentStage, Session, Workload

ALL_MODELS = tuple(MODELS)
NUM_WORKFLOWS = 4000


def _agents(session: Session) -> list[AgentStage]:
    agents = [turn.agent for turn in session.turns]
    assert all(agent is not None for agent in agents)
    return [agent for agent in agents if agent is not None]


def _totals(workload: Workload, model: str) -> np.ndarray:
    return np.asarray([sum(a.output_tokens_by_model[model] for a in _agents(s))
                       for s in workload.sessions])  # fmt: skip


def _correct(workload: Workload, model: str) -> np.ndarray:
    return np.asarray([_agents(s)[0].is_correct_by_model[model] for s in workload.sessions])


@pytest.fixture(scope="module", params=["apps", "math"])
def big(request: pytest.FixtureRequest) -> Workload:
    """4,000 workflows of one dataset on every built-in model."""
    return agent_workflows(
        num_workflows=NUM_WORKFLOWS, seed=11, models=ALL_MODELS, datasets=(request.param,)
    )


def _dataset(workload: Workload) -> str:
    return _agents(workload.sessions[0])[0].dataset


def test_same_seed_same_workload_and_other_seed_another() -> None:
    first = agent_workflows(num_workflows=50, seed=5)
    assert first == agent_workflows(num_workflows=50, seed=5)
    assert first != agent_workflows(num_workflows=50, seed=6)


def test_a_models_truth_does_not_depend_on_the_other_models_listed() -> None:
    alone = agent_workflows(num_workflows=60, seed=2, models=("qwen2.5-7b",))
    both = agent_workflows(num_workflows=60, seed=2, models=("qwen2.5-14b", "qwen2.5-7b"))
    for one, two in zip(alone.sessions, both.sessions, strict=True):
        for a, b in zip(_agents(one), _agents(two), strict=True):
            assert a.output_tokens_by_model["qwen2.5-7b"] == b.output_tokens_by_model["qwen2.5-7b"]
            assert a.is_correct_by_model["qwen2.5-7b"] == b.is_correct_by_model["qwen2.5-7b"]
            assert a.prompt == b.prompt


def test_stages_follow_the_papers_workflows() -> None:
    workload = agent_workflows(num_workflows=600, seed=1, block_size_tokens=16)
    assert workload.name == "agent-workflows" and workload.block_size_tokens == 16
    roles = {k.name: k.roles for kinds in WORKFLOW_KINDS.values() for k in kinds}
    assert set(roles) == {
        "apps/coder", "apps/planner-coder", "apps/planner-coder-qa-coder",
        "math/solver", "math/planner-solver", "math/planner-solver-verifier-solver",
    }  # fmt: skip
    seen: Counter[str] = Counter()
    system_blocks: dict[tuple[str, str], tuple[int, ...]] = {}
    for index, session in enumerate(workload.sessions):
        assert session.session_id == f"wf-{index:06d}"
        agents = _agents(session)
        workflow = agents[0].workflow
        seen[workflow] += 1
        assert tuple(a.role for a in agents) == roles[workflow]
        assert [a.stage for a in agents] == list(range(1, len(agents) + 1))
        assert len({a.difficulty for a in agents}) == 1 and 1 <= agents[0].difficulty <= 5
        assert len({tuple(sorted(a.is_correct_by_model.items())) for a in agents}) == 1
        for turn, agent in zip(session.turns, agents, strict=True):
            assert agent.num_stages == len(agents) and agent.workflow == workflow
            assert turn.task == agent.dataset and workflow.startswith(agent.dataset + "/")
            assert set(agent.output_tokens_by_model) == {"qwen2.5-1.5b", "qwen2.5-7b"}
            assert turn.num_output_tokens == max(agent.output_tokens_by_model.values()) >= 1
            assert turn.num_prompt_tokens > agent.num_system_tokens > 0
            assert len(turn.block_hashes) == agent.num_system_tokens // 16
            assert turn.think_time_s == 0.0
            key = (agent.dataset, agent.role)
            assert system_blocks.setdefault(key, turn.block_hashes) == turn.block_hashes
            assert f"stage {agent.stage} of {agent.num_stages}" in agent.prompt.user
    assert set(seen) == set(roles)
    assert min(seen.values()) > 600 / 6 * 0.7  # uniform mix of datasets and kinds
    hashes = list(system_blocks.values())
    assert len({h[0] for h in hashes}) == len(hashes)  # roles share nothing


def test_later_stages_mark_what_earlier_stages_produced() -> None:
    workload = agent_workflows(num_workflows=40, seed=3, stage_mix=(0, 0, 1), datasets=("apps",))
    for session in workload.sessions:
        users = [a.prompt.user for a in _agents(session)]
        assert "Plan from the planner" not in users[0]
        assert "Plan from the planner (stage 1)" in users[1]
        assert "QA report (stage 3)" in users[3] and "-----Input-----" in users[3]


def test_stage_mix_picks_the_workflow_kinds() -> None:
    only_one = agent_workflows(num_workflows=100, seed=0, stage_mix=(1, 0, 0))
    assert {len(s.turns) for s in only_one.sessions} == {1}
    only_four = agent_workflows(num_workflows=100, seed=0, stage_mix=(0.0, 0.0, 2.0))
    assert {len(s.turns) for s in only_four.sessions} == {4}


def test_tool_time_pauses_before_later_stages() -> None:
    workload = agent_workflows(num_workflows=30, seed=0, tool_time_s=0.25, stage_mix=(0, 1, 0))
    assert {tuple(t.think_time_s for t in s.turns) for s in workload.sessions} == {(0.0, 0.25)}


def test_total_output_per_model_has_the_target_mean_and_sd(big: Workload) -> None:
    dataset = _dataset(big)
    for model in ALL_MODELS:
        totals, target = _totals(big, model), LENGTH_TARGETS[model][dataset]
        assert totals.mean() == pytest.approx(target.mean_tokens, rel=0.12), model
        assert totals.std() == pytest.approx(target.sd_tokens, rel=0.35), model


def test_small_models_have_heavy_tails_and_the_cap_holds(big: Workload) -> None:
    small, large = _totals(big, "qwen2.5-1.5b"), _totals(big, "qwen2.5-14b")
    assert small.std() / small.mean() > 2.0 > large.std() / large.mean()
    assert np.median(small) < np.median(large)
    assert small.max() <= 28_672 and small.max() > 8 * small.mean()
    for session in big.sessions[:500]:
        for model in ALL_MODELS:
            history = 0
            for turn, agent in zip(session.turns, _agents(session), strict=True):
                output = agent.output_tokens_by_model[model]
                assert turn.num_prompt_tokens + history + output <= 32_768
                history += output


def test_task_scores_are_in_the_stated_ranges(big: Workload) -> None:
    dataset = _dataset(big)
    scores = [_correct(big, model).mean() for model in ALL_MODELS]
    for model, score in zip(ALL_MODELS, scores, strict=True):
        assert score == pytest.approx(SCORE_TARGETS[model][dataset], abs=0.035), model
    assert scores == sorted(scores)  # bigger models are more skilled


def test_the_larger_models_gain_most_on_some_topics() -> None:
    # the topics' scale gains: 7B over 1.5B adds far more on geometry and intermediate
    # algebra than on prealgebra, so a router that reads the topic can spend the 7B well
    workload = agent_workflows(num_workflows=6000, seed=5, datasets=("math",))
    small, large = _correct(workload, "qwen2.5-1.5b"), _correct(workload, "qwen2.5-7b")
    subjects = np.asarray([
        next((line for line in _agents(s)[0].prompt.user.splitlines()
              if line.startswith("Subject: ")), "")
        for s in workload.sessions
    ])  # fmt: skip
    hard = np.isin(subjects, ["Subject: Geometry.", "Subject: Intermediate Algebra."])
    easy = subjects == "Subject: Prealgebra."
    assert hard.sum() > 300 and easy.sum() > 100
    gain_hard = large[hard].mean() - small[hard].mean()
    gain_easy = large[easy].mean() - small[easy].mean()
    assert gain_hard > gain_easy + 0.1 > 0.1


def test_models_agree_on_which_tasks_are_long_and_hard(big: Workload) -> None:
    small, large = _totals(big, "qwen2.5-1.5b"), _totals(big, "qwen2.5-14b")
    rank_corr = np.corrcoef(np.argsort(np.argsort(small)), np.argsort(np.argsort(large)))[0, 1]
    assert rank_corr > 0.5
    weak, strong = _correct(big, "qwen2.5-1.5b"), _correct(big, "qwen2.5-14b")
    assert strong[weak].mean() > strong.mean() + 0.15
    levels = np.asarray([_agents(s)[0].difficulty for s in big.sessions])
    assert strong[levels <= 2].mean() > strong[levels >= 4].mean() + 0.2


def test_the_text_tells_the_level_only_partly() -> None:
    workload = agent_workflows(num_workflows=3000, seed=4, datasets=("math",))
    agrees, tagged = 0, 0
    for session in workload.sessions:
        agent = _agents(session)[0]
        aime = "Source: AIME." in agent.prompt.user
        tagged += aime
        agrees += aime and agent.difficulty >= 4
    assert 0.6 < agrees / tagged < 0.97  # mostly hard, sometimes not


def test_outcomes_run_every_workflow_whole_on_every_model() -> None:
    workload = agent_workflows(num_workflows=80, seed=9, models=("qwen2.5-1.5b", "qwen2.5-14b"))
    rows = agent_outcomes(workload)
    assert len(rows) == 2 * workload.num_requests
    by_run: dict[tuple[str, str], list[OutcomeRow]] = {}
    for row in rows:
        by_run.setdefault((row.program_id, row.model), []).append(row)
    sessions = {s.session_id: s for s in workload.sessions}
    for (program, model), run in by_run.items():
        session = sessions[program]
        agents = _agents(session)
        assert [r.stage for r in run] == [a.stage for a in agents]
        outputs = [a.output_tokens_by_model[model] for a in agents]
        assert [r.output_tokens for r in run] == outputs
        stages = range(len(run))
        assert [r.remaining_output_tokens for r in run] == [sum(outputs[i:]) for i in stages]
        history = [sum(outputs[:i]) for i in stages]
        prompts = [t.num_prompt_tokens + h for t, h in zip(session.turns, history, strict=True)]
        assert [r.num_prompt_tokens for r in run] == prompts
        assert {r.is_correct for r in run} == {agents[0].is_correct_by_model[model]}
        assert all(r.difficulty == agents[0].difficulty for r in run)
        assert [r.system for r in run] == [a.prompt.system for a in agents]
        assert [r.user for r in run] == [a.prompt.user for a in agents]


def test_outcomes_refuse_a_workload_without_agent_stages() -> None:
    plain = WORKLOADS.build("short-chat", {"num_sessions": 2}, seed=0)
    with pytest.raises(ValueError, match=r"short-chat-000000.*not an agent workflow"):
        agent_outcomes(plain)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"num_workflows": 0}, "num_workflows must be an integer >= 1, got 0"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"models": ("gpt-4",)}, "'gpt-4'.*valid: qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b"),
        ({"models": ()}, "non-empty list"),
        ({"models": "qwen2.5-7b"}, "non-empty list"),
        ({"models": ("qwen2.5-7b", "qwen2.5-7b")}, "must not repeat"),
        ({"datasets": ("code",)}, "datasets must be distinct names from apps, math"),
        ({"block_size_tokens": 0}, "block_size_tokens must be an integer >= 1"),
        ({"stage_mix": (1, 1)}, "stage_mix must be a list of 3 weights"),
        ({"stage_mix": (1, -1, 1)}, "stage_mix must hold numbers >= 0"),
        ({"stage_mix": (0, 0, 0)}, "positive sum"),
        ({"stage_mix": (1, float("nan"), 1)}, "stage_mix must hold numbers >= 0"),
        ({"max_total_output_tokens": 10}, "max_total_output_tokens must be an integer >= 64"),
        ({"tool_time_s": -0.5}, "tool_time_s must be a number >= 0"),
        ({"tool_time_s": float("inf")}, "tool_time_s must be finite"),
    ],
)
def test_bad_knobs_are_named(knobs: dict[str, object], message: str) -> None:
    params: dict[str, object] = {"num_workflows": 5, "seed": 0, **knobs}
    with pytest.raises(ValueError, match=message):
        agent_workflows(**params)  # type: ignore[arg-type]


def test_the_registry_builds_it_by_name() -> None:
    workload = WORKLOADS.build(
        "agent-workflows", {"num_workflows": 12, "models": ["qwen2.5-14b"]}, seed=4
    )
    assert workload == agent_workflows(num_workflows=12, seed=4, models=("qwen2.5-14b",))
    with pytest.raises(RegistryError, match=r"'llama-3-8b'.*valid: qwen2\.5-1\.5b"):
        WORKLOADS.build("agent-workflows", {"num_workflows": 2, "models": ["llama-3-8b"]}, seed=0)


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "kv_heads", "num_params", "tied"),
    [
        ("qwen2.5-1.5b", 28, 1536, 2, 1_543_714_304, True),
        ("qwen2.5-3b", 36, 2048, 2, 3_085_938_688, True),
        ("qwen2.5-7b", 28, 3584, 4, 7_615_616_512, False),
        ("qwen2.5-14b", 48, 5120, 8, 14_770_033_664, False),
    ],
)
def test_qwen_profiles_load(
    name: str, layers: int, hidden: int, kv_heads: int, num_params: int, tied: bool
) -> None:
    profile = load_model_profile(name)
    assert (profile.num_layers, profile.hidden_size, profile.num_kv_heads) == (
        layers, hidden, kv_heads,
    )  # fmt: skip
    assert profile.num_params == num_params and profile.tie_word_embeddings is tied
    assert profile.head_dim == 128 and profile.max_model_len_tokens == 32_768
    assert name in MODELS  # every built-in generator model has a profile


def test_a6000_profile_loads() -> None:
    gpu = load_hardware_profile("a6000")
    assert gpu.peak_flops_per_s == 154.8e12 and gpu.memory_bandwidth_bytes_per_s == 768e9
    assert gpu.memory_bytes == 49_140 * 2**20 and gpu.interconnect_bytes_per_s == 32e9
    # a 14B model's bf16 weights fit one A6000, as in the paper's setup
    assert load_model_profile("qwen2.5-14b").num_params * 2 < 0.9 * gpu.memory_bytes
