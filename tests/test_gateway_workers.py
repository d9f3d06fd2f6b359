"""``longroute serve --workers 2`` as real processes: one port, two workers, one parent.

Two emulators behind a gateway started with ``--workers 2 --metrics-port-base 0`` and
the engine load source. In order (the tests share one gateway):

* both workers answer requests (``x-longroute-worker``) and each worker's own ops port
  counts only its own requests, which add up to the requests sent;
* SIGHUP to the parent reloads both workers (each one's reload counter);
* SIGKILL of one worker: the other keeps serving every request meanwhile, and the
  parent starts a new worker in its slot, which serves again;
* SIGTERM to the parent drains both: streams in flight complete, and the parent
  exits 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from longroute.gateway.workers import backoff_s, check_num_workers, reserve_port
from longroute.launcher import Child, Launcher, ProcessSpec, emulator_spec

MODEL = "llama-3-8b"
READY_TIMEOUT_S = 60.0


@dataclass
class Workers:
    launcher: Launcher
    parent: Child
    config_path: Path

    @property
    def url(self) -> str:
        return self.parent.base_url

    def log(self) -> str:
        return self.parent.log_path.read_text(encoding="utf-8", errors="replace")

    def ops_urls(self) -> dict[int, str]:
        """Each worker's latest ops port, from its log lines."""
        pattern = r"\[worker (\d+)\]: ops port on (http://\S+)"
        return {int(i): url for i, url in re.findall(pattern, self.log())}

    def worker_pids(self) -> dict[int, int]:
        """Each worker slot's latest pid, from the parent's log lines."""
        return {
            int(i): int(pid)
            for i, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", self.log())
        }


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    with Launcher(tmp_path_factory.mktemp("workers"), ready_timeout_s=READY_TIMEOUT_S) as launcher:
        emulators = launcher.start(
            *(emulator_spec(f"emu{i}", profile=MODEL, speed=4.0) for i in range(2))
        )
        config = {
            "backends": [
                {"name": f"emu{i}", "url": e.base_url, "model": MODEL}
                for i, e in enumerate(emulators)
            ],
            "router": {"name": "least-request"},
            "load_source": "engine",
            "admin_enabled": True,
        }
        path = launcher.write_yaml("gateway.yaml", config)
        args = ("serve", "--config", str(path), "--host", "127.0.0.1", "--port", "0")
        spec = ProcessSpec(
            "gateway", (*args, "--workers", "2", "--metrics-port-base", "0"), "/ready"
        )
        (parent,) = launcher.start(spec)
        w = Workers(launcher, parent, path)
        _wait_for(lambda: len(w.ops_urls()) == 2, "both workers' ops ports")
        yield w


def _wait_for(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def _ask(
    url: str, num: int, *, max_tokens: int = 4, stream: bool = False
) -> list[tuple[int, str, bytes]]:
    """``num`` chat requests, each on a new connection: (status, worker header, body)."""
    payload = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello workers"}],
    }
    connector = aiohttp.TCPConnector(force_close=True)  # a new connection: a new kernel pick
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> tuple[int, str, bytes]:
            async with session.post(url + "/v1/chat/completions", json=payload) as resp:
                return resp.status, resp.headers.get("x-longroute-worker", ""), await resp.read()

        return await asyncio.gather(*(one() for _ in range(num)))


def _metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    async def fetch() -> str:
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()

    total = 0.0
    for family in text_string_to_metric_families(asyncio.run(fetch())):
        for sample in family.samples:
            if sample.name == name and all(
                sample.labels.get(k) == v for k, v in (labels or {}).items()
            ):
                total += sample.value
    return total


# ---- units ------------------------------------------------------------------------------


def test_worker_count_is_checked_with_a_clear_error() -> None:
    check_num_workers(8, num_cores=2)
    for bad in (0, 9, -1):
        with pytest.raises(ValueError, match=r"--workers must be between 1 and 8 .* got"):
            check_num_workers(bad, num_cores=2)


def test_serve_refuses_a_bad_worker_count_before_anything_starts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from longroute.cli import app

    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump({"backends": [{"name": "a", "url": "http://x:1", "model": "m"}]})
    )
    result = CliRunner().invoke(app, ["serve", "--config", str(config), "--workers", "0"])
    assert result.exit_code == 2
    assert "--workers must be between 1 and" in result.output


def test_restart_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff_s(50) == 30.0


def test_reserved_port_is_shared_by_reuseport_listeners_and_gets_no_connection() -> None:
    import socket

    with reserve_port("127.0.0.1", 0) as reserved:
        port = reserved.getsockname()[1]
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen()
            for _ in range(20):  # every connection reaches the listener, none the reservation
                with socket.create_connection(("127.0.0.1", port), timeout=2):
                    conn, _ = listener.accept()
                    conn.close()
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # without SO_REUSEPORT: taken


# ---- real processes ---------------------------------------------------------------------


def test_both_workers_serve_and_count_their_own_requests(workers: Workers) -> None:
    ops = workers.ops_urls()
    before = {i: _metric(url, "longroute_requests_total") for i, url in ops.items()}
    results = asyncio.run(_ask(workers.url, 40))
    assert all(status == 200 for status, _, _ in results), results[:3]
    by_worker = {w: sum(1 for _, x, _ in results if x == w) for w in ("0", "1")}
    assert by_worker["0"] > 0 and by_worker["1"] > 0, by_worker
    after = {i: _metric(url, "longroute_requests_total") for i, url in ops.items()}
    assert {str(i): after[i] - before[i] for i in ops} == by_worker


def test_sighup_reloads_both_workers(workers: Workers) -> None:
    ops = workers.ops_urls()
    ok = {"result": "ok"}
    before = {i: _metric(url, "longroute_config_reloads_total", ok) for i, url in ops.items()}
    config = yaml.safe_load(workers.config_path.read_text())
    config["model_aliases"] = {"fast": MODEL}
    workers.config_path.write_text(yaml.safe_dump(config))
    os.kill(workers.parent.pid, signal.SIGHUP)
    _wait_for(
        lambda: all(
            _metric(url, "longroute_config_reloads_total", ok) == before[i] + 1
            for i, url in ops.items()
        ),
        "a reload in each worker",
    )
    assert workers.log().count("SIGHUP: reloading the config") >= 2


def test_a_killed_worker_is_restarted_while_the_other_serves(workers: Workers) -> None:
    old_pid, old_ops = workers.worker_pids()[1], workers.ops_urls()[1]
    os.kill(old_pid, signal.SIGKILL)
    exited = re.compile(rf"worker 1 \(pid {old_pid}\) exited with -9 .* restarting it in")
    # connections the kernel had queued at the killed worker die with it; once it is gone
    # (the parent saw it exit) every new one goes to worker 0
    _wait_for(lambda: exited.search(workers.log()) is not None, "the parent to see the death")
    results = asyncio.run(_ask(workers.url, 20))
    assert all(status == 200 for status, _, _ in results), [r[:2] for r in results]
    _wait_for(lambda: workers.worker_pids()[1] != old_pid, "worker 1's restart")
    _wait_for(lambda: workers.ops_urls()[1] != old_ops, "the new worker 1 to listen")
    assert _metric(workers.ops_urls()[1], "longroute_requests_total") == 0  # a fresh process

    def worker_1_serves() -> bool:
        return any(x == "1" for _, x, _ in asyncio.run(_ask(workers.url, 10)))

    _wait_for(worker_1_serves, "the new worker 1 to serve")
    assert workers.parent.is_running


def test_sigterm_drains_both_workers_and_the_parent_exits_0(workers: Workers) -> None:
    async def streams_across_a_sigterm() -> list[tuple[int, str, bytes]]:
        pending = asyncio.ensure_future(_ask(workers.url, 16, max_tokens=600, stream=True))
        await asyncio.sleep(0.5)  # the streams are running in both workers
        os.kill(workers.parent.pid, signal.SIGTERM)
        return await pending

    results = asyncio.run(streams_across_a_sigterm())
    assert all(status == 200 and body.endswith(b"data: [DONE]\n\n") for status, _, body in results)
    assert {x for _, x, _ in results} == {"0", "1"}
    assert b"server_shutdown" not in b"".join(body for _, _, body in results)
    assert workers.parent.popen.wait(timeout=30) == 0
    log = workers.log()
    assert "SIGTERM: draining 2 workers" in log and "all 2 workers drained; exiting" in log
    assert len(re.findall(r"\[worker \d\]: drained in", log)) == 2
    in_flight = re.findall(r"\[worker \d\]: draining: (\d+) request", log)
    assert len(in_flight) == 2 and all(int(n) > 0 for n in in_flight), in_flight
