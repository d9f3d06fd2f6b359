"""Backend health: a circuit breaker per backend, fed by health checks and by traffic.

Breaker states: **closed** (serving) -> **open** after ``failure_threshold``
consecutive failures (out of the fleet) -> **half-open** after ``open_s``, when
the health checker sends one probe -> closed on success, open again on
failure. Live traffic reaches closed backends only; its failures and
successes count while closed (passive checks), the probes always count.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Mapping
from enum import StrEnum

import aiohttp

from longroute.clock import Clock
from longroute.gateway.backends import Backend
from longroute.gateway.config import HealthConfig

log = logging.getLogger("longroute.gateway")

PROBE_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)
MAX_CAUSE_CHARS = 200


def probe_error_kind(exc: BaseException) -> str:
    """``ClientConnectorError (ECONNREFUSED: Connection refused)``: the exception's type and
    the OS reason from its errno, never its text: aiohttp's and asyncio's messages name the
    address ("Connect call failed ('10.0.0.5', 8000)", "... ssl:default [...]"), which a
    client must not see and which says nothing the backend's name does not."""
    os_error = getattr(exc, "os_error", None)
    if os_error is None and isinstance(exc, OSError):
        os_error = exc
    number = getattr(os_error, "errno", None)
    if not isinstance(number, int):
        return type(exc).__name__
    name = errno.errorcode.get(number)
    try:
        reason = os.strerror(number) if number > 0 else None
    except ValueError:
        reason = None
    if name is None and reason is None:
        return type(exc).__name__
    return f"{type(exc).__name__} ({': '.join(x for x in (name, reason) if x)})"


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """One backend's breaker; pure state, time passed in. All methods O(1)."""

    __slots__ = ("failure_threshold", "num_consecutive_failures", "open_s", "opened_at_s", "state")

    def __init__(self, failure_threshold: int, open_s: float) -> None:
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.state = BreakerState.CLOSED
        self.num_consecutive_failures = 0
        self.opened_at_s: float | None = None

    @property
    def is_closed(self) -> bool:
        return self.state is BreakerState.CLOSED

    def record(self, is_ok: bool, now_s: float, *, is_probe: bool) -> bool:
        """Fold in one outcome; True if the breaker closed or opened because of it."""
        if not is_probe and self.state is not BreakerState.CLOSED:
            return False  # stragglers from before it opened say nothing new
        was_closed = self.state is BreakerState.CLOSED
        if is_ok:
            self.num_consecutive_failures = 0
            self.state = BreakerState.CLOSED
            self.opened_at_s = None
        else:
            self.num_consecutive_failures += 1
            if not was_closed or self.num_consecutive_failures >= self.failure_threshold:
                self.state = BreakerState.OPEN
                self.opened_at_s = now_s
        return was_closed != (self.state is BreakerState.CLOSED)

    def seconds_until_probe(self, now_s: float) -> float:
        """0 when a probe is due now (closed, half-open, or open for ``open_s``)."""
        if self.state is not BreakerState.OPEN or self.opened_at_s is None:
            return 0.0
        return max(0.0, self.opened_at_s + self.open_s - now_s)

    def begin_probe(self, now_s: float) -> None:
        """An open breaker whose wait is over lets one probe through."""
        if self.state is BreakerState.OPEN and self.seconds_until_probe(now_s) == 0.0:
            self.state = BreakerState.HALF_OPEN


class ReachabilityLog:
    """Logs what a monitor saw of a backend once per change, not per attempt: ``ok``,
    ``unreachable`` (no HTTP answer: a connection error or a timeout) or a problem with an
    answer it got (``detail`` says which: an HTTP status, metrics it cannot read)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._states: dict[str, str] = {}

    def update(
        self, name: str, is_ok: bool, detail: str = "", *, is_answered: bool = False
    ) -> None:
        """``is_answered``: the backend answered, but not as the monitor needs."""
        state = "ok" if is_ok else ("answered:" + detail if is_answered else "unreachable")
        previous = self._states.get(name, "ok")
        self._states[name] = state
        if previous == state:
            return
        if is_ok:
            log.info("%s: backend %s answers again", self.what, name)
        elif is_answered:
            log.warning("%s: backend %s answers, but %s", self.what, name, detail)
        else:
            log.warning("%s: backend %s unreachable: %s", self.what, name, detail)

    def forget(self, name: str) -> None:
        """``name`` left the fleet (a reload removed it)."""
        self._states.pop(name, None)


class HealthMonitor:
    """Runs the health checks and owns the breakers.

    ``on_change(name, is_healthy)`` is called on every open/close transition
    (the gateway updates the FleetView and wakes the admission queue).
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        config: HealthConfig,
        clock: Clock,
        on_change: Callable[[str, bool], None],
    ) -> None:
        self.backends = backends
        self.config = config
        self.breakers = {
            name: CircuitBreaker(config.failure_threshold, config.open_s) for name in backends
        }
        # backends that answered at least once (a probe or a request): until then a
        # closed breaker only means "no failure yet", not "healthy", so /ready waits
        self.confirmed: set[str] = set()
        # the last failure per backend ("HTTP 502", "ClientConnectorError: ..."), for
        # /ready and for the 503 a request gets when no backend is healthy
        self.last_errors: dict[str, str] = {}
        self._clock = clock
        self._on_change = on_change
        self._watchers: dict[str, tuple[Backend, asyncio.Task[None]]] = {}
        self._changed = asyncio.Event()

    def set_backends(self, backends: Mapping[str, Backend], config: HealthConfig) -> None:
        """A reload: the backends and thresholds in force from now on. A backend that stays
        keeps its breaker and verdict, unless its URL changed (then it starts over, unprobed);
        one that left is no longer watched, and :meth:`forget` drops it once its requests in
        flight finished (their outcomes are ignored meanwhile)."""
        for name, backend in backends.items():
            old = self.backends.get(name)
            breaker = self.breakers.get(name)
            if breaker is None or old is None or old.health_url != backend.health_url:
                self.breakers[name] = CircuitBreaker(config.failure_threshold, config.open_s)
                self.confirmed.discard(name)
                self.last_errors.pop(name, None)
            else:
                breaker.failure_threshold = config.failure_threshold
                breaker.open_s = config.open_s
        self.backends = backends
        self.config = config
        self._changed.set()  # run() restarts the watchers that changed

    def forget(self, name: str) -> None:
        """Drops a backend that left the fleet."""
        if name not in self.backends:
            self.breakers.pop(name, None)
            self.confirmed.discard(name)
            self.last_errors.pop(name, None)

    def is_ready(self, name: str) -> bool:
        """The one health verdict that ``/ready``, ``longroute_backend_healthy`` and the
        admin view show: the backend answered at least once and its breaker is closed.
        (Routing is more hopeful: a closed breaker is enough, so the first requests need
        not wait for the first probe.)"""
        breaker = self.breakers.get(name)
        return breaker is not None and breaker.is_closed and name in self.confirmed

    def ready_backends(self) -> list[str]:
        """Backends that answered and whose breaker is closed (:meth:`is_ready`)."""
        return [name for name in self.backends if self.is_ready(name)]

    def causes(self) -> str:
        """``a: HTTP 503; b: not probed yet`` over every backend that is not ready."""
        out = []
        for name in self.backends:
            breaker = self.breakers[name]
            if breaker.is_closed and name in self.confirmed:
                continue
            cause = self.last_errors.get(name)
            if cause is None:
                cause = "not probed yet" if breaker.is_closed else "circuit open"
            out.append(f"{name}: {cause}")
        return "; ".join(out)

    def record(
        self, name: str, is_ok: bool, *, is_probe: bool = False, detail: str | None = None
    ) -> None:
        """An outcome for ``name``: a probe, or a request's (passive check); ``detail`` says
        what failed (kept as the backend's last error)."""
        if name not in self.backends:
            return  # it left the fleet (a reload) while this was in flight
        breaker = self.breakers[name]
        if (  # the common case, an answer from a healthy backend: nothing changes
            is_ok
            and breaker.num_consecutive_failures == 0
            and breaker.state is BreakerState.CLOSED
            and name in self.confirmed
            and name not in self.last_errors
        ):
            return
        if is_ok:
            self.confirmed.add(name)
            self.last_errors.pop(name, None)
        elif detail is not None:
            self.last_errors[name] = detail[:MAX_CAUSE_CHARS]
        if breaker.record(is_ok, self._clock.now_s(), is_probe=is_probe):
            if breaker.is_closed:
                log.info("backend %s healthy again: circuit closed", name)
            else:
                log.warning(
                    "backend %s unhealthy: circuit open after %d consecutive failure(s)",
                    name,
                    breaker.num_consecutive_failures,
                )
            self._on_change(name, breaker.is_closed)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Check every backend forever, one watcher task each (restarted for a backend a
        reload changed); cancelled at shutdown."""
        watchers = self._watchers
        try:
            while True:
                self._changed.clear()
                for name, (backend, task) in list(watchers.items()):
                    if self.backends.get(name) != backend:
                        task.cancel()
                        del watchers[name]
                for name, backend in self.backends.items():
                    if name not in watchers:
                        task = asyncio.create_task(self._watch(session, backend))
                        watchers[name] = (backend, task)
                await self._changed.wait()
        finally:
            for _, task in watchers.values():
                task.cancel()
            await asyncio.gather(*(t for _, t in watchers.values()), return_exceptions=True)
            watchers.clear()

    async def _watch(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        while True:
            breaker = self.breakers[backend.name]  # a reload may change the thresholds
            interval_s = self.config.interval_s
            wait_s = breaker.seconds_until_probe(self._clock.now_s())
            if wait_s > 0.0:
                await asyncio.sleep(min(wait_s, interval_s))
                continue
            breaker.begin_probe(self._clock.now_s())
            try:
                failure = await self._probe(session, backend)
                self.record(backend.name, failure is None, is_probe=True, detail=failure)
            except Exception:  # a bug here must not stop health checking
                log.exception("health check of backend %s failed unexpectedly", backend.name)
            await asyncio.sleep(interval_s)

    async def _probe(self, session: aiohttp.ClientSession, backend: Backend) -> str | None:
        """None when the backend's health path answered 200, else what went wrong (no
        backend text and no address: the status, or the exception's type and OS reason)."""
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        try:
            async with session.get(
                backend.health_url, headers=backend.probe_headers, timeout=timeout
            ) as response:
                await response.read()
                if response.status == 200:
                    return None
                return f"health check answered HTTP {response.status}"
        except TimeoutError:
            return f"health check timed out after {self.config.timeout_s:g} s"
        except PROBE_ERRORS as exc:
            return f"health check failed: {probe_error_kind(exc)}"
