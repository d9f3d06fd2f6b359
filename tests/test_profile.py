"""``longroute profile`` against the emulator: the fitted profile predicts what the engine
does, and the simulator, the emulator and ttca load it as an endpoint's hardware.

The emulator runs at speed 1 where timings matter (its TTFTs follow its own roofline
profile, so a fit that predicts held-out TTFTs has learned that profile from outside),
and fast elsewhere. The error tests use a tiny fake engine on loopback.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import typer
from aiohttp import web
from typer.testing import CliRunner

from longroute.config import parse_scenario
from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.options import build_endpoint, build_predictor
from longroute.estimators.measured_engine import (
    load_measured_engine,
    parse_measured_engine,
    write_measured_engine,
)
from longroute.estimators.parallel import endpoint_predictor, prefill_latency_s
from longroute.estimators.profiles import ProfileError
from longroute.estimators.runtime_measured import MeasuredPredictor
from longroute.profiling.cli import profile_command
from longroute.profiling.client import EngineClient, StreamResult
from longroute.profiling.measure import PrefillSample, Prompts, calibrate, make_plan
from longroute.profiling.run import ProfileOptions, ProfileRun, profile_engine
from longroute.sim.scenario import run_scenario
from longroute.types import Endpoint

MODEL = "llama-3-8b"
HARDWARE = "a40"  # slow enough that prefills take tens to hundreds of ms at speed 1
MAX_LEN = 4096


@dataclass(frozen=True, slots=True)
class Profiled:
    run: ProfileRun
    path: Path
    held_out: list[tuple[int, float]]  # (prompt tokens, measured TTFT s), not in the fit


async def _profile_and_hold_out(path: Path) -> Profiled:
    options = EmulatorOptions(
        profile=MODEL, hardware=HARDWARE, port=0, speed=1.0, max_model_len_tokens=MAX_LEN
    )
    runner, url = await start_emulator(options)
    try:
        run = await profile_engine(url, MODEL, ProfileOptions(quick=True, seed=1))
        held: list[tuple[int, float]] = []
        async with EngineClient(url, MODEL) as client:  # lengths the grid never used
            prompts = Prompts(random.Random(99))
            await calibrate(client, "completions", prompts)
            for n in (50, 300, 777, 1500, 2600, 3300):
                r = await client.stream(prompts.make(n), 1, "completions")
                held.append((r.num_prompt_tokens, r.ttft_s))
    finally:
        await runner.cleanup()
    write_measured_engine(run.engine, path)
    return Profiled(run, path, held)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Profiled:
    path = tmp_path_factory.mktemp("profile") / "engine.yaml"
    return asyncio.run(_profile_and_hold_out(path))


def _endpoint(path: Path, model: str = MODEL) -> Endpoint:
    return Endpoint(name="e", model=model, hardware=str(path), region="local")


def test_the_fit_predicts_held_out_ttfts_within_15_percent(profiled: Profiled) -> None:
    predictor = endpoint_predictor(_endpoint(profiled.path))
    assert isinstance(predictor, MeasuredPredictor)
    errors = []
    for n, ttft_s in profiled.held_out:
        predicted_s = prefill_latency_s(predictor, n, 8192)
        errors.append(abs(predicted_s - ttft_s) / ttft_s)
    assert max(errors) < 0.15, (errors, profiled.held_out)
    fit = profiled.run.engine.prefill
    assert fit.holdout_mape < 0.15 and fit.r2 > 0.95
    assert fit.s_per_pair > 0.0  # attention's quadratic term was seen


def test_decode_steps_match_the_emulators_own_model(profiled: Profiled) -> None:
    measured = endpoint_predictor(_endpoint(profiled.path))
    truth = build_predictor(EmulatorOptions(profile=MODEL, hardware=HARDWARE))
    for batch, context in [(1, 100), (4, 4 * 1000), (8, 8 * 300)]:
        want = truth.iteration_time_s(0, 0.0, 0, batch, context)
        got = measured.iteration_time_s(0, 0.0, 0, batch, context)
        assert got == pytest.approx(want, rel=0.15), (batch, context)
    # the step overhead the issue asks about: the roofline's fixed part, seen from outside
    assert profiled.run.engine.decode.fixed_s == pytest.approx(
        truth.iteration_time_s(0, 0.0, 0, 1, 0), rel=0.15
    )


def test_the_file_records_limits_provenance_and_round_trips(profiled: Profiled) -> None:
    engine = load_measured_engine(profiled.path)
    assert engine == replace(profiled.run.engine)  # what was written is what is read
    assert engine.limits.max_model_len_tokens == MAX_LEN
    assert "lower bound" in engine.limits.kv_capacity_source  # the emulator has no cache info
    assert engine.provenance.target_model == MODEL and engine.provenance.api == "completions"
    assert engine.prefill_points and engine.decode_points
    short = {b for b, c, _ in engine.decode_points if c < 1000}
    assert short == {1, 2, 4, 8}  # all batches at short context; at long, what fits in KV


def test_predictor_methods_agree_with_each_other(profiled: Profiled) -> None:
    p = endpoint_predictor(_endpoint(profiled.path))
    b, c0, k = 3, 900, 40
    stretch = p.decode_stretch_time_s(b, c0, k)
    assert stretch == pytest.approx(
        sum(p.iteration_time_s(0, 0.0, 0, b, c0 + i * b) for i in range(k))
    )
    line = p.decode_step_line(b)
    assert line is not None
    fixed, per_ctx, kv = line
    assert fixed + max(c0 * per_ctx, (c0 + b) * kv) == pytest.approx(
        p.iteration_time_s(0, 0.0, 0, b, c0)
    )
    steps, spent = p.decode_steps_within(b, c0, stretch * 0.5, k)
    assert 0 < steps < k and spent <= stretch * 0.5
    assert p.decode_stretch_time_s(b, c0, steps + 1) > stretch * 0.5
    mixed = p.iteration_time_s(100, 100 * 101 / 2, 0, b, c0)  # sums the measured parts
    assert mixed > p.iteration_time_s(0, 0.0, 0, b, c0)
    assert p.kv_capacity_tokens(0.5) == p.kv_capacity_tokens(0.9) == MAX_LEN
    assert p.model.max_model_len_tokens == MAX_LEN  # the model's 8192 capped by the engine


def test_a_gateway_model_without_profile_still_gets_times(profiled: Profiled) -> None:
    p = endpoint_predictor(_endpoint(profiled.path, model="my-served-name"))
    assert p.iteration_time_s(500, 500 * 501 / 2, 0, 0, 0) > 0.0
    with pytest.raises(ProfileError, match="model profile"):
        _ = p.model
    with pytest.raises(ValueError, match="spp_degree"):
        endpoint_predictor(replace(_endpoint(profiled.path), spp_degree=2))


def test_ttca_in_the_gateway_accepts_a_measured_backend(profiled: Profiled) -> None:
    from longroute.gateway.backends import build_backends
    from longroute.gateway.config import parse_gateway_config
    from longroute.routing.ttca import TtcaRouter

    backend = {"name": "v", "url": "http://127.0.0.1:9", "model": "tiny"}
    backend["hardware"] = str(profiled.path)
    config = parse_gateway_config({"backends": [backend], "router": {"name": "ttca"}}, "gw.yaml")
    backends = build_backends(config, {})
    # no error, and no prior: times come from the file
    assert TtcaRouter().check_endpoints([b.endpoint for b in backends.values()]) == []


def test_the_simulator_runs_engines_from_the_file(profiled: Profiled) -> None:
    def scenario(hardware: str) -> Any:
        return parse_scenario({
            "name": "measured", "seed": 1,
            "network": {"router_region": "near", "rtt_ms": {"near": {"near": 1}}},
            "fleet": [{"name": "a", "model": MODEL, "hardware": hardware, "region": "near"}],
            "workload": {"generator": "short-chat", "params": {"num_sessions": 30}},
            "clients": {"kind": "open", "arrival": "poisson", "rate_per_s": 2},
        }, "test.yaml")  # fmt: skip

    measured = run_scenario(scenario(str(profiled.path)), routers=["round-robin"])
    roofline = run_scenario(scenario("h100"), routers=["round-robin"])
    fixed_s = profiled.run.engine.prefill.fixed_s
    ttfts = [r.first_token_s - r.dispatch_s for r in measured.results["round-robin"].records]
    fast = [r.first_token_s - r.dispatch_s for r in roofline.results["round-robin"].records]
    assert len(ttfts) == len(fast) > 20
    assert min(ttfts) >= fixed_s * 0.99  # every first token pays the measured fixed term
    assert min(fast) < fixed_s / 2  # which the h100 roofline does not


def test_the_emulator_serves_a_measured_engine(profiled: Profiled) -> None:
    options = EmulatorOptions(profile=MODEL, hardware=str(profiled.path), speed=50.0, port=0)
    predictor = build_predictor(options)
    assert isinstance(predictor, MeasuredPredictor)
    assert build_endpoint(options, predictor).max_model_len_tokens == MAX_LEN

    async def one_request() -> int:
        runner, url = await start_emulator(options)
        try:
            async with EngineClient(url, MODEL) as client:
                status, body = await client.get_text("/v1/models")
                assert status == 200
                return int(json.loads(body)["data"][0]["max_model_len"])
        finally:
            await runner.cleanup()

    assert asyncio.run(one_request()) == MAX_LEN


def test_a_malformed_file_is_a_clear_error(tmp_path: Path, profiled: Profiled) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(profiled.path.read_text().replace("kind: measured-engine", "kind: other"))
    with pytest.raises(ProfileError, match="kind must be 'measured-engine'"):
        endpoint_predictor(_endpoint(bad))
    with pytest.raises(ProfileError, match="cannot be read"):
        endpoint_predictor(_endpoint(tmp_path / "missing.yaml"))
    with pytest.raises(ProfileError, match="s_per_token must be >= 0"):
        text = profiled.path.read_text()
        import yaml

        data = yaml.safe_load(text)
        data["prefill"]["s_per_token"] = -1.0
        parse_measured_engine(data, "x.yaml")


# ---- errors: one line, exit 2, no traceback ---------------------------------------------


@dataclass
class FakeEngine:
    """A chat-only engine that either does not stream or streams without usage."""

    mode: str  # "json" | "no-usage" | "strict" (refuses ignore_eos, else streams usage)
    url: str = ""

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "max_model_len": 512}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        delta = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
        if self.mode == "strict" and "ignore_eos" in body:
            error = {"error": {"message": "Unrecognized request argument: ignore_eos"}}
            return web.json_response(error, status=400)
        if self.mode == "json":
            message = {"choices": [{"index": 0, "message": {"content": "hi"}}]}
            return web.json_response(message)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(delta)}\n\n".encode())
        if self.mode == "strict":
            usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
            await response.write(f"data: {json.dumps(usage)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _serve(engine: FakeEngine) -> Iterator[FakeEngine]:
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/v1/models", engine.models)
    app.router.add_post("/v1/chat/completions", engine.chat)  # no /v1/completions: 404
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    engine.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield engine
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _cli(tmp_path: Path, url: str) -> Any:
    app = typer.Typer()
    app.command("profile")(profile_command)
    app.callback()(lambda: None)
    args = ["profile", "--target", url, "--model", "fake", "-o", str(tmp_path / "e.yaml")]
    return CliRunner().invoke(app, args)


def _check_one_line_error(result: Any, *words: str) -> None:
    assert result.exit_code == 2, result.output
    text = result.stderr.replace("\n", " ")
    assert result.stderr.startswith("error:") and "Traceback" not in result.output
    for word in words:
        assert word in text, text


def test_an_unreachable_target_is_a_clean_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nobody listens
    _check_one_line_error(_cli(tmp_path, f"http://127.0.0.1:{port}"), "cannot reach")
    assert not (tmp_path / "e.yaml").exists()


def test_a_target_that_does_not_stream_is_a_clean_error(tmp_path: Path) -> None:
    for engine in _serve(FakeEngine("json")):
        _check_one_line_error(_cli(tmp_path, engine.url), "does not stream")


def test_a_target_without_usage_is_a_clean_error(tmp_path: Path) -> None:
    for engine in _serve(FakeEngine("no-usage")):
        _check_one_line_error(_cli(tmp_path, engine.url), "reports no usage")


def test_a_target_that_refuses_ignore_eos_is_asked_without_it() -> None:
    async def two_requests(url: str) -> tuple[bool, int, int]:
        async with EngineClient(url, "fake") as client:
            first = await client.stream("hello there", 1, "chat")
            second = await client.stream("hello again", 1, "chat")
            return client.sends_ignore_eos, first.num_prompt_tokens, second.num_prompt_tokens

    for engine in _serve(FakeEngine("strict")):
        assert asyncio.run(two_requests(engine.url)) == (False, 7, 7)


def test_without_max_model_len_the_limit_is_probed() -> None:
    from longroute.profiling.limits import probe_max_len

    async def probe() -> int:
        options = EmulatorOptions(profile=MODEL, port=0, speed=1000.0, max_model_len_tokens=3000)
        runner, url = await start_emulator(options)
        try:
            async with EngineClient(url, MODEL) as client:
                prompts = Prompts(random.Random(5))
                await calibrate(client, "completions", prompts)
                return await probe_max_len(client, "completions", prompts, 1 << 17)
        finally:
            await runner.cleanup()

    assert 0.93 * 3000 <= asyncio.run(probe()) <= 3000


class _Coalescing:
    """A client whose first ``num_coalesced`` streams arrive in one chunk (a server that
    fell behind), the rest token by token, 10 ms a step."""

    def __init__(self, num_coalesced: int) -> None:
        self.num_coalesced = num_coalesced
        self.num_calls = 0

    async def stream(self, prompt: str, num_tokens: int, api: str) -> StreamResult:
        self.num_calls += 1
        if self.num_calls <= self.num_coalesced:
            return StreamResult(0.05, 0.05, 1, 64, None, num_tokens)
        return StreamResult(0.05, 0.05 + 0.01 * (num_tokens - 1), num_tokens, 64, None, num_tokens)


def test_a_decode_batch_that_came_in_one_chunk_is_run_again() -> None:
    from longroute.profiling.measure import DECODE_TRIES, TargetError, _decode

    def run(client: _Coalescing) -> Any:
        prompts = Prompts(random.Random(0), nonce="n")
        return asyncio.run(_decode(client, "chat", prompts, 4, 64, 24, lambda _: None))  # type: ignore[arg-type]

    # the first batch of 4 came in one chunk each, the second streamed: timed from it
    client = _Coalescing(num_coalesced=4)
    sample = run(client)
    assert client.num_calls == 8 and sample.step_s == pytest.approx(0.01)
    # one coalesced stream of four is left out, the rest time the step
    client = _Coalescing(num_coalesced=1)
    assert run(client).step_s == pytest.approx(0.01) and client.num_calls == 4
    # a server that never streams token by token fails, saying so, after DECODE_TRIES runs
    client = _Coalescing(num_coalesced=10**6)
    with pytest.raises(TargetError, match=f"in each of {DECODE_TRIES} tries"):
        run(client)
    assert client.num_calls == 4 * DECODE_TRIES


class _BusyMoment:
    """A client whose decode steps take 10 ms, except the first ``num_busy`` streams',
    30 ms (another job on the host for a moment); it records each stream's prompt."""

    def __init__(self, num_busy: int) -> None:
        self.num_busy = num_busy
        self.prompt_tokens: list[int] = []

    async def stream(self, prompt: str, num_tokens: int, api: str) -> StreamResult:
        n = len(prompt.split())
        self.prompt_tokens.append(n)
        step = 0.03 if len(self.prompt_tokens) <= self.num_busy else 0.01
        return StreamResult(0.05, 0.05 + step * (num_tokens - 1), num_tokens, n, None, num_tokens)


def test_decode_points_are_repeated_interleaved_and_keep_their_fastest_run() -> None:
    from longroute.profiling.measure import Plan, measure

    points = ((1, 40), (2, 40), (1, 200))
    plan = Plan((), (), 1, (), points, decode_tokens=8, decode_repeats=3)
    client = _BusyMoment(num_busy=4)  # the whole first round and more, busy
    prompts = Prompts(random.Random(0), nonce="n")
    got = asyncio.run(measure(client, "chat", plan, prompts, random.Random(1), lambda _: None))  # type: ignore[arg-type]
    assert [(s.batch, s.step_s) for s in got.decode] == [
        (b, pytest.approx(0.01)) for b, _ in points
    ]
    assert len(client.prompt_tokens) == plan.num_requests == 3 * 4
    # every round holds every point once (4 streams a round), so drift hits them alike
    for r in range(3):
        one_round = sorted(client.prompt_tokens[4 * r : 4 * (r + 1)])
        assert len([n for n in one_round if n > 100]) == 1
    assert make_plan(2000, 10**6, quick=True).decode_repeats == 5


def _true_ttft_s(n: int) -> float:
    """A made-up engine's lone TTFT: fixed, per token and per causal pair."""
    return 0.010 + 3e-5 * n + 2.3e-8 * n * (n + 1) / 2


def _drifted_ttft_s(n: int) -> float:
    """The same engine once the host has drifted: the per-token cost 2.3x (as CI once
    saw between the fit and the held-out probes), then everything 1.4x slower."""
    return 1.4 * (0.010 + 2.3 * (_true_ttft_s(n) - 0.010))


class _DriftingEngine:
    """Lone prefills (a prompt's words are its tokens) at :func:`_true_ttft_s` for the
    first ``num_calm`` requests, at :func:`_drifted_ttft_s` after."""

    def __init__(self, num_calm: int) -> None:
        self.num_calm = num_calm
        self.num_calls = 0

    async def stream(self, prompt: str, num_tokens: int, api: str) -> StreamResult:
        self.num_calls += 1
        n = len(prompt.split())
        t = _true_ttft_s(n) if self.num_calls <= self.num_calm else _drifted_ttft_s(n)
        return StreamResult(t, t, 1, n, 0, num_tokens)


@pytest.mark.parametrize(
    ("wrong", "passes"),
    [
        (lambda fit, n: 0.0, True),  # the fit itself
        (lambda fit, n: 0.3 * _predict(fit, n), False),  # a predictor that misprices it
        (lambda fit, n: 0.006, False),  # an extra constant
        (lambda fit, n: -fit.s_per_pair * n * (n + 1) / 2, False),  # no pair term
    ],
)
def test_held_out_lengths_inside_the_profile_defeat_drift_yet_fail_a_wrong_fit(
    wrong: Any, passes: bool
) -> None:
    """tests/test_real_engine_profile.py's design against a fake engine whose host drifts
    halfway through the prefill phase: its held-out lengths are shuffled in with the
    grid's, so the right fit passes and wrong ones fail; held-out probes measured after
    the profile (the design before) would fail even the right fit."""
    from longroute.profiling.fit import fit_prefill
    from longroute.profiling.measure import measure
    from test_real_engine_profile import HELD_OUT_TOKENS, held_out_errors, within_bound

    plan = replace(
        make_plan(1780, 10**6, quick=True),
        holdout_tokens=HELD_OUT_TOKENS,
        cached_tokens=(),
        decode=(),
    )
    num_prefills = (len(plan.prefill_tokens) + len(plan.holdout_tokens)) * plan.repeats
    engine = _DriftingEngine(num_calm=num_prefills // 2)
    prompts = Prompts(random.Random(0), nonce="n")
    m = asyncio.run(measure(engine, "completions", plan, prompts, random.Random(2), lambda _: None))  # type: ignore[arg-type]
    assert engine.num_calls == num_prefills and len(m.holdout) == len(HELD_OUT_TOKENS)
    fit = fit_prefill(m.prefill, m.holdout)

    def predict(n: int) -> float:
        return _predict(fit, n) + float(wrong(fit, n))

    assert within_bound(held_out_errors(predict, m.holdout)) is passes
    after = [PrefillSample(n, 0, _drifted_ttft_s(n)) for n in HELD_OUT_TOKENS]
    assert not within_bound(held_out_errors(predict, after))


def _predict(fit: Any, n: int) -> float:
    return float(fit.fixed_s + fit.s_per_token * n + fit.s_per_pair * n * (n + 1) / 2)
