"""Gateway under request-head attacks: a huge header, slowloris and a header trickle flood.

Starts one ``longroute serve`` child on 127.0.0.1 (its one backend is a closed port:
``/health`` never touches backends; health checks, RTT probes and scrapes are kept
quiet) and attacks it with raw sockets. A separate probe process times ``GET /health``
on its own keep-alive connection (one request every ~10 ms), so the measuring client
never shares an event loop with the attackers; the many-connection attacks run in a
process of their own at ``--nice 19``, standing for clients on other machines, so that
on a small box neither the gateway nor the probe waits for a CPU behind them.

Phases (progress on stderr, a summary on stdout, one JSON object on the last line):

1. huge header, ``--repeats`` times: ``POST /v1/chat/completions`` whose ``X-Big``
   header value is ``--header-mib`` MiB of ``a`` in 64 KiB writes, never ended by
   CRLF; sending stops when a write fails or all is sent, then the reply is read
   for a few seconds. Per repetition: the gateway's CPU time (utime + stime of its
   process, from /proc/PID/stat; needs Linux), the status line received, whether the
   server closed the connection, the bytes sent and the wall time.
2. baseline: ``/health`` latency with no attack (a reference for the next two).
3. slowloris: ``--connections`` connections each send a request head one byte every
   0.1-0.5 s, never finishing it (reopened when the server closes them); ``/health``
   p50/p99/max for ``--duration-s`` and the closes the server made (by status).
4. trickle flood: ``--flood-connections`` connections each send a never-ending header
   value in 1 KiB writes as fast as they can; ``/health`` latency and gateway CPU.

Goals (the acceptance goals of request-head limits; "met" is null where a phase
could not measure):

* ``huge_header_cpu_s``: median gateway CPU < 0.1 s per huge header, and the
  connection closed by the server in every repetition (a 431 is expected);
* ``slowloris_health_p99_ms``: ``/health`` p99 < 50 ms during the slowloris;
* ``trickle_flood_health_p99_ms``: ``/health`` p99 < 50 ms during the flood.

A ``/health`` request that fails counts in the percentiles with the time it took,
and any failure misses the goal. Every wait has a deadline and the gateway is always
stopped. Run it (about a minute; ``--quick`` for a smoke run of ~20-30 s):

    .venv/bin/python benchmarks/gateway_attacks.py [--repeats 5] [--connections 100]
        [--flood-connections 20] [--duration-s 10] [--header-mib 32] [--nice 19] [--quick]

To measure another checkout's code, put its ``src`` first: ``PYTHONPATH=/other/src``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import importlib.util
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _harness import free_port, start, stop, wait_ready

HOST = "127.0.0.1"
KIB = 1024
MIB = 1024 * KIB
CHUNK_BYTES = 64 * KIB  # huge header: bytes per write
FLOOD_CHUNK_BYTES = 1 * KIB  # trickle flood: bytes per write
SEND_TIMEOUT_S = 5.0  # huge header: one write blocked this long = the server stopped reading
SEND_DEADLINE_S = 60.0  # huge header: the whole send
REPLY_TIMEOUT_S = 3.0  # huge header: reading the reply
SETTLE_TIMEOUT_S = 10.0  # waiting for the gateway's CPU to go quiet
HUGE_PHASE_DEADLINE_S = 180.0  # no new repetition starts after this
PROBE_INTERVAL_S = 0.010
PROBE_TIMEOUT_S = 5.0  # one /health request
RAMP_TIMEOUT_S = 5.0  # attack connections established
GOAL_CPU_S = 0.1
GOAL_P99_MS = 50.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_s(pid: int) -> float | None:
    """utime + stime of process ``pid`` (all its threads), in seconds; None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled_cpu_s(pid: int, timeout_s: float = SETTLE_TIMEOUT_S) -> float | None:
    """The process's CPU time once it stopped growing (two equal samples 0.1 s apart)."""
    deadline = time.monotonic() + timeout_s
    last = cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = cpu_s(pid)
        if now is None or now == last:
            return now
        last = now
    return last


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def status_of(data: bytes) -> int | None:
    """The status code of a reply's first bytes, or None where there is no status line."""
    if not data.startswith(b"HTTP/1."):
        return None
    parts = data.split(b" ", 2)
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


# ---- the gateway child ------------------------------------------------------------
class GatewayChild:
    """``longroute serve`` on a free loopback port; restarted if an attack kills it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.num_starts = 0
        self.deaths: list[str] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.port = free_port()
        dead_port = free_port()  # nothing listens there: the backend is never needed
        config = {
            "listen": {"host": HOST, "port": self.port},
            "backends": [{"name": "b0", "url": f"http://{HOST}:{dead_port}", "model": "m"}],
            "health": {"interval_s": 3600.0},
            "rtt_probe_interval_s": None,
            "scrape_interval_s": None,
        }
        self.num_starts += 1
        cfg = self.tmp / f"gateway-{self.num_starts}.json"
        cfg.write_text(json.dumps(config))
        self.log_path = self.tmp / f"gateway-{self.num_starts}.log"
        # sys.executable itself (no shell): the Popen pid is the gateway's python process
        cmd = [
            sys.executable,
            "-m",
            "longroute",
            "serve",
            "--config",
            str(cfg),
            "--log-level",
            "warning",
        ]
        self.proc = start(cmd, self.log_path)
        wait_ready(f"http://{HOST}:{self.port}/health", self.proc, self.log_path, timeout_s=60)

    def ensure_alive(self, phase: str) -> None:
        """Restarts the gateway if it died (noting where and its log's tail)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-5:]
            self.deaths.append(f"before {phase}: exit {self.proc.returncode}")
            log(f"gateway died (exit {self.proc.returncode}); log tail: {tail}; restarting")
        self.start()

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


# ---- phase 1: one huge unterminated header ------------------------------------------
def huge_header_once(port: int, pid: int, total_bytes: int) -> dict[str, Any]:
    """Sends the never-ending header, reads the reply; the gateway's CPU it cost."""
    cpu_before = settled_cpu_s(pid)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: "
    chunk = memoryview(b"a" * CHUNK_BYTES)
    sent = 0
    send_end = "all sent"
    closed_how: str | None = None
    t0 = time.perf_counter()
    sock = socket.create_connection((HOST, port), timeout=SEND_TIMEOUT_S)
    try:
        sock.sendall(head)
        deadline = time.monotonic() + SEND_DEADLINE_S
        while sent < total_bytes:
            if time.monotonic() > deadline:
                send_end = f"send deadline ({SEND_DEADLINE_S:.0f} s)"
                break
            view = chunk[: min(CHUNK_BYTES, total_bytes - sent)]
            try:
                while view:  # send() rather than sendall(): count every byte that went out
                    n = sock.send(view)
                    sent += n
                    view = view[n:]
            except TimeoutError:
                send_end = f"write blocked {SEND_TIMEOUT_S:.0f} s"
                break
            except OSError as exc:  # reset / broken pipe: the server closed
                send_end = f"write failed ({type(exc).__name__})"
                closed_how = "on send"
                break
        reply = b""
        read_deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            remaining_s = read_deadline - time.monotonic()
            if remaining_s <= 0:
                break
            sock.settimeout(remaining_s)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except OSError as exc:
                closed_how = closed_how or f"reset on read ({type(exc).__name__})"
                break
            if not data:
                closed_how = closed_how or "FIN"
                break
            if len(reply) < 4096:
                reply += data
    finally:
        sock.close()
    wall_s = time.perf_counter() - t0
    cpu_after = settled_cpu_s(pid)
    cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
    first_line = reply.split(b"\r\n", 1)[0].decode("latin-1")[:80] if reply else None
    return {
        "cpu_s": cpu,
        "status": status_of(reply),
        "status_line": first_line,
        "closed": closed_how is not None,
        "closed_how": closed_how,
        "send_end": send_end,
        "bytes_sent": sent,
        "wall_s": wall_s,
    }


def huge_header_phase(gw: GatewayChild, repeats: int, total_bytes: int) -> dict[str, Any]:
    reps: list[dict[str, Any]] = []
    phase_deadline = time.monotonic() + HUGE_PHASE_DEADLINE_S
    for i in range(repeats):
        if time.monotonic() > phase_deadline:
            log(f"huge header: phase deadline ({HUGE_PHASE_DEADLINE_S:.0f} s) hit, stopping")
            break
        gw.ensure_alive(f"huge header rep {i + 1}")
        log(f"huge header {i + 1}/{repeats}: {total_bytes / MIB:.0f} MiB unterminated header")
        try:
            rep = huge_header_once(gw.port, gw.pid, total_bytes)
        except OSError as exc:  # e.g. the connection was refused
            log(f"  failed: {exc!r}")
            rep = {
                "cpu_s": None,
                "status": None,
                "closed": False,
                "error": repr(exc),
                "bytes_sent": 0,
                "wall_s": 0.0,
                "closed_how": None,
                "send_end": "error",
            }
        rep["gateway_alive_after"] = gw.is_alive()
        reps.append(rep)
        cpu = "n/a" if rep["cpu_s"] is None else f"{rep['cpu_s']:.3f} s"
        log(
            f"  cpu {cpu}, status {rep['status']}, closed {rep['closed_how'] or 'no'}, "
            f"sent {rep['bytes_sent'] / MIB:.1f} MiB ({rep['send_end']}), "
            f"wall {rep['wall_s']:.2f} s"
        )
    cpus = [r["cpu_s"] for r in reps if r["cpu_s"] is not None]
    return {
        "header_bytes": total_bytes,
        "repetitions": reps,
        "median_cpu_s": statistics.median(cpus) if cpus else None,
        "max_cpu_s": max(cpus) if cpus else None,
        "all_closed": bool(reps) and all(r["closed"] for r in reps),
        "statuses": [r["status"] for r in reps],
        "median_wall_s": statistics.median(r["wall_s"] for r in reps) if reps else None,
    }


# ---- the /health probe (its own process: python gateway_attacks.py --probe PORT) ----
def probe(port: int, duration_s: float) -> dict[str, Any]:
    """Sequential GET /health on one keep-alive connection, one every ~10 ms."""
    conn: http.client.HTTPConnection | None = None

    def once() -> tuple[float, bool]:
        nonlocal conn
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(HOST, port, timeout=PROBE_TIMEOUT_S)
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            ok = resp.status == 200
            if resp.will_close:
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException):
            ok = False
            if conn is not None:
                conn.close()
            conn = None
        return time.perf_counter() - t0, ok

    once()  # connect and warm up (before the attack starts), not counted
    print("ready", flush=True)
    if not sys.stdin.readline():  # "go", or EOF: the parent is gone
        sys.exit(1)
    latencies: list[float] = []
    num_errors = 0
    num_connects = 0
    start_t = time.perf_counter()
    deadline = start_t + duration_s
    next_t = start_t
    while time.perf_counter() < deadline:
        num_connects += conn is None
        elapsed, ok = once()
        latencies.append(elapsed)
        num_errors += not ok
        next_t += PROBE_INTERVAL_S
        now = time.perf_counter()
        if next_t > now:
            time.sleep(next_t - now)
        else:
            next_t = now  # late: no burst to catch up
    if conn is not None:
        conn.close()
    latencies.sort()
    ms = [1000 * x for x in latencies]
    return {
        "num_requests": len(ms),
        "num_errors": num_errors,
        "num_reconnects": num_connects,
        "p50_ms": percentile(ms, 50) if ms else None,
        "p99_ms": percentile(ms, 99) if ms else None,
        "max_ms": ms[-1] if ms else None,
        "window_s": time.perf_counter() - start_t,
    }


class Probe:
    """The probe process: started (connected, warmed up) before an attack, run during it."""

    def __init__(self, port: int, duration_s: float) -> None:
        self.port = port
        self.duration_s = duration_s
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> bool:
        """Starts the process and waits (with a deadline) for its "ready"."""
        cmd = [
            sys.executable,
            __file__,
            "--probe",
            str(self.port),
            "--duration-s",
            str(self.duration_s),
        ]
        self.proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), PROBE_TIMEOUT_S + 15)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            log(f"probe did not get ready ({line[:200]!r})")
            await self.close()
            return False
        return True

    async def run(self) -> dict[str, Any] | None:
        """Tells it to measure; its figures, or None if it failed or overran its deadline."""
        proc = self.proc
        if proc is None:
            return None
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(b"go\n"), timeout=self.duration_s + 2 * PROBE_TIMEOUT_S + 15
            )
        except TimeoutError:
            log("probe overran its deadline: killed")
            return None
        finally:
            await self.close()
        if proc.returncode != 0:
            log(f"probe failed (exit {proc.returncode}): {err.decode(errors='replace')[-500:]}")
            return None
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return result

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def probe_alone(port: int, duration_s: float) -> dict[str, Any] | None:
    probe_ = Probe(port, duration_s)
    try:
        return await probe_.run() if await probe_.start() else None
    finally:
        await probe_.close()


# ---- phases 3 and 4: many attack connections ------------------------------------------
@dataclass
class AttackStats:
    num_opened: int = 0
    num_open: int = 0
    num_connect_errors: int = 0
    bytes_written: int = 0
    closes: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, status key)
    is_stopping: bool = False


async def read_reply(reader: asyncio.StreamReader) -> tuple[int | None, str]:
    """Reads until the server closes; its status (if it answered) and how it closed."""
    data = b""
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return status_of(data), "fin"
            if len(data) < 4096:
                data += chunk
    except OSError:
        return status_of(data), "reset"


async def attacker(
    port: int, head: bytes, is_flood: bool, stats: AttackStats, rng: random.Random
) -> None:
    """One attack connection, reopened whenever the server closes it (until cancelled)."""
    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
    while not stats.is_stopping:
        try:
            async with asyncio.timeout(5.0):
                reader, writer = await asyncio.open_connection(HOST, port)
        except (OSError, TimeoutError):
            stats.num_connect_errors += 1
            await asyncio.sleep(0.1)
            continue
        stats.num_opened += 1
        stats.num_open += 1
        reply = asyncio.create_task(read_reply(reader))
        try:
            with contextlib.suppress(OSError):  # a failed write: the server closed
                writer.write(head)
                stats.bytes_written += len(head)
                if is_flood:
                    chunk = b"a" * FLOOD_CHUNK_BYTES
                    n = 0
                    while not reply.done():
                        writer.write(chunk)
                        stats.bytes_written += FLOOD_CHUNK_BYTES
                        n += 1
                        if n % 16 == 0:  # drain() only yields when paused: share the loop
                            await asyncio.sleep(0)
                        await writer.drain()
                else:
                    while not reply.done():
                        writer.write(b"a")
                        stats.bytes_written += 1
                        await writer.drain()
                        await asyncio.wait({reply}, timeout=rng.uniform(0.1, 0.5))
            try:
                async with asyncio.timeout(2.0):
                    status, how = await asyncio.shield(reply)
            except TimeoutError:
                status, how = None, "write-failed"
            stats.closes.append((time.monotonic(), str(status) if status else f"none-{how}"))
        finally:
            stats.num_open -= 1
            reply.cancel()
            writer.close()


HEADS = {
    "slowloris": b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ",
    "flood": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Flood: ",
}


async def attack_process(port: int, kind: str, num_connections: int) -> None:
    """The attackers' own process (``--attack KIND``): opens the connections, says
    ``open N``, then on stdin ``mark`` notes the bytes written, and on ``stop`` (or EOF)
    closes everything and prints its figures as JSON."""
    stats = AttackStats()
    rng = random.Random(0)
    tasks = [
        asyncio.create_task(attacker(port, HEADS[kind], kind == "flood", stats, rng))
        for _ in range(num_connections)
    ]
    ramp_deadline = time.monotonic() + RAMP_TIMEOUT_S
    while stats.num_opened < num_connections and time.monotonic() < ramp_deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # into the rhythm
    print(f"open {stats.num_open}", flush=True)
    loop = asyncio.get_running_loop()
    bytes_at_mark = None
    t_mark = math.inf
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if line.strip() != "mark":  # "stop", or EOF: the parent is gone
            break
        bytes_at_mark, t_mark = stats.bytes_written, time.monotonic()
    bytes_at_stop, t_stop = stats.bytes_written, time.monotonic()
    stats.is_stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=5.0)
    result = {
        "bytes_at_mark": bytes_at_mark,
        "bytes_at_stop": bytes_at_stop,
        "num_opened": stats.num_opened,
        "num_connect_errors": stats.num_connect_errors,
        "closes_total": len(stats.closes),
        "closes_in_window": Counter(key for t, key in stats.closes if t_mark <= t <= t_stop),
    }
    print(json.dumps(result), flush=True)


async def attack_window(
    gw: GatewayChild, kind: str, num_connections: int, duration_s: float, nice: int
) -> dict[str, Any]:
    """Runs the attack in its own (niced) process, and the probe over ``duration_s`` of it,
    with the gateway's and the attackers' CPU over that window."""
    probe_ = Probe(gw.port, duration_s)
    is_ready = await probe_.start()
    cmd = [
        sys.executable,
        __file__,
        "--attack",
        kind,
        "--port",
        str(gw.port),
        "--connections",
        str(num_connections),
        "--nice",
        str(nice),
    ]
    with (gw.tmp / f"attack-{kind}.log").open("ab") as err_log:
        attack = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err_log,
            limit=16 * MIB,  # its figures come as one line
        )
    assert attack.stdin is not None and attack.stdout is not None
    num_open_at_start = 0
    health = None
    stats: dict[str, Any] | None = None
    t0 = t1 = time.monotonic()
    cpu_gw: list[float | None] = [None, None]  # before and after the window
    cpu_attack: list[float | None] = [None, None]
    try:
        line = await asyncio.wait_for(attack.stdout.readline(), RAMP_TIMEOUT_S + 15)
        if not line.startswith(b"open "):
            raise RuntimeError(f"the attack process did not start: {line[:200]!r}")
        num_open_at_start = int(line.split()[1])
        log(
            f"  {num_open_at_start}/{num_connections} attack connections open; probing "
            f"/health for {duration_s:.0f} s"
        )
        attack.stdin.write(b"mark\n")
        await attack.stdin.drain()
        cpu_gw[0], cpu_attack[0] = cpu_s(gw.pid), cpu_s(attack.pid)
        t0 = time.monotonic()
        health = await probe_.run() if is_ready else None
        t1 = time.monotonic()
        cpu_gw[1], cpu_attack[1] = cpu_s(gw.pid), cpu_s(attack.pid)
        attack.stdin.write(b"stop\n")
        await attack.stdin.drain()
        # its figures come on one line; no waiting for its exit (killed below if it lingers)
        out = await asyncio.wait_for(attack.stdout.readline(), 20.0)
        stats = json.loads(out)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(attack.wait(), 5.0)
    except (TimeoutError, RuntimeError, ValueError, IndexError) as exc:
        log(f"  attack process: {exc!r}")
    finally:
        await probe_.close()
        if attack.returncode is None:
            attack.kill()
            await attack.wait()
    window_s = t1 - t0

    def share(before_after: list[float | None]) -> float | None:
        before, after = before_after
        if before is None or after is None or window_s <= 0:
            return None
        return (after - before) / window_s

    by_status: dict[str, int] = stats["closes_in_window"] if stats else {}
    gw_share = share(cpu_gw)
    bytes_in_window = None
    if stats and stats["bytes_at_mark"] is not None:
        bytes_in_window = stats["bytes_at_stop"] - stats["bytes_at_mark"]
    return {
        "connections": num_connections,
        "open_at_window_start": num_open_at_start,
        "health": health,
        "window_s": window_s,
        "gateway_cpu_s": None if gw_share is None else gw_share * window_s,
        "gateway_cpu_share": gw_share,
        "attacker_cpu_share": share(cpu_attack),
        "attacker_nice": nice,
        "server_closes_in_window": sum(by_status.values()),
        "server_closes_by_status": dict(sorted(by_status.items())),
        "server_closes_total": stats["closes_total"] if stats else None,
        "connections_opened_total": stats["num_opened"] if stats else None,
        "connect_errors": stats["num_connect_errors"] if stats else None,
        "bytes_written_in_window": bytes_in_window,
        "gateway_alive_after": gw.is_alive(),
    }


def attack_phase(
    gw: GatewayChild, name: str, kind: str, num_connections: int, duration_s: float, nice: int
) -> dict[str, Any]:
    gw.ensure_alive(name)
    log(f"{name}: {num_connections} connections")
    res = asyncio.run(attack_window(gw, kind, num_connections, duration_s, nice))
    h = res["health"]
    if h is None:
        figures = "/health not measured"
    else:
        figures = (
            f"/health p50 {h['p50_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms, "
            f"max {h['max_ms']:.1f} ms, {h['num_requests']} req, {h['num_errors']} errors"
        )
    log(f"  {figures}")
    shares = [res["gateway_cpu_share"], res["attacker_cpu_share"]]
    gw_cpu, attack_cpu = ("n/a" if x is None else f"{x:.0%}" for x in shares)
    log(
        f"  server closed {res['server_closes_in_window']} {res['server_closes_by_status']}; "
        f"CPU: gateway {gw_cpu}, attackers {attack_cpu}"
    )
    return res


def baseline_phase(gw: GatewayChild, duration_s: float) -> dict[str, Any] | None:
    gw.ensure_alive("baseline")
    log(f"baseline: /health with no attack for {duration_s:.0f} s")
    return asyncio.run(probe_alone(gw.port, duration_s))


# ---- report -----------------------------------------------------------------------------
def p99_goal(res: dict[str, Any] | None) -> dict[str, Any]:
    health: dict[str, Any] | None = res["health"] if res is not None else None
    if health is None or health["p99_ms"] is None:
        value, met = None, None
    else:
        value = health["p99_ms"]
        met = bool(value < GOAL_P99_MS and health["num_errors"] == 0)
    return {"target": f"< {GOAL_P99_MS:.0f} ms", "value": value, "met": met}


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_summary(report: dict[str, Any]) -> None:
    hh = report.get("huge_header")
    if hh is None:
        print("huge header: not measured")
    else:
        print(
            f"huge header ({hh['header_bytes'] / MIB:.0f} MiB, {len(hh['repetitions'])} reps): "
            f"median CPU {fmt(hh['median_cpu_s'], '.3f')} s, "
            f"max {fmt(hh['max_cpu_s'], '.3f')} s, all closed {hh['all_closed']}"
        )
        print(f"  statuses {hh['statuses']}, median wall {fmt(hh['median_wall_s'], '.2f')} s")
    rows: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = [
        ("baseline", report.get("baseline"), None)
    ]
    for name, key in (("slowloris", "slowloris"), ("trickle flood", "trickle_flood")):
        res = report.get(key)
        rows.append((name, res["health"] if res else None, res))
    print(
        f"{'/health under':<14} {'conns':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'req':>5} {'err':>4} {'gw CPU':>7} {'closes':>6}"
    )
    for name, h, res in rows:
        conns = str(res["connections"]) if res else "0"
        share = res["gateway_cpu_share"] if res else None
        cpu = "-" if share is None else f"{share:.0%}"
        closes = str(res["server_closes_in_window"]) if res else "-"
        if h is None:
            print(f"{name:<14} {conns:>5} {'not measured':>26}")
            continue
        print(
            f"{name:<14} {conns:>5} {h['p50_ms']:8.1f} {h['p99_ms']:8.1f} {h['max_ms']:8.1f} "
            f"{h['num_requests']:5d} {h['num_errors']:4d} {cpu:>7} {closes:>6}"
        )
    for name, goal in report["goals"].items():
        print(
            f"goal {name}: {goal['target']}: value {fmt(goal['value'], '.3f')}, met {goal['met']}"
        )


def run_all(args: argparse.Namespace) -> None:
    spec = importlib.util.find_spec("longroute")
    report: dict[str, Any] = {
        "benchmark": "gateway_attacks",
        "settings": {
            "repeats": args.repeats,
            "connections": args.connections,
            "flood_connections": args.flood_connections,
            "duration_s": args.duration_s,
            "header_mib": args.header_mib,
            "quick": args.quick,
            "attacker_nice": args.nice,
            "cpus": len(os.sched_getaffinity(0)),
            "longroute": str(Path(spec.origin).parent) if spec and spec.origin else None,
        },
    }
    report["errors"] = []
    header_bytes = int(args.header_mib * MIB)
    is_started = False
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lr-attacks-") as tmp:
        gw = GatewayChild(Path(tmp))
        try:
            log(f"starting longroute serve ({report['settings']['longroute']})")
            gw.start()
            is_started = True
            log(f"gateway pid {gw.pid} on {HOST}:{gw.port}")
        except Exception as exc:  # report it (and every goal as unmeasured) below
            log(f"the gateway did not start: {exc!r}")
            report["errors"].append(f"gateway start: {exc!r}")
        try:
            phases: list[tuple[str, Callable[[], dict[str, Any] | None]]] = [
                ("huge_header", lambda: huge_header_phase(gw, args.repeats, header_bytes)),
                ("baseline", lambda: baseline_phase(gw, min(3.0, args.duration_s))),
                (
                    "slowloris",
                    lambda: attack_phase(
                        gw, "slowloris", "slowloris", args.connections, args.duration_s, args.nice
                    ),
                ),
                (
                    "trickle_flood",
                    lambda: attack_phase(
                        gw,
                        "trickle flood",
                        "flood",
                        args.flood_connections,
                        args.duration_s,
                        args.nice,
                    ),
                ),
            ]
            for name, phase in phases:
                if not is_started:
                    break
                try:
                    report[name] = phase()
                except Exception as exc:  # one broken phase must not lose the others
                    log(f"{name} failed: {exc!r}")
                    report[name] = None
                    report["errors"].append(f"{name}: {exc!r}")
        finally:
            gw.stop()
    report["gateway_starts"] = gw.num_starts
    report["gateway_deaths"] = gw.deaths
    report["wall_s"] = time.monotonic() - t_start
    hh = report.get("huge_header") or {"median_cpu_s": None, "all_closed": False}
    median = hh["median_cpu_s"]
    report["goals"] = {
        "huge_header_cpu_s": {
            "target": f"< {GOAL_CPU_S} s, connection closed",
            "value": median,
            "met": None if median is None else bool(median < GOAL_CPU_S and hh["all_closed"]),
        },
        "slowloris_health_p99_ms": p99_goal(report.get("slowloris")),
        "trickle_flood_health_p99_ms": p99_goal(report.get("trickle_flood")),
    }
    log(f"done in {report['wall_s']:.0f} s")
    print_summary(report)
    print(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, help="huge-header repetitions (default 5)")
    parser.add_argument("--connections", type=int, help="slowloris connections (default 100)")
    parser.add_argument("--flood-connections", type=int, help="flood connections (default 20)")
    parser.add_argument("--duration-s", type=float, help="/health window per attack (10)")
    parser.add_argument("--header-mib", type=float, default=32.0, help="huge header size")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 reps, 20/5 conns, 3 s")
    parser.add_argument(
        "--nice", type=int, default=19, help="niceness of the attackers' process (0: none)"
    )
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--attack", choices=sorted(HEADS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe is not None:
        print(json.dumps(probe(args.probe, args.duration_s or 10.0)))
        return
    if args.attack is not None:
        if args.nice:
            os.nice(args.nice)
        asyncio.run(attack_process(args.port, args.attack, args.connections))
        return
    quick = {"repeats": 2, "connections": 20, "flood_connections": 5, "duration_s": 3.0}
    full = {"repeats": 5, "connections": 100, "flood_connections": 20, "duration_s": 10.0}
    for name, default in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    run_all(args)


if __name__ == "__main__":
    main()
