"""Failure accounting and what a client sees of backend errors (in-process, fake backends).

A backend is charged for a failure after the request reached it only when the
same request then succeeds elsewhere: a sick backend still opens its breaker,
a poison request opens none. Backend error bodies reach the client sanitised.
The :class:`Redactor` and the logging filter are tested here directly too.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from longroute.gateway import GatewaySecrets
from longroute.gateway.backend_errors import relayed_client_error
from longroute.gateway.redact import REDACTED, RedactingFilter, Redactor
from test_gateway import FakeBackend, Knobs, async_test, running_fleet

POISON = "POISON"
HEALTH = {"interval_s": 30.0, "timeout_s": 1.0, "failure_threshold": 2, "open_s": 60.0}


@dataclass
class PoisonedBackend(FakeBackend):
    """Answers 500 to any prompt containing POISON, else as FakeBackend does."""

    num_poisoned: int = 0

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if POISON in json.dumps(body):
            self.num_poisoned += 1
            return web.json_response({"error": {"message": "engine died on it"}}, status=500)
        return await super().completion(request)


def _breakers(fleet: Any) -> dict[str, str]:
    return {name: b.state.value for name, b in fleet.gateway.health.breakers.items()}


@async_test
async def test_poison_requests_open_no_breaker_and_cost_two_attempts_each() -> None:
    a, b, c = PoisonedBackend("a"), PoisonedBackend("b"), PoisonedBackend("c")
    async with running_fleet(a, b, c, health=HEALTH) as fleet:
        for _ in range(10):
            status, _, data = await fleet.chat(f"{POISON} please")
            error = json.loads(data)["error"]
            assert status == 502 and error["code"] == "backend_error"
            assert "engine died" not in error["message"]  # a backend's words never shown
        assert _breakers(fleet) == {"a": "closed", "b": "closed", "c": "closed"}
        assert a.num_poisoned + b.num_poisoned + c.num_poisoned == 20
        assert (await fleet.chat("fine"))[0] == 200
        assert await fleet.metric("longroute_errors_total", kind="request_failed") == 10


@async_test
async def test_a_sick_backend_still_opens_its_breaker() -> None:
    sick, well = FakeBackend("a", Knobs(status=500)), FakeBackend("b")
    async with running_fleet(sick, well, health=HEALTH) as fleet:
        statuses = [(await fleet.chat(f"q{i}"))[0] for i in range(4)]
        assert statuses == [200] * 4  # failed over, and each success charged "a"
        assert _breakers(fleet) == {"a": "open", "b": "closed"}


@async_test
async def test_backend_refusing_the_gateway_key_is_failed_over_and_never_relayed() -> None:
    refusing, well = FakeBackend("a", Knobs(status=401)), FakeBackend("b")
    async with running_fleet(refusing, well, health=HEALTH) as fleet:
        status, headers, _ = await fleet.chat("hi")
        assert status == 200 and headers["x-longroute-endpoint"] == "b"
    only = FakeBackend("a", Knobs(status=403))
    async with running_fleet(only, health=HEALTH) as fleet:
        status, headers, data = await fleet.chat("hi")
        assert status == 502
        assert "refused the gateway's credentials" in json.loads(data)["error"]["message"]
        assert "www-authenticate" not in {h.lower() for h in headers}


@async_test
async def test_a_4xx_keeps_its_status_and_message_only() -> None:
    bad = FakeBackend("a", Knobs(status=400))  # {"error": {"message": "a fails", ...}}
    async with running_fleet(bad) as fleet:
        status, headers, data = await fleet.chat("hi")
    assert status == 400 and headers["Content-Type"] == "application/json"
    error = json.loads(data)["error"]
    assert error["message"] == "a fails" and error["type"] == "server_error"


def test_relayed_client_error_sanitises_every_shape() -> None:
    redactor = Redactor(["sk-secret-0123456789abcdef"])
    shapes = {
        b'{"error": {"message": "ctx too long\\nFORGED", "code": "context_length_exceeded"}}': (
            "ctx too long\\nFORGED",
            "context_length_exceeded",
        ),
        b'{"detail": "key sk-secret-0123456789abcdef bad"}': (f"key {REDACTED} bad", None),
        b'{"error": {"message": "x", "code": "sk-secret-0123456789abcdef"}}': ("x", None),
        b'{"error": "plain"}': ("plain", None),
        b"<html>sk-secret-0123456789abcdef</html>": ("backend b answered HTTP 422", None),
        b"[" * 5000: ("backend b answered HTTP 422", None),
    }
    for data, (message, code) in shapes.items():
        error = json.loads(relayed_client_error(422, data, redactor, "b"))["error"]
        assert (error["message"], error["code"]) == (message, code), data[:60]


def test_redactor_removes_secrets_fragments_and_credentials_idempotently() -> None:
    secret = "sk-live-abcdefghijklmnopqrstuvwxyz"
    redactor = Redactor([secret, "short"])
    text = f"Bearer {secret}\r\n{secret[3:15]}...{secret[-4:]} api_key='zzz' short\x1b[31m"
    redacted = redactor.text(text)
    for i in range(len(secret) - 7):
        assert secret[i : i + 8] not in redacted
    assert "zzz" not in redacted and "short" not in redacted
    assert "\r" not in redacted and "\n" not in redacted and "\x1b" not in redacted
    assert redactor.text(redacted) == redacted
    assert redactor.body(f'{{"k": "{secret}"}}'.encode()) == b'{"k": "[redacted]"}'
    assert Redactor([]).text("Bearer abc") == "Bearer [redacted]"


def test_redacting_filter_rewrites_message_args_and_traceback() -> None:
    secret = "sk-live-abcdefghijklmnopqrstuvwxyz"
    try:
        raise ValueError(f"boom {secret}")
    except ValueError as exc:
        record = logging.LogRecord(
            "longroute.gateway", logging.ERROR, __file__, 1, "got %s\nFAKE", (secret,), None
        )
        record.exc_info = (type(exc), exc, exc.__traceback__)
    assert RedactingFilter(Redactor([secret])).filter(record)
    formatted = logging.Formatter("%(message)s").format(record)
    assert secret[:8] not in formatted and "\nFAKE" not in formatted.splitlines()[0]
    assert formatted.splitlines()[0] == "got [redacted]\\nFAKE"
    assert "Traceback" in formatted


@async_test
async def test_client_keys_and_www_authenticate() -> None:
    secrets = GatewaySecrets({}, frozenset({"client-key-123456789"}))
    async with running_fleet(FakeBackend("a"), secrets=secrets) as fleet:
        status, headers, _ = await fleet.chat("hi")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        auth = {"Authorization": "Bearer client-key-123456789"}
        body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}]})
        status, _, _ = await fleet.post("/v1/chat/completions", body.encode(), auth)
        assert status == 200
