"""``longroute profile`` against a real engine: vLLM's CPU build serving the tiny model.

The same install, model, skip-or-fail rule and start-up as tests/test_real_engine.py.
vLLM (API server, engine core and workers) is pinned to one CPU, the last one, so
the profiler's client does not share its core (issue 34: ``taskset -c 1`` on this
2-core machine). The profile is the reduced grid (``--quick``), through the CLI, so
the command is what is tested. Single-request TTFTs at held-out lengths the grid never
used must be predicted within 15% by the fitted profile (mean error; none beyond 30%),
loaded as the simulator loads it (``endpoint_predictor``).

The host's speed drifts, by tens of percent within minutes (CI once saw a held-out slope
2.3x the fitted one, on an otherwise idle machine), so the held-out lengths are measured
inside the profile's own prefill phase: the test hands them to the profiler in place
of its held-out midpoints, and they are shuffled in among the grid's lengths, repeated
as often, and kept as the fastest repeat, as the grid's are. Drift then hits the fit's
points and the held-out points alike. It cannot hide a wrong fit: the held-out TTFTs
are measured, at lengths the grid never used, and compared with the file's prediction
as the simulator loads it; a form that bends wrongly between the grid's lengths (no
pair term), a fit that misses its points, or a predictor that misprices the file (a
scale, an extra constant) misses them by as much as on a calm host
(``test_profile.py`` shows those failing against a fake engine whose speed drifts).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from longroute.estimators.measured_engine import load_measured_engine
from longroute.estimators.parallel import endpoint_predictor, prefill_latency_s
from longroute.profiling import run
from longroute.profiling.cli import profile_command
from longroute.profiling.measure import Measurements, Plan, PrefillSample
from longroute.types import Endpoint
from test_real_engine import MAX_MODEL_LEN_TOKENS, VLLM_MODEL, Vllm, serve_vllm

pytestmark = pytest.mark.real_engine

HELD_OUT_TOKENS = (100, 400, 700, 1100, 1600)
MAX_MEAN_ERROR, MAX_ERROR = 0.15, 0.3
"""The acceptance: held-out TTFT within 15%, as a mean over the lengths; one length may
stray further on a shared 2-core host (other work slows single requests ~10%)."""


def _on_last_cpu() -> None:
    """Runs in the child before vLLM: it and its processes get the last CPU only."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-1:])


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    yield from serve_vllm(tmp_path_factory, "vllm-profile", (), _on_last_cpu)


@contextmanager
def _held_out_in_the_profile(lengths: Sequence[int]) -> Iterator[list[Measurements]]:
    """While open, ``longroute profile`` measures ``lengths`` as its held-out prefills
    (shuffled in with the grid); yields the list its measurements are appended to."""
    real_plan, real_measure, seen = run.make_plan, run.measure, []

    def plan(*args: Any, **kwargs: Any) -> Plan:
        return replace(real_plan(*args, **kwargs), holdout_tokens=tuple(lengths))

    async def measure(*args: Any, **kwargs: Any) -> Measurements:
        seen.append(await real_measure(*args, **kwargs))
        return seen[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "make_plan", plan)
        patch.setattr(run, "measure", measure)
        yield seen


def held_out_errors(predict: Callable[[int], float], held: Sequence[PrefillSample]) -> list[float]:
    """Relative error of ``predict`` at each held-out (uncached) prefill."""
    assert all(s.cached_tokens == 0 for s in held)  # unique prompts: nothing cached
    return [abs(predict(s.uncached_tokens) - s.ttft_s) / s.ttft_s for s in held]


def within_bound(errors: Sequence[float]) -> bool:
    return statistics.mean(errors) < MAX_MEAN_ERROR and max(errors) < MAX_ERROR


def test_profile_of_vllm_predicts_held_out_ttft_within_15_percent(
    vllm: Vllm, tmp_path: Path
) -> None:
    out = tmp_path / "engine.yaml"
    app = typer.Typer()
    app.command("profile")(profile_command)
    app.callback()(lambda: None)
    args = ["profile", "--target", vllm.url, "--model", VLLM_MODEL, "--quick", "-o", str(out)]
    with _held_out_in_the_profile(HELD_OUT_TOKENS) as measured:
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
    (m,) = measured
    assert len(m.holdout) == len(HELD_OUT_TOKENS)
    errors = held_out_errors(lambda n: prefill_latency_s(predictor, n, 8192), m.holdout)
    rows = [
        (s.uncached_tokens, round(s.ttft_s, 4), round(e, 3))
        for s, e in zip(m.holdout, errors, strict=True)
    ]
    print("held-out (tokens, TTFT s, error):", rows)
    assert within_bound(errors), f"held-out TTFT off (tokens, TTFT s, error): {rows}"
