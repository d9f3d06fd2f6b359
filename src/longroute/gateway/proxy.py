"""Forwarding with failover: one client request, one or more backend attempts.

An attempt may fail over to another backend only while no byte has reached
the client: on a connect error or timeout, a 5xx status, a refusal of the
gateway's credentials, or the backend breaking off before its first body byte.
Each failed backend joins the request's ``tried_endpoints`` and is never tried
again for it. Once bytes went out, nothing is replayed: a backend that dies
mid-stream ends the client's stream with an SSE error event. Every attempt runs
under the request's deadline, so nothing waits forever.

Failure accounting (the circuit breakers): a backend that cannot be reached is
charged at once. A failure after the request was sent (5xx, a dropped
connection, an empty stream) may be the request's own fault (a prompt the
engine cannot handle), so it is charged only if the same request then succeeds
on another backend; and a request that fails so on ``max_request_failures``
backends is answered with its error, not tried further. A poison request thus
costs at most that many attempts and never opens a breaker.

A backend declared ``scheduling_policy: priority`` gets an integer ``priority``
field (:mod:`longroute.gateway.priority`), computed at each attempt's dispatch:
the routing decision's priority (Chimera's ŷ) when it has one, else the
request's slack.

Each attempt is :func:`longroute.gateway.attempt.attempt` (the exchange, the
failure it may return, a whole answer's relay); a stream is relayed chunk by
chunk as it arrives by :mod:`longroute.gateway.stream_relay`, without parsing
or re-serialising it. Backends are reached through one keep-alive
:class:`~longroute.gateway.http.upstream.UpstreamPool` each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from longroute.gateway.admission import Admission, Grant, QueueFullError, QueueTimeoutError
from longroute.gateway.attempt import (
    BACKEND_ERRORS,
    MAX_WHOLE_RESPONSE_BYTES,
    Failure,
    Outcome,
    attempt,
)
from longroute.gateway.backends import Backend
from longroute.gateway.config import AdmissionConfig
from longroute.gateway.errors import (
    GatewayError,
    all_failed_error,
    no_candidate_error,
    overloaded_error,
    request_failed_error,
    timeout_error,
)
from longroute.gateway.health import HealthMonitor
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import HttpResponse
from longroute.gateway.http.upstream import UpstreamPool
from longroute.gateway.http.wire import RenderedHeaders
from longroute.gateway.intake import Job
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.observe import Tracing
from longroute.gateway.response_headers import backend_headers, with_prediction
from longroute.gateway.stream_relay import STALLED_CLIENT_GRACE_S
from longroute.routing.fleet_view import CandidatesExhaustedError, NoCandidateError
from longroute.types import Request

if TYPE_CHECKING:
    from longroute.gateway.engine_truth import EngineTruth
    from longroute.gateway.tuning import LiveTuning
    from longroute.gateway.wiring import Wiring

log = logging.getLogger("longroute.gateway")

# the helpers' old private names, for callers and tests that import them from here
_with_prediction = with_prediction
__all__ = [
    "BACKEND_ERRORS",
    "MAX_WHOLE_RESPONSE_BYTES",
    "STALLED_CLIENT_GRACE_S",
    "Proxy",
]


class Proxy:
    """Sends each job to backends granted by admission, failing over as the module says.

    Called by the completion handler, once per client request (:meth:`forward`).
    Reads the wiring in force (``wiring``: backends, admission limits, redactor,
    priorities) once per request; a reload replaces it and the pools
    (:meth:`set_backends`).
    """

    def __init__(
        self,
        wiring: Wiring,
        admission: Admission,
        health: HealthMonitor,
        metrics: GatewayMetrics,
        tracing: Tracing,
        *,
        keepalive_s: float,
    ) -> None:
        self.wiring = wiring
        self.admission = admission
        self.health = health
        self.metrics = metrics
        self.tracing = tracing
        self.tuning: LiveTuning | None = None  # set by the gateway when it tunes live
        self.engine_truth: EngineTruth | None = None  # set by the gateway (precise_prefix)
        self._keepalive_s = keepalive_s
        # per backend, read by each attempt: its pool, its answers' fixed headers
        self.pools: dict[str, UpstreamPool] = {}
        self.headers: dict[str, RenderedHeaders] = {}
        self.stream_headers: dict[str, RenderedHeaders] = {}
        self._urls: dict[str, tuple[object, ...]] = {}
        self._retiring: list[UpstreamPool] = []  # replaced pools, closed once idle
        self.set_backends(wiring.backends.values(), wiring.config.admission.connect_timeout_s)

    def set_backends(self, backends: Iterable[Backend], connect_timeout_s: float) -> list[str]:
        """The pools of ``backends``: kept for a backend whose URL, request headers and
        connect timeout did not change, new otherwise; a replaced pool serves its requests
        in flight to their end and closes once idle (:meth:`close_idle_retired`). Returns
        the names whose pool was replaced or removed."""
        retired = []
        wanted = {b.name: b for b in backends}
        for name in list(self.pools):
            backend = wanted.get(name)
            if backend is None or self._urls[name] != _pool_key(backend, connect_timeout_s):
                retired.append(name)
        retiring = {name: self.pools.pop(name) for name in retired}
        for name, backend in wanted.items():
            if name not in self.pools:
                self.pools[name] = UpstreamPool(
                    backend.base_url,
                    connect_timeout_s=connect_timeout_s,
                    keepalive_s=self._keepalive_s,
                    default_headers=backend.request_headers,
                )
                self._urls[name] = _pool_key(backend, connect_timeout_s)
            headers = backend_headers(backend)
            self.headers[name] = RenderedHeaders(headers)
            self.stream_headers[name] = RenderedHeaders({**headers, "Cache-Control": "no-cache"})
        self._retiring.extend(retiring.values())
        return retired

    def forget(self, name: str) -> None:
        """Drops what is kept for a backend that left, once its last request finished (its
        requests in flight still read its response headers)."""
        if name not in self.pools:
            self.headers.pop(name, None)
            self.stream_headers.pop(name, None)
            self._urls.pop(name, None)

    async def close_idle_retired(self) -> int:
        """Closes the replaced pools that carry no request any more; returns how many are
        still busy (called after a reload until it returns 0, and at shut-down)."""
        busy = []
        for pool in self._retiring:
            if pool.num_open - pool.num_idle > 0:
                busy.append(pool)
            else:
                await pool.close()
        self._retiring = busy
        return len(busy)

    def num_busy_connections(self, backend: str) -> int:
        """Connections to ``backend`` carrying a request now (open but not idle; O(1))."""
        pool = self.pools[backend]
        return pool.num_open - pool.num_idle

    async def close(self) -> None:
        """Called at shut-down: closes every pooled backend connection."""
        for pool in [*self.pools.values(), *self._retiring]:
            await pool.close()

    async def forward(self, stream: ResponseStream, job: Job) -> HttpResponse | None:
        """Serve ``job``: a whole response, or None when it was streamed through ``stream``.

        What happens goes into ``job.trace`` (the backend that answered, each failed
        attempt's reason, the first byte, the answer's last bytes). Raises GatewayError.
        """
        wiring = self.wiring
        config = wiring.config.admission
        request = job.request
        trace = job.trace
        failure: Failure | None = None
        suspects: list[str] = []  # backends that failed it after it was sent: not charged yet
        failed_by: dict[str, str] = {}  # what each suspect did (its last error, if charged)
        for attempt_index in range(config.max_retries + 1):
            if failure is not None:
                self.metrics.retries.inc()
                self.metrics.failovers.labels(failure.kind).inc()
            waited_since_s = time.monotonic()
            grant = self._grant_now(job, request, failure, config)
            if grant is None:  # it must wait for a slot
                grant = await self._acquire(job, request, failure, config, waited_since_s)
            backend = self._backend(grant.endpoint, wiring)
            trace.num_attempts += 1
            trace.endpoint = backend.name
            trace.served_model = backend.model
            trace.decision_s += grant.decision_s
            trace.scores = grant.decision.scores
            trace.granted_s = now_s = time.monotonic()
            self.tracing.granted(trace, waited_since_s, now_s)
            if self.tuning is not None:
                self.tuning.on_dispatch(grant.request, backend.name, now_s)
            outcome = Outcome()
            # as dispatched: with the routing decision's priority (sent to priority backends)
            result = await attempt(self, stream, job, grant, backend, outcome)
            if not isinstance(result, Failure):
                self.tracing.attempt_ended(trace, None)
                if outcome.is_answered:  # it was theirs: the request is fine elsewhere
                    for name in suspects:
                        self.health.record(name, False, detail=failed_by[name])
                return result
            failure = result
            trace.failovers += (result.kind,)
            self.tracing.attempt_ended(trace, result.kind)
            self.metrics.errors.labels(result.kind).inc()
            log.debug(
                "attempt %d of %s on %s failed: %s (%s)",
                attempt_index + 1,
                trace.request_id,
                backend.name,
                result.message,
                result.detail,
            )
            request = replace(
                request,
                attempt=request.attempt + 1,
                tried_endpoints=(*request.tried_endpoints, backend.name),
            )
            if not result.is_sent:
                self.health.record(backend.name, False, detail=result.message)
                continue
            suspects.append(backend.name)
            failed_by[backend.name] = result.message
            if len(suspects) >= config.max_request_failures:
                raise request_failed_error(tuple(suspects), failure.message)
        assert failure is not None
        raise all_failed_error(request.tried_endpoints, failure.message)

    def _backend(self, name: str, wiring: Wiring) -> Backend:
        """The granted backend as the wiring in force has it (a reload may have changed it
        while the request waited), else as the request's own wiring had it."""
        backend = self.wiring.backends.get(name)
        return backend if backend is not None else wiring.backends[name]

    def _grant_now(
        self, job: Job, request: Request, failure: Failure | None, config: AdmissionConfig
    ) -> Grant | None:
        """A slot now (no coroutine: the common case), or None when the request must wait
        (:meth:`_acquire`, in the same turn of the loop)."""
        if job.seconds_left() <= 0:
            raise timeout_error(job.trace.request_id)
        try:
            return self.admission.grant_now(request, request.tried_endpoints)
        except ADMISSION_ERRORS as exc:
            raise self._admission_error(exc, job, request, failure, config) from None

    async def _acquire(
        self,
        job: Job,
        request: Request,
        failure: Failure | None,
        config: AdmissionConfig,
        waited_since_s: float,
    ) -> Grant:
        seconds_left = job.seconds_left()
        if seconds_left <= 0:
            raise timeout_error(job.trace.request_id)
        try:
            return await self.admission.wait_for_grant(
                request,
                request.tried_endpoints,
                min(config.queue_timeout_s, seconds_left),
            )
        except ADMISSION_ERRORS as exc:
            error = self._admission_error(exc, job, request, failure, config)
            self.tracing.queue_left(job.trace, waited_since_s, time.monotonic(), error.kind)
            raise error from None
        except BaseException:  # the client left, or the drain's deadline cut the wait
            self.tracing.queue_left(job.trace, waited_since_s, time.monotonic(), "cancelled")
            raise

    def _admission_error(
        self,
        exc: Exception,
        job: Job,
        request: Request,
        failure: Failure | None,
        config: AdmissionConfig,
    ) -> GatewayError:
        """The client's error for admission's refusal ``exc``."""
        if isinstance(exc, CandidatesExhaustedError):
            # the client's x-longroute-tried names every model: a retry is futile
            return GatewayError(409, str(exc), kind="exhausted", code="all_models_tried")
        if isinstance(exc, NoCandidateError):
            if failure is not None:
                return all_failed_error(request.tried_endpoints, failure.message)
            causes = self.wiring.redactor.client_text(self.health.causes())
            return no_candidate_error(request, exc, self.wiring.backends, causes)
        if isinstance(exc, QueueFullError):
            return overloaded_error(429, "queue_full", str(exc), config.retry_after_s)
        if job.seconds_left() <= 0:  # a QueueTimeoutError at the request's own deadline
            return timeout_error(job.trace.request_id)
        return overloaded_error(503, "queue_timeout", str(exc), config.retry_after_s)


ADMISSION_ERRORS = (NoCandidateError, QueueFullError, QueueTimeoutError)
"""What admission refuses a request with (CandidatesExhaustedError is a NoCandidateError)."""


def _pool_key(backend: Backend, connect_timeout_s: float) -> tuple[object, ...]:
    """What a backend's pool is built from: a change means a new pool."""
    return (backend.base_url, tuple(backend.request_headers.items()), connect_timeout_s)
