"""End to end with real processes on loopback: emulators behind a gateway, and the demo.

Every process is started by :class:`longroute.launcher.Launcher` (``python -m
longroute emulate|serve``) and stopped by it. Readiness deadlines are generous
(a loaded machine starts Python slowly); every wait on the network has a
deadline, so a hang fails a test instead of blocking it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from longroute.demo.fleet import DEFAULT_REPLICAS, Fleet, FleetPlan, Replica, start_fleets
from longroute.launcher import Launcher, LaunchError, ProcessSpec, emulator_spec

READY_TIMEOUT_S = 60.0
MODEL = "llama-3-8b"
NAMES = {r.name for r in DEFAULT_REPLICAS}
MAX_BODY_BYTES = 64 * 1024
MESSAGES = [{"role": "user", "content": "Say something about routing."}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three emulators (three regions) behind a prefix-cache gateway, shared read-only."""
    overrides = {"admission": {"max_body_bytes": MAX_BODY_BYTES}}
    plan = FleetPlan("main", speed=20.0, gateway_overrides=overrides)
    with Launcher(tmp_path_factory.mktemp("main"), ready_timeout_s=READY_TIMEOUT_S) as launcher:
        (started,) = start_fleets(launcher, [plan])
        yield started


def _client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples called ``name`` in a /metrics page, parsed by prometheus_client."""
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def _metric_samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    return _samples(_get(url + "/metrics")[1], name)


def _get(url: str) -> tuple[int, str]:
    async def fetch() -> tuple[int, str]:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as resp:
            return resp.status, await resp.text()

    return asyncio.run(fetch())


# ---- the official client, streamed and not ----------------------------------------


def test_openai_client_non_streamed(fleet: Fleet) -> None:
    raw = _client(fleet).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=16
    )
    assert raw.headers["x-longroute-endpoint"] in NAMES
    assert raw.headers["x-longroute-model"] == MODEL
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 16

    text = _client(fleet).completions.create(model="auto", prompt="Once upon", max_tokens=8)
    assert text.choices[0].text


def test_openai_client_streamed(fleet: Fleet) -> None:
    raw = _client(fleet).chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, max_tokens=24, stream=True
    )
    assert raw.headers["x-longroute-endpoint"] in NAMES
    assert raw.headers["x-longroute-model"] == MODEL
    pieces = [c.choices[0].delta.content or "" for c in raw.parse() if c.choices]
    assert len(pieces) > 1  # chunk by chunk, not one blob
    assert "".join(pieces).strip()


# ---- malformed requests ----------------------------------------------------------------

_OK = {"model": MODEL, "messages": MESSAGES}
MALFORMED = {
    "bad JSON": (b'{"model": "llama-3-8b", "messages": [', 400),
    "not an object": (b"[1, 2]", 400),
    "missing model": (json.dumps({"messages": MESSAGES}).encode(), 400),
    "missing messages": (json.dumps({"model": MODEL}).encode(), 400),
    "messages wrong type": (json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400),
    "max_tokens wrong type": (json.dumps({**_OK, "max_tokens": "ten"}).encode(), 400),
    "stream wrong type": (json.dumps({**_OK, "stream": "yes"}).encode(), 400),
    "unknown model": (json.dumps({**_OK, "model": "no-such-model"}).encode(), 404),
    "oversize body": (json.dumps({**_OK, "user": "x" * MAX_BODY_BYTES}).encode(), 413),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_gets_4xx_json_error(fleet: Fleet, case: str) -> None:
    body, expected_status = MALFORMED[case]

    async def post() -> tuple[int, str, Any]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            url = fleet.url + "/v1/chat/completions"
            headers = {"Content-Type": "application/json"}
            async with http.post(url, data=body, headers=headers) as resp:
                return resp.status, resp.content_type, await resp.json()

    status, content_type, payload = asyncio.run(post())
    assert status == expected_status
    assert content_type == "application/json"
    error = payload["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]


# ---- metrics -----------------------------------------------------------------------------


def test_metrics_parse_and_count_requests(fleet: Fleet) -> None:
    def answered() -> float:
        return sum(v for _, v in _metric_samples(fleet.url, "longroute_requests_total"))

    before = answered()
    client = _client(fleet)
    for i in range(3):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, user=f"m{i}")
    assert answered() - before == 3
    inflight = _metric_samples(fleet.url, "longroute_backend_inflight_requests")
    assert {labels["endpoint"] for labels, _ in inflight} == NAMES
    assert _metric_samples(fleet.url, "longroute_ttft_seconds_count")


# ---- failover under load -----------------------------------------------------------------


async def _outcome(http: aiohttp.ClientSession, url: str, i: int) -> str:
    """Classify one request: "ok"; "http_error" or "stream_error" (clear failures); or a defect."""
    is_stream = i % 2 == 0
    body = {**_OK, "max_tokens": 16 + (i * 53) % 240, "stream": is_stream, "user": f"u{i}"}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            error = (await resp.json())["error"]
            return "http_error" if error["message"] and error["type"] else "unclear http error"
        if not is_stream:
            content = (await resp.json())["choices"][0]["message"]["content"]
            return "ok" if content else "empty answer"
        events = [line.strip() async for line in resp.content if line.strip()]
    data = [e.removeprefix(b"data: ") for e in events if e != b"data: [DONE]"]
    if any("error" in json.loads(d) for d in data):
        return "stream_error"
    return "ok" if events and events[-1] == b"data: [DONE]" else f"stream cut: {events[-1:]!r}"


async def _load_and_kill(fleet: Fleet, launcher: Launcher, victim: str) -> list[str]:
    timeout = aiohttp.ClientTimeout(total=45)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(i: int) -> str:
            await asyncio.sleep(0.01 * i)  # arrivals before, during and after the kill
            try:
                return await _outcome(http, fleet.url, i)
            except TimeoutError:
                return "hung"
            except Exception as exc:  # a broken connection or body is a defect too
                return f"defect {exc!r}"

        tasks = [asyncio.create_task(one(i)) for i in range(60)]
        while sum(t.done() and t.result() == "ok" for t in tasks) < 5:
            assert not all(t.done() for t in tasks), [t.result() for t in tasks]
            await asyncio.sleep(0.01)
        launcher.kill(fleet.emulator(victim), signal.SIGKILL)
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)


def test_failover_when_an_emulator_is_killed_under_load(tmp_path: Path) -> None:
    victim = "euw-a100"
    plan = FleetPlan(
        "failover",
        router="round-robin",
        speed=1.0,
        gateway_overrides={"health": {"interval_s": 0.5, "failure_threshold": 2, "open_s": 60}},
    )
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        (started,) = start_fleets(launcher, [plan])
        outcomes = asyncio.run(_load_and_kill(started, launcher, victim))
        assert len(outcomes) == 60  # none lost
        defects = [o for o in outcomes if o not in ("ok", "http_error", "stream_error")]
        assert defects == []
        assert outcomes.count("ok") >= 30
        retries = sum(v for _, v in _metric_samples(started.url, "longroute_retries_total"))
        assert retries + outcomes.count("stream_error") > 0  # the kill hit requests in flight
        errors = dict(
            (labels["kind"], value)
            for labels, value in _metric_samples(started.url, "longroute_errors_total")
        )
        assert errors.get("midstream", 0) == outcomes.count("stream_error")
        # afterwards: new requests succeed on the survivors, and the victim is marked down
        client = _client(started)
        for stream in (False, True, False, True):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=4, stream=stream
            )
            assert raw.headers["x-longroute-endpoint"] in NAMES - {victim}
            parsed = raw.parse()
            assert list(parsed) if stream else parsed.choices
        deadline_s = time.monotonic() + 15
        while time.monotonic() < deadline_s:
            healthy = dict(
                (labels["endpoint"], value)
                for labels, value in _metric_samples(started.url, "longroute_backend_healthy")
            )
            if healthy.get(victim) == 0:
                break
            time.sleep(0.2)
        assert healthy == {name: (0 if name == victim else 1) for name in NAMES}
        assert _get(started.url + "/ready")[0] == 200


# ---- queue overflow ------------------------------------------------------------------------


async def _overflow(url: str) -> tuple[int, str | None, Any]:
    long_body = {**_OK, "max_tokens": 2000}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        first = await http.post(url + "/v1/chat/completions", json={**long_body, "stream": True})
        assert first.status == 200
        await first.content.readline()  # dispatched: the only slot is taken
        queued = asyncio.create_task(http.post(url + "/v1/chat/completions", json=long_body))
        for _ in range(200):
            async with http.get(url + "/metrics") as resp:
                depth = _samples(await resp.text(), "longroute_queue_depth")[0][1]
            if depth == 1 or queued.done():
                break
            await asyncio.sleep(0.02)
        assert depth == 1
        async with http.post(url + "/v1/chat/completions", json=long_body) as third:
            result = third.status, third.headers.get("Retry-After"), await third.json()
        first.close()
        queued.cancel()
        return result


def test_queue_overflow_gets_429_with_retry_after(tmp_path: Path) -> None:
    plan = FleetPlan(
        "overflow",
        replicas=(Replica("slow", "h100", "us-east", 0.0),),
        router="round-robin",
        speed=0.5,
        max_concurrency=1,
        gateway_overrides={"admission": {"max_queue": 1, "retry_after_s": 3}},
    )
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        (started,) = start_fleets(launcher, [plan])
        status, retry_after, payload = asyncio.run(_overflow(started.url))
    assert status == 429
    assert retry_after == "3"
    assert payload["error"]["code"] == "queue_full"
    assert payload["error"]["message"]


# ---- the launcher and the demo -----------------------------------------------------------


def test_child_dying_at_start_up_is_a_clear_error(tmp_path: Path) -> None:
    spec = emulator_spec("broken", profile="no-such-model")
    with pytest.raises(LaunchError) as caught, Launcher(tmp_path, ready_timeout_s=30) as launcher:
        launcher.start(spec)
    message = str(caught.value)
    assert "broken exited with status 2 while starting" in message
    assert "no-such-model" in message  # the log tail says what was wrong
    assert not launcher.children[0].is_running


def test_process_names_are_checked() -> None:
    with pytest.raises(ValueError, match="process name"):
        ProcessSpec("../evil", ("emulate",))


def _marked_pids(mark: str) -> list[int]:
    """Processes whose environment carries ``mark`` (inherited from the demo)."""
    needle = f"LONGROUTE_E2E_MARK={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours
    return found


def _start_demo(*args: str) -> tuple[subprocess.Popen[str], str]:
    mark = uuid.uuid4().hex
    env = {**os.environ, "LONGROUTE_E2E_MARK": mark}
    cmd = [sys.executable, "-m", "longroute", "demo", *args]
    popen = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a job started in the background of a non-interactive shell inherits SIGINT
        # as ignored; the demo is then run as from a terminal, where Ctrl-C arrives
        preexec_fn=_default_sigint,
    )
    return popen, mark


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_demo_runs_end_to_end_and_leaves_nothing_behind() -> None:
    popen, mark = _start_demo("--num-requests", "6", "--concurrency", "2", "--json")
    stdout, stderr = popen.communicate(timeout=90)
    assert popen.returncode == 0, stderr
    payload = json.loads(stdout)
    targets = payload["bench"]["targets"]
    assert set(targets) == {"round-robin", "prefix-cache"}
    for summary in targets.values():
        assert summary["num_requests"] == 6 and summary["num_errors"] == 0
    assert set(payload["bench"]["ratios"]) >= {"throughput_req_per_s", "ttft_p50_s"}
    processes = payload["processes"]
    assert sorted(p["role"] for p in processes) == ["emulator"] * 6 + ["gateway"] * 2
    assert payload["is_all_stopped"] is True
    assert [p["pid"] for p in processes if _is_alive(p["pid"])] == []
    if Path("/proc/self/environ").exists():
        assert _marked_pids(mark) == []


def test_demo_interrupted_stops_everything() -> None:
    popen, mark = _start_demo("--num-requests", "400", "--concurrency", "2")
    assert popen.stderr is not None
    for line in popen.stderr:  # wait until the fleets run and the bench has started
        if line.startswith("benchmarking"):
            break
    popen.send_signal(signal.SIGINT)
    _, stderr = popen.communicate(timeout=30)
    assert popen.returncode == 130, stderr
    assert "interrupted" in stderr
    if Path("/proc/self/environ").exists():
        assert _marked_pids(mark) == []
