"""The gateway's intake fills the LAAR features: prompt language and task."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from longroute.clock import SimClock
from longroute.config import ConfigError
from longroute.gateway.config import parse_gateway_config
from longroute.gateway.intake import REQUEST_HEADERS, RequestBuilder
from longroute.gateway.parse import ROUTE_CHAT, ROUTE_COMPLETIONS, parse_body
from longroute.headers import (
    PROGRAM_ID_HEADER,
    SESSION_HEADER,
    STAGE_HEADER,
    TASK_HEADER,
    TRIED_HEADER,
    TTFT_SLO_HEADER,
    WORKFLOW_HEADER,
)
from longroute.types import SLO, Language, Request
from longroute.workloads.kv_prompts import KV_LANGUAGES, KV_TASK, build_kv_prompt
from test_gateway import MODEL, FakeBackend, async_test, running_fleet
from test_gateway_ops import RecordingRouter


def builder(**config: Any) -> RequestBuilder:
    data = {"backends": [{"name": "a", "url": "http://10.0.0.1:8000", "model": "m"}], **config}
    return RequestBuilder(parse_gateway_config(data, "fleet.yaml"), SimClock(), is_hashing=False)


def chat(content: str) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


def build(
    raw: bytes, headers: dict[str, str] | None = None, route: str = ROUTE_CHAT, **config: Any
) -> Request:
    return builder(**config).build(parse_body(raw, route), "m", headers or {})


@pytest.mark.parametrize(
    ("content", "language"),
    [
        ("Summarise the following report in three sentences, please.", Language.LATIN),
        ("次の文章を三つの文で要約してください。", Language.JAPANESE),
        ("请用三句话总结以下报告。", Language.CJK),
        ("다음 보고서를 세 문장으로 요약해 주세요.", Language.KOREAN),
        ("短い文", Language.JAPANESE),  # the template's role name does not outvote it
    ],
)
def test_language_of_chat_prompts(content: str, language: Language | None) -> None:
    assert build(chat(content)).language is language


def test_prompts_without_letters_have_no_language() -> None:
    raw = json.dumps({"model": "m", "prompt": "12345 67890 {}"}).encode()
    assert build(raw, route=ROUTE_COMPLETIONS).language is None


def test_language_is_detected_only_for_routers_that_read_it() -> None:
    from longroute.gateway import Gateway, GatewaySecrets
    from longroute.routing import ROUTERS
    from longroute.routing.laar import LaarRouter

    config = {"backends": [{"name": "a", "url": "http://10.0.0.1:8000", "model": "m"}]}
    quiet = RequestBuilder(
        parse_gateway_config(config, "fleet.yaml"),
        SimClock(),
        is_hashing=False,
        is_detecting_language=False,
    )
    raw = chat("次の文章を三つの文で要約してください。")
    assert quiet.build(parse_body(raw, ROUTE_CHAT), "m", {}).language is None
    assert LaarRouter.needs_language
    assert not ROUTERS.build("round-robin", {}).needs_language
    gateway_config = parse_gateway_config({**config, "router": {"name": "round-robin"}}, "f.yaml")
    gateway = Gateway(gateway_config, GatewaySecrets({}, None))
    assert not gateway.wiring.requests.is_detecting_language


@pytest.mark.parametrize("language", KV_LANGUAGES)
def test_language_of_long_kv_prompts_from_their_question(language: Language) -> None:
    text = build_kv_prompt(0, 65536, language).text
    assert build(chat(text)).language is language
    completion = json.dumps({"model": "m", "prompt": text}).encode()
    assert build(completion, route=ROUTE_COMPLETIONS).language is language


def test_token_id_prompts_have_no_language() -> None:
    raw = json.dumps({"model": "m", "prompt": [1, 2, 3, 4]}).encode()
    request = build(raw, route=ROUTE_COMPLETIONS)
    assert request.language is None and request.num_prompt_tokens == 4


def test_task_from_the_header_or_the_default() -> None:
    raw = chat("hello there")
    assert build(raw).task is None
    assert build(raw, {TASK_HEADER: KV_TASK}).task == KV_TASK
    assert build(raw, {TASK_HEADER: " summarise "}).task == "summarise"
    assert build(raw, default_task=KV_TASK).task == KV_TASK
    assert build(raw, {TASK_HEADER: "qa"}, default_task=KV_TASK).task == "qa"
    assert build(raw, {TASK_HEADER: "  "}, default_task=KV_TASK).task == KV_TASK


HEADER_FIELDS = [
    (TRIED_HEADER, "x, y", {"tried_models": ("x", "y"), "attempt": 3}),
    (TASK_HEADER, "qa", {"task": "qa"}),
    (SESSION_HEADER, "s1", {"session_id": "s1"}),
    (TTFT_SLO_HEADER, "250", {"slo": SLO(ttft_s=0.25)}),
    (PROGRAM_ID_HEADER, "p1", {"program_id": "p1"}),
    (STAGE_HEADER, "2", {"stage": 2}),
    (WORKFLOW_HEADER, "apps/w", {"workflow": "apps/w"}),
]


def test_request_headers_lists_every_header_the_builder_reads() -> None:
    assert {header for header, _, _ in HEADER_FIELDS} == REQUEST_HEADERS


@pytest.mark.parametrize(("header", "value", "fields"), HEADER_FIELDS)
def test_each_request_header_is_read_alone_and_in_any_case(
    header: str, value: str, fields: dict[str, object]
) -> None:
    """A request with none of REQUEST_HEADERS skips reading them: each one alone (with
    other headers beside it, its name in another case) still sets its field."""
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "u"})
    plain = build(raw.encode(), {"Content-Type": "application/json"}, default_task="t")
    assert (plain.task, plain.session_id, plain.tried_models, plain.slo) == ("t", "u", (), None)
    assert (plain.program_id, plain.stage, plain.workflow, plain.attempt) == (None, None, None, 1)
    given = {"Content-Type": "application/json", header.upper(): value}
    request = build(raw.encode(), given, default_task="t")
    assert {name: getattr(request, name) for name in fields} == fields
    changed = {name for name in Request.__dataclass_fields__ if name not in ("request_id",)}
    differs = {n for n in changed if getattr(request, n) != getattr(plain, n)} - {"arrival_s"}
    assert differs == set(fields)


def test_default_task_must_not_be_empty() -> None:
    data = {"backends": [{"name": "a", "url": "http://a:1", "model": "m"}], "default_task": ""}
    with pytest.raises(ConfigError, match="default_task"):
        parse_gateway_config(data, "fleet.yaml")
    assert parse_gateway_config({**data, "default_task": None}, "f").default_task is None


def test_language_detection_cost_does_not_grow_with_the_prompt() -> None:
    b = builder()
    short, long = (
        parse_body(chat("hello " * 100), ROUTE_CHAT),
        parse_body(chat(build_kv_prompt(0, 131072, Language.JAPANESE).text), ROUTE_CHAT),
    )

    def per_request_s(parsed: Any) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                b.build(parsed, "m", {})
            best = min(best, (time.perf_counter() - start) / 20)
        return best

    # detection samples the end of the prompt: a 131K-token prompt costs what a short one does
    assert per_request_s(long) < 0.001
    assert per_request_s(short) < 0.0002


@async_test
async def test_routers_see_language_and_task_through_the_gateway() -> None:
    a = FakeBackend("a")
    async with running_fleet(a, default_task="summarise") as fleet:
        recorder = RecordingRouter(fleet.gateway.admission.router)
        fleet.gateway.admission.router = recorder
        fleet.gateway.wiring.requests.is_detecting_language = recorder.needs_language
        prompt = build_kv_prompt(1, 4096, Language.CJK)
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt.text}]}
        raw = json.dumps(body).encode()
        status, _, _ = await fleet.post("/v1/chat/completions", raw, {TASK_HEADER: KV_TASK})
        await fleet.chat("Please summarise this.")
    assert status == 200
    kv, plain = recorder.requests
    assert (kv.language, kv.task) == (Language.CJK, KV_TASK)
    assert (plain.language, plain.task) == (Language.LATIN, "summarise")
