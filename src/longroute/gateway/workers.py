"""``longroute serve --workers N``: N gateway processes on one port, and their parent.

Each worker is a whole ``longroute serve`` process (``--worker-index i``) that listens
on the same host and port with ``SO_REUSEPORT``; the kernel spreads new connections
over them. Each keeps its own state (prefix index, in-flight counters, subscriptions);
with ``load_source: engine`` they all route on the engines' global load.

The parent (:class:`Supervisor`) listens on nothing. It reserves the port first (a
socket bound with ``SO_REUSEPORT`` and never listening, so it gets no connection;
with ``--port 0`` that picks the port every worker then takes), starts the workers
in sessions of their own (a terminal's Ctrl-C reaches them once, through the
parent), forwards SIGTERM and SIGINT (drain; a second one cuts the drain short) and
SIGHUP (reload) to each, and restarts a worker that exits while no stop was asked,
after a back-off that doubles with each quick failure (``RESTART_BACKOFF_S`` up to
``MAX_RESTART_BACKOFF_S``; a worker that lived ``STABLE_AFTER_S`` starts over). It
exits 0 once every worker ended with 0 after a stop, else 1. On Linux each worker
gets SIGTERM if the parent dies (``PR_SET_PDEATHSIG``), so none is left behind.

Metrics: a Prometheus scrape of the shared port lands on a random worker, so
``--metrics-port-base B`` gives worker ``i`` an ops port ``B + i`` of its own
(``/metrics``, ``/health``, ``/ready``, ``/admin/*``; ``B = 0``: any free ports,
logged), to be scraped as N targets; every response carries ``x-longroute-worker``.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from longroute.clock import WallClock
from longroute.gateway.config import GatewayConfig
from longroute.gateway.secrets import GatewaySecrets

log = logging.getLogger("longroute.gateway.workers")

MAX_WORKERS_PER_CORE = 4
RESTART_BACKOFF_S = 0.5
MAX_RESTART_BACKOFF_S = 30.0
STABLE_AFTER_S = 30.0
MAX_SLEEP_S = 1.0
"""The longest the parent sleeps without looking at its workers (a safety net: a worker's
exit and every signal wake it at once)."""
_PR_SET_PDEATHSIG = 1
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def check_num_workers(num_workers: int, num_cores: int | None = None) -> None:
    """ValueError unless 1 <= ``num_workers`` <= cores x MAX_WORKERS_PER_CORE."""
    cores = num_cores if num_cores is not None else (os.cpu_count() or 1)
    limit = cores * MAX_WORKERS_PER_CORE
    if not 1 <= num_workers <= limit:
        raise ValueError(
            f"--workers must be between 1 and {limit} ({MAX_WORKERS_PER_CORE} per core on "
            f"this machine's {cores}), got {num_workers}"
        )


def check_wiring(config: GatewayConfig, secrets: GatewaySecrets) -> None:
    """Builds ``config``'s wiring once and drops it: the errors a worker would meet at
    start (ConfigError, RegistryError, ValueError), met by the parent before any starts.
    Opens no file and starts no thread (no access log, no tracer)."""
    from longroute.gateway.metrics import GatewayMetrics
    from longroute.gateway.wiring import Wiring

    Wiring(config, secrets, GatewayMetrics(None, lambda: 0), WallClock(), itertools.count(1))


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT that never listens: it holds the
    port (port 0: picks one) for the workers, who bind it too. OSError if it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def backoff_s(num_quick_failures: int) -> float:
    """Seconds before a restart after ``num_quick_failures`` quick exits in a row (>= 1)."""
    return min(MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S * 2.0 ** (num_quick_failures - 1))


@dataclass(slots=True)
class _Worker:
    """The parent's record of one worker slot (mutable: only the Supervisor changes it)."""

    index: int
    process: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0
    num_quick_failures: int = 0
    restart_at_s: float | None = None
    exit_code: int | None = None


class Supervisor:
    """Runs ``num_workers`` processes ``argv_for(i)`` until a stop signal drained them all.

    Call :meth:`run` from the main thread (it installs signal handlers). It sleeps until
    a signal arrives (SIGCHLD when a worker exits, or one it forwards: the handlers write
    to a wake-up pipe, ``signal.set_wakeup_fd``) or a restart is due, and looks at its
    children at least every ``MAX_SLEEP_S``: an idle parent wakes about once a second,
    where a 50 ms poll cost some 3 ms of CPU a second. O(workers) per wake-up.
    """

    def __init__(self, argv_for: Callable[[int], Sequence[str]], num_workers: int) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._argv_for = argv_for
        self.workers = [_Worker(i) for i in range(num_workers)]
        self.is_stopping = False
        self._signals: list[int] = []

    def run(self) -> int:
        """Starts every worker and supervises them; returns the parent's exit status."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        previous = {s: signal.signal(s, self._on_signal) for s in _FORWARDED}
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, _on_child)
        try:
            for worker in self.workers:
                self._start(worker)
            while not (self.is_stopping and self._all_exited()):
                self._handle_signals()
                self._reap()
                self._restart_due()
                if self.is_stopping and self._all_exited():
                    break
                # a signal between the checks above and here is in the pipe already
                select.select([wake_r], [], [], self._sleep_s())
                _drain(wake_r)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(wake_r)
            os.close(wake_w)
            self._kill_leftovers()
        codes = [w.exit_code for w in self.workers]
        if all(code == 0 for code in codes):
            log.info("all %d workers drained; exiting", len(self.workers))
            return 0
        log.error("workers ended with exit codes %s", codes)
        return 1

    def _sleep_s(self) -> float:
        """Until the next restart is due, at most MAX_SLEEP_S."""
        due = [w.restart_at_s for w in self.workers if w.restart_at_s is not None]
        if not due:
            return MAX_SLEEP_S
        return min(MAX_SLEEP_S, max(0.0, min(due) - time.monotonic()))

    def _on_signal(self, signum: int, _: object) -> None:
        self._signals.append(signum)  # acted on by the loop, outside the handler

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            name = signal.Signals(signum).name
            if signum != signal.SIGHUP:
                if not self.is_stopping:
                    log.info("%s: draining %d workers", name, len(self.workers))
                self.is_stopping = True
                for worker in self.workers:
                    worker.restart_at_s = None
            else:
                log.info("SIGHUP: every worker reloads its config")
            for worker in self.workers:
                if worker.process is not None and worker.process.poll() is None:
                    worker.process.send_signal(signum)

    def _start(self, worker: _Worker) -> None:
        worker.process = subprocess.Popen(
            list(self._argv_for(worker.index)),
            start_new_session=True,  # signals reach it through the parent only
            preexec_fn=_die_with_parent(os.getpid()),
        )
        worker.started_s = time.monotonic()
        worker.restart_at_s = None
        worker.exit_code = None
        log.info("worker %d started (pid %d)", worker.index, worker.process.pid)

    def _reap(self) -> None:
        now_s = time.monotonic()
        for worker in self.workers:
            process = worker.process
            if process is None or (code := process.poll()) is None:
                continue
            worker.process = None
            worker.exit_code = code
            if self.is_stopping:
                log.info("worker %d (pid %d) exited with %d", worker.index, process.pid, code)
                continue
            lived_s = now_s - worker.started_s
            quick = lived_s < STABLE_AFTER_S
            worker.num_quick_failures = worker.num_quick_failures + 1 if quick else 1
            delay_s = backoff_s(worker.num_quick_failures)
            worker.restart_at_s = now_s + delay_s
            log.warning(
                "worker %d (pid %d) exited with %d after %.1f s; restarting it in %.1f s",
                worker.index, process.pid, code, lived_s, delay_s,
            )  # fmt: skip

    def _restart_due(self) -> None:
        now_s = time.monotonic()
        for worker in self.workers:
            if worker.restart_at_s is not None and now_s >= worker.restart_at_s:
                self._start(worker)

    def _all_exited(self) -> bool:
        return all(w.process is None for w in self.workers)

    def _kill_leftovers(self) -> None:
        """Workers still running when the parent leaves abnormally (an exception)."""
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()


def _on_child(signum: int, frame: object) -> None:
    """SIGCHLD's handler: nothing; that it runs writes the wake-up pipe."""


def _drain(fd: int) -> None:
    """Empties the non-blocking wake-up pipe."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A pre-exec hook: SIGTERM the child when the parent dies (Linux), else None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


__all__ = [
    "MAX_WORKERS_PER_CORE",
    "Supervisor",
    "backoff_s",
    "check_num_workers",
    "check_wiring",
    "reserve_port",
]
