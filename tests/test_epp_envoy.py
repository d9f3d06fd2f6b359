"""End to end with a real Envoy: openai client -> Envoy -> longroute epp -> three emulators.

Envoy 1.40.0 runs the config of ``examples/envoy-epp.yaml`` (ports chosen by the
kernel). The binary comes from ``longroute epp --install-envoy`` (``.ci/run``
runs it); without it these tests are skipped on a developer's machine and FAIL
when ``CI`` or ``LONGROUTE_REQUIRE_ENVOY=1`` is set, as in ``.ci/run``.

The stack is shared by the module; the tests that break it (a killed emulator,
then a killed picker) come last, in file order.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from longroute.epp.envoy_binary import EnvoyNotFoundError, find_envoy
from longroute.epp.stack import EppStack, start_epp_stack
from longroute.headers import ENDPOINT_HEADER
from longroute.launcher import Launcher

MODEL = "llama-3-8b"
MAX_BODY_BYTES = 256 * 1024
OVERRIDES = {
    # the health checks find a killed emulator within about a second
    "health": {"interval_s": 0.25, "timeout_s": 0.5, "failure_threshold": 1, "open_s": 30.0},
    "admission": {"max_body_bytes": MAX_BODY_BYTES},
}


def _envoy_binary() -> Path:
    try:
        return find_envoy()
    except EnvoyNotFoundError as exc:
        if os.environ.get("CI") or os.environ.get("LONGROUTE_REQUIRE_ENVOY") == "1":
            pytest.fail(f"Envoy is required here (CI or LONGROUTE_REQUIRE_ENVOY=1): {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EppStack]:
    binary = _envoy_binary()
    with (
        Launcher(tmp_path_factory.mktemp("epp"), ready_timeout_s=60.0) as launcher,
        start_epp_stack(launcher, binary, speed=20.0, overrides=OVERRIDES) as started,
    ):
        yield started


def _client(stack: EppStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _names(stack: EppStack) -> set[str]:
    return {r.name for r in stack.replicas}


def _chat(stack: EppStack, content: str, **options: object) -> tuple[int, str, str]:
    """Status, serving endpoint and text of one non-streamed chat request through Envoy."""
    raw = _client(stack).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8, **options
    )
    completion = raw.parse()
    return (
        raw.status_code,
        raw.headers.get(ENDPOINT_HEADER, ""),
        completion.choices[0].message.content or "",
    )


def _post(url: str, data: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_non_streamed_through_envoy(stack: EppStack) -> None:
    status, endpoint, text = _chat(stack, "Say something about routing.")
    assert status == 200 and endpoint in _names(stack) and text


def test_streamed_through_envoy(stack: EppStack) -> None:
    with _client(stack).chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream something."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers.get(ENDPOINT_HEADER) in _names(stack)
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None


def _envoy_counters(stack: EppStack) -> dict[str, int]:
    """Envoy's ext_proc counters (messages each way, streams) from its admin API."""
    with urllib.request.urlopen(stack.envoy.admin_url + "/stats?filter=ext_proc", timeout=5) as r:
        lines = r.read().decode().splitlines()
    pairs = (line.rsplit(": ", 1) for line in lines if ": " in line)
    return {name.rsplit(".", 1)[1]: int(value) for name, value in pairs if value.isdigit()}


def _picker_metric(stack: EppStack, prefix: str) -> float:
    with urllib.request.urlopen(stack.epp.base_url + "/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def _settled(read: Callable[[], float], expected: float) -> float:
    """``read()`` once it reaches ``expected`` (the stream's end comes just after the client
    has the answer), or its value after 10 s."""
    deadline = time.monotonic() + 10
    while (value := read()) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_messages_per_request_and_the_accounting_at_the_streams_end(stack: EppStack) -> None:
    ok = 'longroute_requests_total{code="200"'
    for stream, max_messages in ((False, 3), (True, 16)):
        before, answered = _envoy_counters(stack), _picker_metric(stack, ok)
        _chat(stack, "Count my messages.") if not stream else list(
            _client(stack).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
            )
        )
        closed = before["streams_closed"] + 1
        assert _settled(lambda: _envoy_counters(stack)["streams_closed"], closed) == closed
        # finished when Envoy ended the stream, as answered
        assert _settled(lambda: _picker_metric(stack, ok), answered + 1) == answered + 1
        # Envoy's two message counters may be read between its last message and the reply
        # (CI saw 6 sent, 5 received once): read them until they agree, or for 10 s
        deadline = time.monotonic() + 10
        while True:
            after = _envoy_counters(stack)
            sent = after["stream_msgs_sent"] - before["stream_msgs_sent"]
            received = after["stream_msgs_received"] - before["stream_msgs_received"]
            if sent == received or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        # headers, the whole body, the response headers; a streamed answer's chunks too
        assert sent == received and (sent == 3 if not stream else 3 < sent <= max_messages)


def test_a_body_the_picker_rewrites_reaches_the_engine(stack: EppStack) -> None:
    # the client's priority field is dropped: the answer to the BUFFERED body replaces it,
    # with its content-length (Envoy refuses a mismatch)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    status, raw = _post(
        stack.url + "/v1/chat/completions", json.dumps({**body, "priority": 3}).encode()
    )
    assert status == 200, raw[:300]
    assert json.loads(raw)["choices"][0]["message"]["content"]


def test_completions_route_through_envoy(stack: EppStack) -> None:
    completion = _client(stack).completions.create(model=MODEL, prompt="Once upon", max_tokens=4)
    assert completion.choices[0].text


def test_prefix_cache_keeps_a_conversation_on_one_emulator(stack: EppStack) -> None:
    history = f"conversation {uuid.uuid4()}: " + "You are a helpful assistant. " * 60
    served = set()
    for turn in range(4):
        history += f" Question {turn}?"
        status, endpoint, answer = _chat(stack, history, stream=False)
        assert status == 200
        served.add(endpoint)
        history += f" {answer}"
    assert len(served) == 1, served


def test_invalid_requests_are_refused_by_the_picker(stack: EppStack) -> None:
    url = stack.url + "/v1/chat/completions"
    assert _post(url, b"{not json")[0] == 400
    assert _post(url, b"[]")[0] == 400
    big = b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "'
    status, _ = _post(url, big + b"x" * (MAX_BODY_BYTES + 10) + b'"}]}')
    assert status == 413
    with pytest.raises(openai.NotFoundError):
        _client(stack).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    # over gRPC's default 4 MiB message: still the picker's own 413, not a broken stream's 503
    status, answer = _post(url, big + b"x" * (5 << 20) + b'"}]}')
    assert status == 413 and b"request_too_large" in answer
    # over Envoy's 8 MiB buffer: Envoy's own 413 passes the picker (not a 503)
    assert _post(url, big + b"x" * (9 << 20) + b'"}]}')[0] == 413
    # the picker still routes afterwards
    assert _chat(stack, "still there?")[0] == 200


def test_models_answered_by_the_picker(stack: EppStack) -> None:
    models = _client(stack).models.list()
    assert [m.id for m in models.data] == [MODEL, "auto"]


def _ready_backends(stack: EppStack) -> list[str]:
    import json

    try:
        with urllib.request.urlopen(stack.epp.base_url + "/ready", timeout=5) as response:
            return list(json.loads(response.read())["healthy"])
    except urllib.error.HTTPError as exc:
        return list(json.loads(exc.read())["healthy"])


def test_a_killed_emulator_is_skipped_after_health_checks(stack: EppStack) -> None:
    launcher = stack.launcher
    victim_replica, victim = stack.replicas[0], stack.emulators[0]
    launcher.kill(victim)
    deadline_s = time.monotonic() + 20.0
    while victim_replica.name in _ready_backends(stack):
        assert time.monotonic() < deadline_s, "the picker never saw the emulator die"
        time.sleep(0.1)
    served = [_chat(stack, f"after the kill {uuid.uuid4()} {i}") for i in range(8)]
    assert all(status == 200 for status, _, _ in served)
    assert victim_replica.name not in {endpoint for _, endpoint, _ in served}


def test_picker_unavailable_envoy_answers_503(stack: EppStack) -> None:
    launcher = stack.launcher
    launcher.kill(stack.epp)
    stack.epp.popen.wait(timeout=10)
    status, body = _post(stack.url + "/v1/chat/completions", b'{"model": "llama-3-8b"}')
    assert status == 503, body  # failure_mode_allow: false, status_on_error: 503
    # nothing reached an engine unrouted
