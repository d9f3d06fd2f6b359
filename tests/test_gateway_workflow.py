"""Agent workflows in the gateway, unit by unit: the workflow headers, the prompt text,
the admission queue ordered by a router's priority (with aging), the priority sent to
priority-scheduling backends, and the start-up checks of chimera's configuration."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from chimera_fakes import FixedConfidence, FixedLength
from chimera_files import MODEL_A, MODEL_B, PredictorFiles, fit_files
from longroute.clock import SimClock
from longroute.errors import ConfigError
from longroute.gateway import Gateway, GatewaySecrets
from longroute.gateway.admission import Admission, Grant
from longroute.gateway.config import GatewayConfig, parse_gateway_config
from longroute.gateway.errors import GatewayError
from longroute.gateway.intake import RequestBuilder
from longroute.gateway.parse import ROUTE_CHAT, ROUTE_COMPLETIONS, parse_body
from longroute.gateway.priority import BackendPriorities
from longroute.gateway.workflow import MAX_ID_CHARS, prompt_text, workflow_fields
from longroute.headers import PROGRAM_ID_HEADER, STAGE_HEADER, WORKFLOW_HEADER
from longroute.queueing.dispatch_priority import MAX_PRIORITY
from longroute.routing import ROUTERS
from longroute.routing.chimera import ChimeraRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import MAX_PROMPT_TEXT_CHARS, Endpoint, PromptText, Request

LONGROUTE = Path(sys.executable).with_name("longroute")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> PredictorFiles:
    return fit_files(tmp_path_factory.mktemp("predictors"))


# ---- headers ------------------------------------------------------------------------------


def test_workflow_headers_fill_the_fields() -> None:
    fields = workflow_fields(
        {PROGRAM_ID_HEADER: " run-42 ", STAGE_HEADER: "3", WORKFLOW_HEADER: "apps/planner-coder"}
    )
    assert (fields.program_id, fields.stage, fields.workflow) == ("run-42", 3, "apps/planner-coder")
    none = workflow_fields({STAGE_HEADER: "  ", PROGRAM_ID_HEADER: ""})
    assert (none.program_id, none.stage, none.workflow) == (None, None, None)
    assert workflow_fields({STAGE_HEADER: "64"}).stage == 64
    assert workflow_fields({PROGRAM_ID_HEADER: "x" * MAX_ID_CHARS}).program_id == "x" * 128


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (PROGRAM_ID_HEADER, "x" * (MAX_ID_CHARS + 1)),  # too long
        (WORKFLOW_HEADER, "w" * 10_000),
        (PROGRAM_ID_HEADER, "run\x00one"),  # control bytes
        (PROGRAM_ID_HEADER, "run\x1b[31mred"),
        (WORKFLOW_HEADER, "tab\there"),
        (PROGRAM_ID_HEADER, "del\x7f"),
        (PROGRAM_ID_HEADER, "caf\xe9"),  # a latin-1 byte >= 0x80
        (STAGE_HEADER, "0"),
        (STAGE_HEADER, "65"),
        (STAGE_HEADER, "-1"),
        (STAGE_HEADER, "+3"),
        (STAGE_HEADER, "1.5"),
        (STAGE_HEADER, "two"),
        (STAGE_HEADER, "\u0663"),  # an Arabic-Indic three: a decimal, not ASCII
        (STAGE_HEADER, "9" * 5000),
        (STAGE_HEADER, "0x10"),
    ],
)  # fmt: skip
def test_a_bad_workflow_header_is_a_400_naming_it(header: str, value: str) -> None:
    with pytest.raises(GatewayError) as info:
        workflow_fields({header: value})
    err = info.value
    assert err.status == 400
    assert header in err.message
    assert len(err.message) < 200 and "\x00" not in err.message and "\x1b" not in err.message


# ---- prompt text --------------------------------------------------------------------------


def _chat(messages: list[dict[str, Any]]) -> Any:
    return parse_body(json.dumps({"model": "m", "messages": messages}).encode(), ROUTE_CHAT)


def test_prompt_text_splits_system_from_the_rest() -> None:
    parsed = _chat(
        [
            {"role": "system", "content": "You plan."},
            {"role": "user", "content": [{"type": "text", "text": "Solve it."}]},
            {"role": "assistant", "content": "Plan: 1, 2."},
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": None},
        ]
    )
    assert prompt_text(parsed, ROUTE_CHAT) == PromptText(
        "You plan.\nBe brief.", "Solve it.\nPlan: 1, 2."
    )
    raw = json.dumps({"model": "m", "prompt": "Once upon"}).encode()
    assert prompt_text(parse_body(raw, ROUTE_COMPLETIONS), ROUTE_COMPLETIONS) == PromptText(
        "", "Once upon"
    )
    ids = json.dumps({"model": "m", "prompt": [1, 2, 3]}).encode()
    assert prompt_text(parse_body(ids, ROUTE_COMPLETIONS), ROUTE_COMPLETIONS) is None


def test_prompt_text_is_bounded_however_large_the_body() -> None:
    many = [{"role": "user", "content": "word " * 5_000} for _ in range(200)]  # ~5 MB
    text = prompt_text(_chat([{"role": "system", "content": "s" * 100_000}, *many]), ROUTE_CHAT)
    assert text is not None
    assert len(text.system) == len(text.user) == MAX_PROMPT_TEXT_CHARS


def _builder(is_reading_text: bool) -> RequestBuilder:
    config = parse_gateway_config(
        {"backends": [{"name": "a", "url": "http://h", "model": "m"}]}, "t"
    )
    return RequestBuilder(config, SimClock(), is_hashing=False, is_reading_text=is_reading_text)


def test_the_request_carries_workflow_and_text_only_for_routers_that_read_it() -> None:
    parsed = _chat([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    headers = {PROGRAM_ID_HEADER: "p1", STAGE_HEADER: "2", WORKFLOW_HEADER: "w"}
    reading = _builder(True).build(parsed, "m", headers, ROUTE_CHAT)
    assert (reading.program_id, reading.stage, reading.workflow) == ("p1", 2, "w")
    assert reading.prompt == PromptText("S", "U")
    plain = _builder(False).build(parsed, "m", headers, ROUTE_CHAT)
    assert plain.program_id == "p1" and plain.prompt is None  # mlfq reads the id; no text cost
    assert getattr(ROUTERS.get("chimera"), "workflow_predictors", ())
    assert getattr(ROUTERS.get("ltr"), "workflow_predictors", ())
    assert not getattr(ROUTERS.get("mlfq"), "workflow_predictors", ())


# ---- admission: shortest (total) job first, with aging --------------------------------------

LONG_TOKENS = 5_000.0
SHORT_TOKENS = 10.0


def _chimera() -> ChimeraRouter:
    def length(request: Request, model: str) -> float:
        return LONG_TOKENS if request.workflow == "long" else SHORT_TOKENS

    return ChimeraRouter(
        confidence=FixedConfidence({"m1": 0.5}),
        length=FixedLength(("m1",), length),
        seconds_per_token_by_model={"m1": 0.01},
    )


def _admission(
    policy: str, **params: Any
) -> tuple[Admission, ChimeraRouter, SimClock]:  # fmt: skip
    router = _chimera()
    clock = SimClock()
    admission = Admission(
        FleetView([Endpoint("a", "m1", "h", "r")]),
        router,
        {"a": 1},
        max_queue=100,
        queue_policy=policy,
        queue_policy_params=params,
        clock=clock,
        observe_decision_s=lambda _: None,
    )
    return admission, router, clock


def _request(request_id: str, workflow: str, arrival_s: float) -> Request:
    return Request(
        request_id, arrival_s, num_prompt_tokens=10, num_output_tokens=5, model="m1",
        workflow=workflow, program_id=request_id,
    )  # fmt: skip


async def _serve_in_order(
    admission: Admission,
    clock: SimClock,
    first: Grant,
    waiting: list[asyncio.Task[Grant]],
    on_grant: Callable[[Grant], None] = lambda _: None,
) -> list[str]:
    """Free the slot again and again; the ids in the order they were granted."""
    order: list[str] = []
    grant = first
    while waiting:
        clock.advance_to(clock.now_s() + 1.0)
        admission.finish(grant.request, grant.endpoint, has_first_byte=True, is_ok=True)
        await asyncio.sleep(0)
        done = [t for t in waiting if t.done()]
        assert len(done) == 1
        grant = done[0].result()
        waiting.remove(done[0])
        order.append(grant.request.request_id)
        on_grant(grant)
    return order


@pytest.mark.parametrize("policy", ["priority", "stjf"])
def test_short_workflows_overtake_a_long_one_queued_first(policy: str) -> None:
    async def scenario() -> list[str]:
        admission, router, clock = _admission(policy)
        busy = await admission.acquire(_request("busy", "short", 0.0), (), 60.0)
        waiting = [asyncio.create_task(admission.acquire(_request("long", "long", 1.0), (), 60.0))]
        for i in range(3):
            request = _request(f"short-{i}", "short", 2.0 + i)
            waiting.append(asyncio.create_task(admission.acquire(request, (), 60.0)))
        await asyncio.sleep(0)
        assert admission.num_waiting == 4

        def dispatched_with_y_hat(grant: Grant) -> None:
            expected = LONG_TOKENS if grant.request.request_id == "long" else SHORT_TOKENS
            assert grant.request.priority == grant.decision.priority == expected
            assert router.inflight.tokens("a") == expected  # chimera counts ŷ in flight

        return await _serve_in_order(admission, clock, busy, waiting, dispatched_with_y_hat)

    assert asyncio.run(scenario()) == ["short-0", "short-1", "short-2", "long"]


def test_fcfs_keeps_arrival_order() -> None:
    async def scenario() -> list[str]:
        admission, _, clock = _admission("fcfs")
        busy = await admission.acquire(_request("busy", "short", 0.0), (), 60.0)
        waiting = [asyncio.create_task(admission.acquire(_request("long", "long", 1.0), (), 60.0))]
        waiting += [
            asyncio.create_task(
                admission.acquire(_request(f"short-{i}", "short", 2.0 + i), (), 60.0)
            )
            for i in range(2)
        ]
        await asyncio.sleep(0)
        return await _serve_in_order(admission, clock, busy, waiting)

    assert asyncio.run(scenario()) == ["long", "short-0", "short-1"]


def _rounds_until_long_is_served(policy: str, num_shorts: int, **params: Any) -> int | None:
    """A long request queued behind a busy slot, then a stream of short ones that never
    ends (one new short per grant): the grants before the long one's, or None if it
    was never served within ``num_shorts`` grants."""

    async def scenario() -> int | None:
        admission, _, clock = _admission(policy, **params)
        grant = await admission.acquire(_request("busy", "short", 0.0), (), 600.0)
        long_task = asyncio.create_task(admission.acquire(_request("long", "long", 1.0), (), 600.0))
        shorts = [
            asyncio.create_task(admission.acquire(_request(f"s{i}", "short", 2.0 + i), (), 600.0))
            for i in range(2)
        ]
        await asyncio.sleep(0)
        for num_grants in range(num_shorts):
            clock.advance_to(clock.now_s() + 1.0)
            admission.finish(grant.request, grant.endpoint, has_first_byte=True, is_ok=True)
            await asyncio.sleep(0)
            if long_task.done():
                return num_grants
            (done,) = [t for t in shorts if t.done()]
            shorts.remove(done)
            grant = done.result()
            request = _request(f"s{num_grants + 2}", "short", clock.now_s())
            shorts.append(asyncio.create_task(admission.acquire(request, (), 600.0)))
            await asyncio.sleep(0)
        for task in (long_task, *shorts):
            task.cancel()
        await asyncio.gather(long_task, *shorts, return_exceptions=True)
        assert admission.num_waiting == 0
        return None

    return asyncio.run(scenario())


def test_stjf_serves_a_long_request_within_its_starvation_threshold() -> None:
    assert _rounds_until_long_is_served("priority", 60) is None  # starved by the stream
    for threshold in (1, 4, 16):
        rounds = _rounds_until_long_is_served("stjf", 60, starvation_threshold=threshold)
        # shorts keep precedence for S grants; then the promoted long one is served, behind
        # at most the shorts that waited as long as it did (promoted too, and shorter)
        assert rounds is not None and threshold <= rounds <= 2 * threshold, (threshold, rounds)


def test_a_timed_out_waiter_leaves_a_priority_queue_at_once() -> None:
    async def scenario() -> None:
        admission, _, _ = _admission("stjf")
        await admission.acquire(_request("busy", "short", 0.0), (), 60.0)
        with pytest.raises(Exception, match="within"):
            await admission.acquire(_request("long", "long", 1.0), (), 0.01)
        (queue,) = admission._queues.values()
        assert len(queue.policy) == 0 and admission.num_waiting == 0

    asyncio.run(scenario())


# ---- the priority sent to backends that schedule by it ------------------------------------


def _priorities(**backend_priority: Any) -> BackendPriorities:
    config = parse_gateway_config(
        {
            "backends": [
                {
                    "name": "prio",
                    "url": "http://h:1",
                    "model": "m",
                    "scheduling_policy": "priority",
                },
                {"name": "plain", "url": "http://h:2", "model": "m"},
            ],
            "backend_priority": backend_priority,
        },
        "fleet.yaml",
    )
    return BackendPriorities(config, SimClock())


def test_the_routers_priority_wins_over_the_slack_policy() -> None:
    priorities = _priorities()
    plain = Request("r", 0.0, num_prompt_tokens=10, num_output_tokens=5)
    assert priorities.priority(plain, "prio") == 1000  # edf: arrival 0 + default 1 s, in ms
    for y_hat, sent in ((1234.4, 1234), (1234.6, 1235), (0.2, 0), (1e300, MAX_PRIORITY),
                        (-1e300, -MAX_PRIORITY), (float("inf"), MAX_PRIORITY),
                        (float("nan"), MAX_PRIORITY)):  # fmt: skip
        request = Request("r", 0.0, num_prompt_tokens=10, num_output_tokens=5, priority=y_hat)
        assert priorities.priority(request, "prio") == sent, y_hat
        assert priorities.priority(request, "plain") is None  # never to an FCFS backend
    scaled = _priorities(router_priority_scale=1000)  # ltr's rank scores
    request = Request("r", 0.0, num_prompt_tokens=10, num_output_tokens=5, priority=-0.0123)
    assert scaled.priority(request, "prio") == -12
    assert json.loads(scaled.body(b'{"model": "m"}', request, "prio"))["priority"] == -12


# ---- configuration ------------------------------------------------------------------------


def _config(
    router: dict[str, Any], models: tuple[str, ...] = (MODEL_A, MODEL_B), **extra: Any
) -> GatewayConfig:
    backends = [
        {"name": f"b{i}", "url": f"http://127.0.0.1:{9 + i}", "model": m}
        for i, m in enumerate(models)
    ]
    data = {"backends": backends, "router": router, "rtt_probe_interval_s": None,
            "scrape_interval_s": None, **extra}  # fmt: skip
    return parse_gateway_config(data, "fleet.yaml")


def _chimera_params(files: PredictorFiles, **extra: Any) -> dict[str, Any]:
    rates = {MODEL_A: 0.01, MODEL_B: 0.01, "model-c": 0.01}
    return {"confidence": str(files.confidence), "length": str(files.length),
            "seconds_per_token_by_model": rates, **extra}  # fmt: skip


@pytest.mark.parametrize("name", ["oracle-stjf", "oracle-sjf"])
def test_simulator_only_routers_are_refused(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config({"name": name})
    message = str(info.value)
    assert "fleet.yaml" in message and "router.name" in message
    assert f"router {name!r} runs only in the simulator" in message and "chimera" in message


def test_a_chimera_gateway_builds_from_fitted_files(files: PredictorFiles) -> None:
    gateway = Gateway(
        _config({"name": "chimera", "params": _chimera_params(files)}), GatewaySecrets({}, None)
    )
    assert gateway.router.name == "chimera" and gateway.wiring.requests.is_reading_text


def test_predictor_file_problems_are_clear_startup_errors(
    files: PredictorFiles, tmp_path: Path
) -> None:
    def error(router: dict[str, Any], models: tuple[str, ...] = (MODEL_A, MODEL_B)) -> str:
        with pytest.raises(ValueError) as info:  # ConfigError and RegistryError are ValueErrors
            Gateway(_config(router, models), GatewaySecrets({}, None))
        return str(info.value)

    missing = tmp_path / "nowhere.joblib"
    assert str(missing) in error(
        {"name": "chimera", "params": _chimera_params(files, length=str(missing))}
    )
    swapped = _chimera_params(files, confidence=str(files.length))  # a length file as confidence
    message = error({"name": "chimera", "params": swapped})
    assert str(files.length) in message and "expected a longroute confidence model" in message
    garbage = tmp_path / "garbage.joblib"
    garbage.write_bytes(b"not a pickle")
    assert str(garbage) in error(
        {"name": "chimera", "params": _chimera_params(files, length=str(garbage))}
    )
    message = error({"name": "chimera", "params": _chimera_params(files)}, (MODEL_A, "model-c"))
    assert "model-c" in message and str(files.confidence) in message
    message = error({"name": "chimera", "params": _chimera_params(files, length=7)})
    assert "router.params.length must be the path" in message
    message = error(
        {"name": "chimera", "params": _chimera_params(files, seconds_per_token_by_model={})}
    )
    assert "seconds_per_token_by_model" in message  # no profile to price model-a's tokens
    assert "needs parameter(s) confidence" in error({"name": "chimera"})


def test_queue_policy_params_are_checked_at_load() -> None:
    config = _config({"name": "round-robin"}, admission={"queue_policy": "stjf",
                     "queue_policy_params": {"starvation_threshold": 8}})  # fmt: skip
    assert config.admission.queue_policy_params == {"starvation_threshold": 8}
    for params, message in (({"starvation_threshold": 0}, "starvation_threshold must be"),
                            ({"starvation": 8}, "has no parameter(s) starvation")):  # fmt: skip
        with pytest.raises(ConfigError, match="queue_policy_params") as info:
            _config(
                {"name": "round-robin"},
                admission={"queue_policy": "stjf", "queue_policy_params": params},
            )
        assert message in str(info.value)


def test_serve_prints_one_error_line_for_a_missing_model_file(tmp_path: Path) -> None:
    config = {
        "backends": [{"name": "a", "url": "http://127.0.0.1:9", "model": MODEL_A}],
        "router": {"name": "chimera", "params": {
            "confidence": str(tmp_path / "confidence.joblib"),
            "length": str(tmp_path / "length.joblib")}},
    }  # fmt: skip
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [str(LONGROUTE), "serve", "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert out.stderr.startswith("error:") and "confidence.joblib: no such file" in out.stderr
