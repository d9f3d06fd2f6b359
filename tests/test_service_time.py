"""EndpointTimeModel keeps what predict() reads of its counters between changes, and
prices decode steps through RuntimePredictor.decode_step_line: neither may change a
single prediction (the ttca router's decisions depend on exact ties)."""

from __future__ import annotations

import random

import pytest

from longroute.estimators.parallel import endpoint_predictor
from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.service_time import EndpointTimeModel
from longroute.types import Endpoint

ENDPOINTS = (
    Endpoint("tp1", "phi-3-mini", "a100-80g", "r"),
    Endpoint("tp2", "granite-3.1-8b", "h100", "r", num_gpus=2),
    Endpoint("spp2", "llama-3.1-swallow-8b", "l40s", "r", num_gpus=2, spp_degree=2),
)


@pytest.mark.parametrize("endpoint", ENDPOINTS[:2], ids=lambda e: e.name)
def test_the_decode_step_line_is_the_iteration_time_bit_for_bit(endpoint: Endpoint) -> None:
    predictor = endpoint_predictor(endpoint)
    assert type(predictor) is RuntimePredictor
    rng = random.Random(7)
    for _ in range(2000):
        batch, kv = rng.randint(1, 300), rng.randint(0, 4_000_000)
        line = predictor.decode_step_line(batch)
        assert line is not None
        fixed_s, attention_s, kv_s = line
        busy_s, read_s = kv * attention_s, (kv + batch) * kv_s
        assert fixed_s + max(busy_s, read_s) == predictor.iteration_time_s(0, 0.0, 0, batch, kv)


def test_a_pipelined_layout_has_no_decode_step_line() -> None:
    assert endpoint_predictor(ENDPOINTS[2]).decode_step_line(4) is None


def _replay(model: EndpointTimeModel, ops: list[tuple[str, tuple[float, ...]]]) -> None:
    for name, args in ops:
        getattr(model, name)(*args)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
def test_predictions_follow_every_counter_change(endpoint: Endpoint) -> None:
    """One model predicts between every change (so it prices from its kept state);
    a fresh one replays the same changes and predicts once: they must agree exactly,
    whatever the scraped number of running requests."""
    predictor = endpoint_predictor(endpoint)
    rng = random.Random(endpoint.name)
    kept = EndpointTimeModel(predictor, 2048, 0.1)
    ops: list[tuple[str, tuple[float, ...]]] = []
    flights: list[list[float]] = []  # uncached, cached, kv, remaining, is_decoding
    num_checked = 0
    for _ in range(400):
        if not flights or rng.random() < 0.45:
            u, c = rng.randint(0, 9000), rng.randint(0, 30000)
            flights.append([u, c, u + c + 40.0, 40.0, 0])
            ops.append(("add_pending", (u, c)))
        elif rng.random() < 0.6:
            f = rng.choice(flights)
            if f[4]:
                continue
            f[4] = 1
            ops.append(("start_decoding", (f[0], f[1], f[2], f[3])))
        else:
            f = flights.pop(rng.randrange(len(flights)))
            ops.append(("end_decoding", (f[2], f[3])) if f[4] else ("end_pending", (f[0], f[1])))
        if rng.random() < 0.2:
            observed = rng.uniform(0.05, 2.0)
            ops.append(("observe_ttft", (1.0, observed, 1.0, observed)))
        _replay(kept, ops[-2:] if ops[-1][0] == "observe_ttft" else ops[-1:])
        fresh = EndpointTimeModel(predictor, 2048, 0.1)
        _replay(fresh, ops)
        for _ in range(3):
            running = rng.choice([None, 0, rng.randint(0, 60)])
            request = (rng.randint(0, 20000), rng.randint(0, 50000), rng.randint(1, 2000))
            assert kept.predict(*request, running) == fresh.predict(*request, running)
            num_checked += 1
    assert num_checked > 900 and kept.num_ttft_observed > 0
