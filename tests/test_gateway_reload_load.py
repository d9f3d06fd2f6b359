"""Reload under load: a real ``longroute serve`` in front of emulators, 200 clients for 30 s.

Six reloads during the run (``POST /admin/reload``): add a backend, remove one
with requests in flight, change the router's parameters, add a client key, then
remove an unused one, and load an invalid file. No client may see an error or a
dropped connection; the invalid file leaves the old config serving and says why;
the prefix-cache hit ratio of the backends that stay (from their engines' own
counters) is the same before the reloads and after them. SIGHUP reloads too, and
leaves the process running.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from longroute.launcher import Child, Launcher, emulator_spec, gateway_spec

READY_TIMEOUT_S = 60.0
MODEL = "llama-3-8b"
ADMIN_KEY = "admin-7d2c9e1f4a6b8c0d"
CLIENT_KEY, NEW_KEY, UNUSED_KEY = "ck-load-1a2b3c4d5e", "ck-new-6f7a8b9c0d", "ck-unused-1e2f3a"
NUM_CLIENTS = 200
RUN_S = 30.0
NUM_SESSIONS = 200


def _config(emulators: dict[str, Child], names: list[str], keys_file: Path, **router: Any) -> Any:
    return {
        "backends": [
            {"name": n, "url": emulators[n].base_url, "model": MODEL, "max_concurrency": 64}
            for n in names
        ],
        "router": {"name": "gorgo", "params": router or {"rtt_weight": 1.0, "queue_weight": 0.5}},
        "admin_enabled": True,
        "admin_api_key_env": "LR_LOAD_ADMIN",
        "client_api_keys_file": str(keys_file),
        "health": {"interval_s": 1.0},
        "rtt_probe_interval_s": 2.0,
        "scrape_interval_s": 1.0,
        "admission": {"max_queue": 4096, "queue_timeout_s": 60.0},
    }


async def _prefix_counts(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(hits, queries) of an engine's prefix cache, in tokens."""
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    values = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"]


class Run:
    def __init__(self, gateway: Child, emulators: dict[str, Child], workdir: Path) -> None:
        self.gateway = gateway
        self.emulators = emulators
        self.workdir = workdir
        self.keys = workdir / "keys.txt"
        self.path = workdir / "gateway.yaml"
        self.statuses: dict[int, int] = {}
        self.failures: list[str] = []
        self.reloads: list[tuple[str, int, Any]] = []
        self.num_done = 0

    async def client(self, http: aiohttp.ClientSession, index: int, end_s: float) -> None:
        rng = random.Random(index)
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        while time.monotonic() < end_s:
            session = rng.randrange(NUM_SESSIONS)
            prefix = f"session {session} system prompt: " + "context words " * 120
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prefix + f" turn {rng.random()}"}],
                "max_tokens": 4,
                "stream": bool(index % 2),
                "user": f"s{session}",
            }
            try:
                async with http.post(
                    self.gateway.base_url + "/v1/chat/completions", json=body, headers=headers
                ) as response:
                    data = await response.read()
                    self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
                    if response.status != 200:
                        self.failures.append(f"{response.status}: {data[:200]!r}")
                    elif body["stream"] and not data.endswith(b"data: [DONE]\n\n"):
                        self.failures.append(f"stream cut: {data[-120:]!r}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.num_done += 1

    async def reload(self, http: aiohttp.ClientSession, what: str, config: Any) -> None:
        self.path.write_text(yaml.safe_dump(config))
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with http.post(self.gateway.base_url + "/admin/reload", headers=headers) as r:
            self.reloads.append((what, r.status, await r.json()))

    async def hit_ratio(self, http: aiohttp.ClientSession, names: list[str]) -> tuple[float, float]:
        hits = queries = 0.0
        for name in names:
            h, q = await _prefix_counts(http, self.emulators[name].base_url)
            hits, queries = hits + h, queries + q
        return hits, queries


async def _run(run: Run) -> dict[str, Any]:
    emulators = run.emulators
    timeout = aiohttp.ClientTimeout(total=90)
    connector = aiohttp.TCPConnector(limit=NUM_CLIENTS + 20)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        end_s = time.monotonic() + RUN_S
        clients = [asyncio.create_task(run.client(http, i, end_s)) for i in range(NUM_CLIENTS)]
        stay = ["e1", "e2"]
        await asyncio.sleep(4.0)  # warm: every session has been seen
        before_start = await run.hit_ratio(http, stay)
        await asyncio.sleep(4.0)
        before_end = await run.hit_ratio(http, stay)
        base = ["e1", "e2", "e3"]
        await run.reload(http, "add e4", _config(emulators, [*base, "e4"], run.keys))
        await asyncio.sleep(1.5)
        busy = emulators["e3"].base_url
        inflight = await _busy(http, run.gateway.base_url, "e3")
        await run.reload(http, "remove e3", _config(emulators, ["e1", "e2", "e4"], run.keys))
        await asyncio.sleep(1.5)
        params = {"rtt_weight": 2.0, "queue_weight": 1.0}
        await run.reload(
            http, "router params", _config(emulators, ["e1", "e2", "e4"], run.keys, **params)
        )
        run.keys.write_text(f"{CLIENT_KEY}\n{UNUSED_KEY}\n{NEW_KEY}\n")
        await run.reload(
            http, "add key", _config(emulators, ["e1", "e2", "e4"], run.keys, **params)
        )
        new_key = await _status_with_key(http, run.gateway.base_url, NEW_KEY)
        run.keys.write_text(f"{CLIENT_KEY}\n{NEW_KEY}\n")
        await run.reload(
            http, "remove key", _config(emulators, ["e1", "e2", "e4"], run.keys, **params)
        )
        unused_key = await _status_with_key(http, run.gateway.base_url, UNUSED_KEY)
        invalid = _config(emulators, ["e1", "e2", "e4"], run.keys, **params)
        invalid["router"] = {"name": "gorgo", "params": {"rtt_weight": -1.0}}
        await run.reload(http, "invalid", invalid)
        await asyncio.sleep(max(0.0, end_s - time.monotonic() - 7.0))
        after_start = await run.hit_ratio(http, stay)
        await asyncio.sleep(max(0.0, end_s - time.monotonic() - 0.5))
        after_end = await run.hit_ratio(http, stay)
        await asyncio.gather(*clients)
        e3_busy = await _prefix_counts(http, busy)
    return {
        "before": _ratio(before_start, before_end),
        "after": _ratio(after_start, after_end),
        "new_key": new_key,
        "unused_key": unused_key,
        "e3_inflight_at_removal": inflight,
        "e3_queries": e3_busy[1],
    }


def _ratio(start: tuple[float, float], end: tuple[float, float]) -> float:
    return (end[0] - start[0]) / max(end[1] - start[1], 1.0)


async def _metric(http: aiohttp.ClientSession, url: str, endpoint: str) -> float:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    prefix = f'longroute_backend_inflight_requests{{endpoint="{endpoint}"}} '
    (line,) = [x for x in text.splitlines() if x.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


async def _busy(http: aiohttp.ClientSession, url: str, endpoint: str) -> float:
    """The endpoint's in-flight count, polled until it is non-zero (at most ~3 s).

    One sample of the gauge can land between two short requests, so the removal
    waits for a moment when the backend has work in flight, and happens right after.
    """
    inflight = 0.0
    for _ in range(120):
        inflight = await _metric(http, url, endpoint)
        if inflight >= 1:
            break
        await asyncio.sleep(0.025)
    return inflight


async def _status_with_key(http: aiohttp.ClientSession, url: str, key: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "key check"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
        await response.read()
        return response.status


def test_six_reloads_under_200_clients_lose_nothing(tmp_path: Path) -> None:
    env = {"LR_LOAD_ADMIN": ADMIN_KEY}
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S, env=env) as launcher:
        started = launcher.start(
            *(emulator_spec(f"e{i}", profile=MODEL, speed=20.0) for i in range(1, 5))
        )
        emulators = {e.name: e for e in started}
        keys = tmp_path / "keys.txt"
        keys.write_text(f"{CLIENT_KEY}\n{UNUSED_KEY}\n")
        config = launcher.write_yaml("gateway.yaml", _config(emulators, ["e1", "e2", "e3"], keys))
        (gateway,) = launcher.start(gateway_spec("gateway", config))
        run = Run(gateway, emulators, tmp_path)
        figures = asyncio.run(_run(run))
        gateway.popen.send_signal(signal.SIGHUP)  # reloads the (still invalid) file: refused
        time.sleep(1.0)
        still_running = gateway.is_running
        log = gateway.log_path.read_text(encoding="utf-8", errors="replace")
    print(f"reload under load: {run.num_done} requests, {figures}")  # for the closing note
    assert run.failures == [], run.failures[:5]
    assert set(run.statuses) == {200} and run.num_done > 1000
    kinds = [(what, status) for what, status, _ in run.reloads]
    assert kinds == [
        ("add e4", 200), ("remove e3", 200), ("router params", 200), ("add key", 200),
        ("remove key", 200), ("invalid", 400),
    ]  # fmt: skip
    invalid_answer = run.reloads[-1][2]["error"]["message"]
    assert "rtt_weight" in invalid_answer
    assert figures["e3_inflight_at_removal"] >= 1  # it was removed with requests in flight
    assert figures["new_key"] == 200 and figures["unused_key"] == 401
    assert abs(figures["after"] - figures["before"]) <= 0.05, figures
    assert figures["before"] > 0.5
    assert "config reload refused, the old config still serves" in log
    assert "SIGHUP: reloading the config" in log and still_running
