"""Process and measurement helpers shared by the gateway benchmarks (stdlib only)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

MODES = ("non-stream", "stream")
LOAD_SCRIPT = Path(__file__).resolve().parent / "gateway_overhead.py"


_failed = False


def _note_failure(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    global _failed
    _failed = True
    _excepthook(kind, value, tb)


_excepthook = sys.excepthook


def scratch_dir(prefix: str) -> Path:
    """A temporary folder for a run's configs and logs: removed when the process exits,
    kept (and its path printed) when it dies of an uncaught exception, for the logs."""
    if sys.excepthook is not _note_failure:
        sys.excepthook = _note_failure
    tmp = Path(tempfile.mkdtemp(prefix=prefix))

    def clean() -> None:
        if _failed:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(clean)
    return tmp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A child in its own session (so its whole group can be stopped), output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_ready(
    url: str, proc: subprocess.Popen[bytes], log: Path | None = None, timeout_s: float = 120.0
) -> None:
    """Poll ``url`` until it answers 200; a child that dies first is an error with its log."""

    def tail() -> str:
        return f"; log:\n{log.read_text()}" if log is not None else ""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args!r} exited with {proc.returncode} before {url} was up{tail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s{tail()}")


def measure(
    url: str, seconds: float, concurrency: int, cpu_pid: int | None = None
) -> dict[str, dict[str, float]]:
    """Closed-loop load on ``url`` in a separate process, streamed and not.

    With ``cpu_pid`` (and /proc, i.e. Linux), each mode also gets ``cpu_us_per_req``:
    the CPU time (user + system) that process and its children spent per answered
    request during the load.
    """
    out = {}
    for mode in MODES:
        cmd = [sys.executable, str(LOAD_SCRIPT), "--load", url, "--mode", mode,
               "--seconds", str(seconds), "--concurrency", str(concurrency)]  # fmt: skip
        cpu_before_s = process_tree_cpu_s(cpu_pid) if cpu_pid is not None else None
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
        if cpu_before_s is not None and cpu_pid is not None:
            cpu_after_s = process_tree_cpu_s(cpu_pid)
            num_requests = out[mode]["num_requests"]
            if cpu_after_s is not None and num_requests:
                out[mode]["cpu_us_per_req"] = 1e6 * (cpu_after_s - cpu_before_s) / num_requests
    return out


def process_tree_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` and its direct children, from /proc; None
    where /proc is missing (not Linux)."""
    proc = Path("/proc")
    if not (proc / str(pid) / "stat").exists():
        return None
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    total_s = 0.0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # the command name (field 2) may hold spaces: split after its closing parenthesis
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        this_pid, parent = int(stat.parent.name), int(fields[1])
        if this_pid == pid or parent == pid:
            total_s += (int(fields[11]) + int(fields[12])) * tick_s
    return total_s


def median_runs(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per mode and figure, the median over rounds."""
    return {
        mode: {key: statistics.median(r[mode][key] for r in runs) for key in runs[0][mode]}
        for mode in runs[0]
    }


@contextlib.contextmanager
def worktree(ref: str, prefix: str = "lr-bench-") -> Iterator[Path]:
    """``ref`` checked out (detached) in a temporary git worktree of this repository;
    yields its ``src``, for ``--baseline REF`` runs side by side with HEAD. Exits with
    git's message when ``ref`` cannot be checked out; removed on exit either way."""
    root = Path(__file__).resolve().parent.parent
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tree = tmp / "tree"
    made = subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", "-q", str(tree), ref],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(f"--baseline {ref}: git worktree add failed: {made.stderr.strip()}")
    try:
        yield tree / "src"
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
