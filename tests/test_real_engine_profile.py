"""``longroute profile`` against a real engine: vLLM's CPU build serving the tiny model.

The same install, model, skip-or-fail rule and start-up as tests/test_real_engine.py.
vLLM (API server, engine core and workers) is pinned to one CPU, the last one, so
the profiler's client does not share its core (issue 34: ``taskset -c 1`` on this
2-core machine). The profile is the reduced grid (``--quick``), through the CLI, so
the command is what is tested; then held-out single-request TTFTs at lengths the grid
never used are measured (the fastest of five each) and must be predicted within 15%
by the fitted profile (mean error; none beyond 30%), loaded as the simulator loads it
(``endpoint_predictor``). The whole round (profile, then held-out) runs a second time
only when the first misses (``MAX_ROUNDS``), against the host's drift.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from longroute.estimators.measured_engine import load_measured_engine
from longroute.estimators.parallel import endpoint_predictor, prefill_latency_s
from longroute.profiling.cli import profile_command
from longroute.profiling.client import EngineClient
from longroute.profiling.measure import Prompts, calibrate
from longroute.types import Endpoint
from test_real_engine import MAX_MODEL_LEN_TOKENS, VLLM_MODEL, Vllm, serve_vllm

pytestmark = pytest.mark.real_engine

HELD_OUT_TOKENS = (100, 400, 700, 1100, 1600)
NUM_TRIES = 5


def _on_last_cpu() -> None:
    """Runs in the child before vLLM: it and its processes get the last CPU only."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-1:])


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    yield from serve_vllm(tmp_path_factory, "vllm-profile", (), _on_last_cpu)


async def _held_out(url: str) -> list[tuple[int, float]]:
    """(prompt tokens, TTFT s) of lone requests at lengths the grid never used, the
    fastest of five each, as the profiler keeps the fastest of its repeats."""
    out = []
    async with EngineClient(url, VLLM_MODEL) as client:
        prompts = Prompts(random.Random(1234))
        await calibrate(client, "completions", prompts)
        for n in HELD_OUT_TOKENS:
            tries = [
                await client.stream(prompts.make(n), 1, "completions") for _ in range(NUM_TRIES)
            ]
            assert all(t.num_cached_tokens in (None, 0) for t in tries)  # all uncached
            fastest = min(tries, key=lambda t: t.ttft_s)
            out.append((fastest.num_prompt_tokens, fastest.ttft_s))
    return out


MAX_ROUNDS = 2
"""Profile-then-held-out rounds: the second runs only if the first misses. The host is
shared, and its speed drifts between the fit and the held-out phase (CI saw a held-out
slope 2.3x the fitted one once, on an otherwise idle machine); a wrong profile misses in
both rounds, each judged by the same bound."""


Rows = list[tuple[int, float, float]]  # (prompt tokens, TTFT s, relative error)


def _profile_and_held_out(url: str, out: Path) -> tuple[float, float, Rows]:
    app = typer.Typer()
    app.command("profile")(profile_command)
    app.callback()(lambda: None)
    args = ["profile", "--target", url, "--model", VLLM_MODEL, "--quick", "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    print(result.stdout)  # the fitted terms, for the record (pytest -s)
    engine = load_measured_engine(out)
    assert engine.limits.max_model_len_tokens == MAX_MODEL_LEN_TOKENS  # from /v1/models
    assert engine.limits.kv_capacity_source.startswith("vllm:cache_config_info")
    assert engine.limits.block_size_tokens is not None
    assert engine.provenance.api == "completions"
    assert engine.prefill.r2 > 0.8  # a fit at all (the machine is shared: R² ~0.9-0.99)

    predictor = endpoint_predictor(
        Endpoint(name="vllm", model=VLLM_MODEL, hardware=str(out), region="local")
    )
    held = asyncio.run(_held_out(url))
    errors = [abs(prefill_latency_s(predictor, n, 8192) - t) / t for n, t in held]
    rows = [(n, round(t, 4), round(e, 3)) for (n, t), e in zip(held, errors, strict=True)]
    print("held-out (tokens, TTFT s, error)", rows)
    return statistics.mean(errors), max(errors), rows


def test_profile_of_vllm_predicts_held_out_ttft_within_15_percent(
    vllm: Vllm, tmp_path: Path
) -> None:
    rounds = []
    for i in range(MAX_ROUNDS):
        mean_error, max_error, rows = _profile_and_held_out(vllm.url, tmp_path / f"e{i}.yaml")
        rounds.append(rows)
        # the acceptance: held-out TTFT within 15%, as a mean over the lengths; one length
        # may stray further on a shared 2-core host (other work slows single requests ~10%)
        if mean_error < 0.15 and max_error < 0.3:
            return
    pytest.fail(f"held-out TTFT off in every round (tokens, TTFT s, error): {rounds}")
