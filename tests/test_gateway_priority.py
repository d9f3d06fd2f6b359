"""The gateway sends vLLM's ``priority`` to backends declared ``scheduling_policy: priority``.

Fake backends on loopback record the bodies they receive: only the declared backend
gets the field, an integer computed from the request's slack (its
``x-longroute-ttft-slo-ms`` deadline and prompt); a client's own ``priority`` never
passes through.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from longroute.config import ConfigError
from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.config import parse_gateway_config
from longroute.gateway.parse import parse_body
from longroute.gateway.priority import with_priority, without_client_priority
from longroute.headers import TTFT_SLO_HEADER
from test_gateway import FakeBackend, Fleet, async_test

PRIO_MODEL = "prio-llama"
PLAIN_MODEL = "plain-llama"
SECONDS_PER_TOKEN = 1e-3  # 1 ms per prompt token: prompt length moves slack visibly


@asynccontextmanager
async def priority_fleet(policy: str = "edf", **overrides: Any) -> AsyncIterator[
    tuple[Fleet, FakeBackend, FakeBackend]
]:  # fmt: skip
    """Backend ``prio`` (priority scheduling) and ``plain`` (FCFS), one model each."""
    prio, plain = FakeBackend("prio", model=PRIO_MODEL), FakeBackend("plain", model=PLAIN_MODEL)
    async with AsyncExitStack() as stack:
        urls = {}
        for backend in (prio, plain):
            server = TestServer(backend.app(), host="127.0.0.1")
            await server.start_server()
            stack.push_async_callback(server.close)
            urls[backend.name] = str(server.make_url("")).rstrip("/")
        data: dict[str, Any] = {
            "backends": [
                {"name": "prio", "url": urls["prio"], "model": PRIO_MODEL,
                 "scheduling_policy": "priority",
                 "prefill_seconds_per_token": SECONDS_PER_TOKEN},
                {"name": "plain", "url": urls["plain"], "model": PLAIN_MODEL},
            ],
            "backend_priority": {"policy": policy},
            "model_aliases": {"fast": PRIO_MODEL},
            "health": {"interval_s": 30.0, "timeout_s": 1.0},
            "rtt_probe_interval_s": None,
            "scrape_interval_s": None,
            **overrides,
        }  # fmt: skip
        running = await stack.enter_async_context(
            serve_gateway(
                parse_gateway_config(data, "test"),
                GatewaySecrets({}, None),
                host="127.0.0.1",
                port=0,
            )
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Fleet(running.url, running.gateway, http), prio, plain


async def send(
    fleet: Fleet, model: str, content: str = "hi", slo_ms: str | None = None, **extra: Any
) -> tuple[int, bytes]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    headers = {} if slo_ms is None else {TTFT_SLO_HEADER: slo_ms}
    status, _, data = await fleet.post("/v1/chat/completions", json.dumps(body).encode(), headers)
    return status, data


@async_test
async def test_only_the_declared_backend_gets_an_integer_priority() -> None:
    async with priority_fleet() as (fleet, prio, plain):
        for model in (PRIO_MODEL, PLAIN_MODEL, PRIO_MODEL, PLAIN_MODEL):
            status, _ = await send(fleet, model, stream=True)
            assert status == 200
        assert len(prio.bodies) == len(plain.bodies) == 2
        for body in prio.bodies:
            assert type(body["priority"]) is int
            assert body["model"] == PRIO_MODEL and body["stream"] is True  # the rest intact
        assert all("priority" not in body for body in plain.bodies)


@async_test
async def test_edf_priority_is_the_deadline_in_milliseconds() -> None:
    async with priority_fleet("edf") as (fleet, prio, _):
        clock = fleet.gateway.clock
        sent = []
        for slo_ms in ("5000", "200", "1500.5", None):  # None: the default deadline
            before_s = clock.now_s()
            assert (await send(fleet, PRIO_MODEL, slo_ms=slo_ms))[0] == 200
            sent.append((before_s, clock.now_s()))
        priorities = [body["priority"] for body in prio.bodies]
        for (before_s, after_s), slo_s, got in zip(
            sent, (5.0, 0.2, 1.5005, 1.0), priorities, strict=True
        ):  # arrival (on the gateway's clock) + deadline, in integer milliseconds
            assert round((before_s + slo_s) * 1000) <= got <= round((after_s + slo_s) * 1000)
        order = sorted(range(4), key=lambda i: priorities[i])
        assert order == [1, 3, 2, 0]  # by deadline, not by arrival


@async_test
async def test_lrs_and_lars_priorities_follow_the_prompts_slack() -> None:
    for policy in ("lrs", "lars"):
        async with priority_fleet(policy) as (fleet, prio, _):
            # the same 10 s deadline; prompts of ~25, ~2,500 and ~5,000 tokens (4 chars each)
            for num_words in (5, 2_000, 4_000):
                status, _ = await send(fleet, PRIO_MODEL, "word " * num_words, slo_ms="10000")
                assert status == 200
            priorities = [body["priority"] for body in prio.bodies]
            # more work, less slack: the longest prompt is served first
            assert priorities[2] < priorities[1] < priorities[0], (policy, priorities)
            if policy == "lrs":  # D - w in ms: arrival + 10 s - 1 ms per prompt token
                assert 9_900 < priorities[0] < 11_000
                assert 4_500 < priorities[0] - priorities[2] < 5_500
            else:  # rho in thousandths: (10 s - 5 s) / 5 s for the longest
                assert 900 < priorities[2] < 1_100


@async_test
async def test_a_clients_priority_never_reaches_a_backend() -> None:
    async with priority_fleet() as (fleet, prio, plain):
        for model in (PRIO_MODEL, PLAIN_MODEL, "fast"):  # "fast": an alias, re-serialised
            status, _ = await send(fleet, model, priority=-(2**63), slo_ms="60000")
            assert status == 200
        assert all("priority" not in body for body in plain.bodies)
        assert [body["model"] for body in prio.bodies] == [PRIO_MODEL, PRIO_MODEL]
        assert all(body["priority"] > 50_000 for body in prio.bodies)  # the gateway's: ~60 s
        for hostile in ("high", 1e308, None, [1]):  # whatever its type
            assert (await send(fleet, PLAIN_MODEL, priority=hostile))[0] == 200
        assert all("priority" not in body for body in plain.bodies)


@async_test
async def test_a_bad_slo_header_is_a_400_naming_it() -> None:
    async with priority_fleet() as (fleet, prio, _):
        for value in ("0", "-5", "soon", "nan", "inf", "1e12", "1" * 40):
            status, data = await send(fleet, PRIO_MODEL, slo_ms=value)
            assert status == 400, value
            assert TTFT_SLO_HEADER in json.loads(data)["error"]["message"]
        assert prio.bodies == []


def test_the_priority_is_spliced_into_any_json_object() -> None:
    assert json.loads(with_priority(b'{"a": 1}', -7)) == {"a": 1, "priority": -7}
    assert json.loads(with_priority(b'  {"a": {"b": {}}} \n', 3)) == {"a": {"b": {}}, "priority": 3}
    assert json.loads(with_priority(b"{ }", 0)) == {"priority": 0}
    raw = b'{"model": "m", "prior\\u0069ty": 5, "messages": [{"role": "user", "content": "}"}]}'
    stripped, parsed = without_client_priority(raw, parse_body(raw, "/v1/chat/completions"))
    assert "priority" not in json.loads(stripped) and "priority" not in parsed.body
    assert json.loads(with_priority(stripped, 9))["priority"] == 9


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"backend_priority": {"policy": "lrz"}},
         "backend_priority.policy: Value error, unknown priority policy 'lrz' "
         "(did you mean 'lrs'?); valid: edf, lrs, lars"),
        ({"backend_priority": {"policy": "lars"}},
         "backends.0.prefill_seconds_per_token is required"),
        ({"backend_priority": {"params": {"default_ttft_s": 0}}},
         "default_ttft_s must be a positive number"),
        ({"scheduling_policy": "prio"}, "backends.0.scheduling_policy: Input should be"),
        ({"prefill_seconds_per_token": -1.0}, "backends.0.prefill_seconds_per_token"),
    ],
)  # fmt: skip
def test_bad_priority_config_is_refused_naming_the_field(
    extra: dict[str, Any], message: str
) -> None:
    backend = {"name": "a", "url": "http://127.0.0.1:9", "model": "m",
               "scheduling_policy": "priority"}  # fmt: skip
    top = {k: v for k, v in extra.items() if k == "backend_priority"}
    backend.update({k: v for k, v in extra.items() if k != "backend_priority"})
    with pytest.raises(ConfigError) as info:
        parse_gateway_config({"backends": [backend], **top}, "fleet.yaml")
    assert message in " ".join(str(info.value).split())
