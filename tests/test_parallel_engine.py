"""Medha's SPP and KVP in the simulator: the engine's rounds, first-token drain and
per-sequence KV shards, and the scenario keys that ask for them (the predictor's
figures are checked in tests/test_parallelism.py)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from longroute.config import ConfigError, parse_scenario
from longroute.estimators.parallel import ParallelPredictor, make_predictor
from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.routing import ROUTERS
from longroute.sim.clients import ClientSpec
from longroute.sim.network import Network
from longroute.sim.scenario import build_endpoints, build_predictors, fit_context_limits
from longroute.sim.simulator import EngineOptions, SimResult, Simulation
from longroute.types import Endpoint
from longroute.workloads.types import Session, Turn, Workload

BLOCK = 256
RTT_S = 0.04
TRACE = ClientSpec("open", "trace")


def _endpoint(spp: int = 1, kvp: int = 1) -> Endpoint:
    return Endpoint("e0", "llama-3-8b", "h100", "r", spp_degree=spp, kvp_degree=kvp)


def _run(
    workload: Workload,
    endpoint: Endpoint,
    clients: ClientSpec = TRACE,
    options: EngineOptions | None = None,
) -> tuple[RuntimePredictor, SimResult]:
    pred = build_predictors([endpoint])[endpoint.name]
    net = Network({"r": {"r": RTT_S * 1000}}, "r", random.Random(0))
    router = ROUTERS.build("round-robin")
    preds = {endpoint.name: pred}
    sim = Simulation([endpoint], preds, net, router, workload, clients, options=options)
    return pred, sim.run()


def _lone(prompt: int, output: int) -> Workload:
    return Workload("lone", (Session("s0", (Turn(prompt, output),), 0.0),), BLOCK)


def test_spp_2_cuts_a_long_prompts_ttft_by_1_5_to_2x() -> None:
    """Medha §3 (Fig. 5a): two stages stream a long prefill's chunks, so TTFT falls by up
    to 2x, less the stage hops and the drain (asserted 1.5-2x; predicted 1.96x)."""
    _, one = _run(_lone(100_000, 1), _endpoint())
    _, two = _run(_lone(100_000, 1), _endpoint(spp=2))
    ratio = (one.records[0].ttft_s - RTT_S) / (two.records[0].ttft_s - RTT_S)
    assert 1.5 <= ratio <= 2.0


def test_the_first_token_is_reported_after_the_pipeline_drains() -> None:
    """TTFT = RTT + the prefill's rounds + (p - 1) ticks of the last round; a one-token
    answer finishes with its first token, not before it."""
    pred, res = _run(_lone(20_000, 1), _endpoint(spp=4))
    chunks = [(8192, 0), (8192, 8192), (3616, 16384)]
    rounds = [pred.iteration_time_s(q, causal_attention_pairs(q, c), c, 0, 0) for q, c in chunks]
    drain = pred.first_token_delay_s(rounds[-1])
    assert drain > 0.0
    (rec,) = res.records
    assert rec.ttft_s == pytest.approx(RTT_S + sum(rounds) + drain, rel=1e-12)
    assert rec.e2e_s == pytest.approx(rec.ttft_s, rel=1e-12)
    assert res.num_iterations == 3  # the drain holds no round


def test_under_spp_decoding_starts_once_the_first_token_is_out() -> None:
    """The drained sequence's later tokens follow its first at the round rate: a lone
    request's decode takes exactly its decode rounds after the first token."""
    prompt, output = 30_000, 40
    pred, res = _run(_lone(prompt, output), _endpoint(spp=2))
    rec = res.records[0]
    decode_s = pred.decode_stretch_time_s(1, prompt, output - 1)
    assert rec.finish_s - rec.first_token_s == pytest.approx(decode_s, rel=1e-12)


def test_kvp_engine_decodes_a_long_context_faster() -> None:
    """Fig. 7a in the engine: a lone 100K-token sequence spans both groups of KVP-2 (one
    per 65,536 tokens), so its TPOT is lower than on one group; the engine's per-sequence
    rounds equal the predictor's for a lone sequence."""
    prompt, output = 100_000, 64
    _, one = _run(_lone(prompt, output), _endpoint())
    pred, two = _run(_lone(prompt, output), _endpoint(kvp=2))
    tpot_one, tpot_two = one.records[0].tpot_s, two.records[0].tpot_s
    assert tpot_one is not None and tpot_two is not None
    assert tpot_two < 0.95 * tpot_one
    decode_s = pred.decode_stretch_time_s(1, prompt, output - 1)
    rec = two.records[0]
    assert rec.finish_s - rec.first_token_s == pytest.approx(decode_s, rel=1e-12)
    assert two.num_iterations == one.num_iterations  # stepped, not stretched


def _chat(n: int, seed: int) -> Workload:
    rng = random.Random(seed)
    sessions = tuple(
        Session(f"s{i}", (Turn(rng.randint(100, 3000), rng.randint(20, 400)),)) for i in range(n)
    )
    return Workload("chat", sessions, BLOCK)


@pytest.mark.parametrize(("spp", "kvp"), [(1, 1), (2, 1), (2, 2)])
def test_stretching_equals_stepping(spp: int, kvp: int) -> None:
    """Decode stretches under SPP are exact; under KVP the engine never stretches."""
    wl, clients = _chat(150, seed=3), ClientSpec("open", "poisson", rate_per_s=8.0)
    endpoint = Endpoint("e0", "llama-3-8b", "h100", "r", spp_degree=spp, kvp_degree=kvp)
    _, fast = _run(wl, endpoint, clients)
    _, slow = _run(wl, endpoint, clients, EngineOptions(is_fast_forward=False))
    assert len(fast.records) == len(slow.records) == 150
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-9)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
        assert a.first_token_s <= a.finish_s
    assert fast.num_iterations == slow.num_iterations
    if kvp > 1:
        assert fast.num_events == slow.num_events


# --- scenario keys ---------------------------------------------------------------------------


def _scenario(**group: Any) -> dict[str, Any]:
    return {
        "name": "parallel",
        "network": {"router_region": "r", "rtt_ms": {"r": {"r": 1}}},
        "fleet": [
            {
                "name": "a",
                "model": "llama-3-70b",
                "hardware": "h100",
                "region": "r",
                "num_gpus": 8,
                "replicas": 2,
                **group,
            },
            {"name": "b", "model": "llama-3-70b", "hardware": "h100", "region": "r", "num_gpus": 8},
        ],
        "workload": {"generator": "short-chat", "params": {"num_sessions": 5}},
    }


def test_fleet_groups_take_spp_and_kvp_degrees() -> None:
    config = parse_scenario(_scenario(spp_degree=4, kvp_degree=2), "p.yaml")
    a0, a1, b = build_endpoints(config)
    assert (a0.spp_degree, a0.kvp_degree, a0.total_gpus) == (4, 2, 64)
    assert (b.spp_degree, b.kvp_degree, b.total_gpus) == (1, 1, 8)
    preds = build_predictors([a0, a1, b])
    assert preds["a-0"] is preds["a-1"] and preds["a-0"] is not preds["b"]
    assert isinstance(preds["a-0"], ParallelPredictor)
    assert (preds["a-0"].spp_degree, preds["a-0"].kvp_degree) == (4, 2)
    assert type(preds["b"]) is RuntimePredictor
    # endpoints keep the model's context limit however much KV memory they have
    limits = {e.name: e.max_model_len_tokens for e in fit_context_limits([a0, b], preds)}
    assert limits == {"a-0": 131072, "b": 131072}


@pytest.mark.parametrize("value", [0, 1.5, "two"])
@pytest.mark.parametrize("key", ["spp_degree", "kvp_degree"])
def test_bad_degrees_name_the_file_and_field(key: str, value: object) -> None:
    data = copy.deepcopy(_scenario(**{key: value}))
    with pytest.raises(ConfigError) as info:
        parse_scenario(data, "p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml:") and f"fleet.0.{key}" in message


def test_endpoints_check_their_degrees() -> None:
    with pytest.raises(ValueError, match="spp_degree"):
        Endpoint("e", "llama-3-8b", "h100", "r", spp_degree=0)
    model, h100 = load_model_profile("llama-3-8b"), load_hardware_profile("h100")
    assert make_predictor(model, h100, 1, spp_degree=2).spp_degree == 2
