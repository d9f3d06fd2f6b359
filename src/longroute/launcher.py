"""Starting and stopping local ``longroute`` processes (emulators, gateways) on loopback.

Used by ``longroute demo`` and by the end-to-end tests; called from the main
thread, outside any event loop (it blocks while it waits). Every process runs
``sys.executable -m longroute ARGS`` on a free port (``--port 0``; the URL is
read from the "listening on http://..." line it logs), in its own process
group, with stdout and stderr in ``<workdir>/<name>.log``. A process is ready
once that line appeared and ``GET <ready_path>`` answers 200.

Everything a :class:`Launcher` started is stopped (SIGTERM to its process
group, SIGKILL after ``stop_grace_s``) when the ``with`` block ends, whatever
ends it (an error, Ctrl-C), and by an ``atexit`` guard otherwise; on Linux the
children also get SIGTERM if the thread that started them dies
(``PR_SET_PDEATHSIG``), so even a SIGKILLed parent leaves none behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import yaml

_LISTENING = re.compile(rb"listening on (https?://[^\s]+)")
_POLL_S = 0.05
_PROBE_TIMEOUT_S = 2.0
_PR_SET_PDEATHSIG = 1
#: Log lines quoted in a start-up error.
LOG_TAIL_LINES = 20


class LaunchError(RuntimeError):
    """A process could not start: it exited, or was not ready by the deadline.

    The message names the process, says what happened and quotes its log tail.
    """


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """What to run: ``python -m longroute *args``, ready when ``GET ready_path`` is 200."""

    name: str
    args: tuple[str, ...]
    ready_path: str = "/health"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
            raise ValueError(
                f"process name {self.name!r} must be letters, digits, '_', '.' or '-' "
                "(it names the log file)"
            )
        if not self.ready_path.startswith("/"):
            raise ValueError(f"ready_path must start with '/', got {self.ready_path!r}")


def emulator_spec(
    name: str,
    *,
    profile: str,
    hardware: str = "h100",
    speed: float = 1.0,
    network_delay_ms: float = 0.0,
    extra_args: Sequence[str] = (),
) -> ProcessSpec:
    """A ``longroute emulate`` process on a free loopback port."""
    args = [
        *("emulate", "--profile", profile, "--hardware", hardware),
        *("--host", "127.0.0.1", "--port", "0", "--speed", repr(speed)),
        *("--network-delay-ms", repr(network_delay_ms), *extra_args),
    ]
    return ProcessSpec(name, tuple(args), "/health")


def gateway_spec(name: str, config_path: Path) -> ProcessSpec:
    """A ``longroute serve`` process on a free loopback port; ready when ``/ready`` is 200."""
    args = ("serve", "--config", str(config_path), "--host", "127.0.0.1", "--port", "0")
    return ProcessSpec(name, (*args, "--log-level", "info"), "/ready")


class Child:
    """One started process. ``url`` is set once it logged where it listens."""

    __slots__ = ("log_path", "popen", "spec", "url")

    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.spec = spec
        self.popen = popen
        self.log_path = log_path
        self.url: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        """Process id, also its process group id."""
        return self.popen.pid

    @property
    def is_running(self) -> bool:
        return self.popen.poll() is None

    @property
    def base_url(self) -> str:
        """The URL it listens on; ``LaunchError`` if it is not known (not started yet)."""
        if self.url is None:
            raise LaunchError(f"{self.name} has not said where it listens (not ready yet)")
        return self.url

    def log_tail(self, num_lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc.strerror})"
        return "\n".join(text.splitlines()[-num_lines:])


def _preexec(parent_pid: int) -> Callable[[], None] | None:
    """In the child (Linux): SIGTERM when the starting thread dies. Only from the main
    thread, since a worker thread ending would otherwise kill its children."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:  # loaded before forking: the child only calls it
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return set_death_signal


_LIVE: weakref.WeakSet[Launcher] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for launcher in list(_LIVE):
        launcher.close()


class Launcher:
    """Starts ``longroute`` processes and owns them until :meth:`close`.

    ``workdir`` holds the logs and config files; by default a fresh temporary
    folder, removed at close unless start-up failed or the block raised an error.
    Children are stopped in reverse start order. Not thread-safe.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        ready_timeout_s: float = 60.0,
        stop_grace_s: float = 5.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._is_own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="longroute-")) if workdir is None else workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.children: list[Child] = []
        self._is_failed = False
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        _LIVE.add(self)

    def __enter__(self) -> Launcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and issubclass(exc_type, Exception):
            self._is_failed = True  # keep the logs; not for Ctrl-C or SystemExit
        self.close()

    # ---- starting --------------------------------------------------------------
    def write_yaml(self, filename: str, data: Mapping[str, object]) -> Path:
        """Write ``data`` as YAML into the workdir (e.g. a gateway config); its path."""
        path = self.workdir / filename
        path.write_text(yaml.safe_dump(dict(data), sort_keys=False), encoding="utf-8")
        return path

    def spawn(self, spec: ProcessSpec) -> Child:
        """Start one process without waiting for it."""
        if any(c.name == spec.name for c in self.children):
            raise ValueError(f"a process named {spec.name!r} was already started here")
        log_path = self.workdir / f"{spec.name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "longroute", *spec.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # own process group: Ctrl-C reaches only us
                preexec_fn=_preexec(os.getpid()),  # only calls prctl
            )
        child = Child(spec, popen, log_path)
        self.children.append(child)
        return child

    def start(self, *specs: ProcessSpec) -> tuple[Child, ...]:
        """Start every process at once, then wait until all are ready (or raise LaunchError)."""
        children = tuple(self.spawn(spec) for spec in specs)
        self.wait_ready(children)
        return children

    def wait_ready(self, children: Sequence[Child]) -> None:
        """Block until each child listens and answers 200 on its ready path.

        Raises :class:`LaunchError` with the child's log tail when one exits
        first or the ``ready_timeout_s`` deadline passes.
        """
        deadline_s = time.monotonic() + self.ready_timeout_s
        pending = list(children)
        while pending:
            pending = [c for c in pending if not self._is_ready(c)]
            if not pending:
                return
            if time.monotonic() > deadline_s:
                self._is_failed = True
                child = pending[0]
                raise LaunchError(
                    f"{child.name} was not ready within {self.ready_timeout_s:g} s "
                    f"(waiting for {'its URL' if child.url is None else child.spec.ready_path}); "
                    f"log {child.log_path}:\n{child.log_tail()}"
                )
            time.sleep(_POLL_S)

    def _is_ready(self, child: Child) -> bool:
        code = child.popen.poll()
        if code is not None:
            self._is_failed = True
            raise LaunchError(
                f"{child.name} exited with status {code} while starting; "
                f"log {child.log_path}:\n{child.log_tail()}"
            )
        if child.url is None:
            match = _LISTENING.search(child.log_path.read_bytes())
            if match is None:
                return False
            child.url = match.group(1).decode()
        return self.get_status(child.url + child.spec.ready_path) == 200

    def get_status(self, url: str) -> int | None:
        """HTTP status of ``GET url`` (no proxy), None if nothing answered."""
        try:
            with self._opener.open(url, timeout=_PROBE_TIMEOUT_S) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ValueError):
            return None

    # ---- stopping --------------------------------------------------------------
    def kill(self, child: Child, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` to the child's process group now (a failure test); reaped at close."""
        if child.is_running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, sig)

    def stop(self, children: Sequence[Child]) -> None:
        """SIGTERM, then SIGKILL whatever still runs after ``stop_grace_s``; reaps them."""
        for child in reversed(children):
            self.kill(child, signal.SIGTERM)
        deadline_s = time.monotonic() + self.stop_grace_s
        for child in reversed(children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=max(0.0, deadline_s - time.monotonic()))
        for child in reversed(children):
            if child.is_running:
                self.kill(child, signal.SIGKILL)
                child.popen.wait()

    def close(self) -> None:
        """Stop every child (Ctrl-C cannot interrupt this; it takes at most the grace period)."""
        is_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if is_main else None
        try:
            self.stop(self.children)
        finally:
            if is_main:
                signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
            _LIVE.discard(self)
        if self._is_own_workdir and not self._is_failed:
            shutil.rmtree(self.workdir, ignore_errors=True)


__all__ = ["Child", "LaunchError", "Launcher", "ProcessSpec", "emulator_spec", "gateway_spec"]
