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

Nothing a backend says reaches the client unredacted: error bodies go through
:mod:`longroute.gateway.backend_errors`, 2xx bodies lose any quoted backend key.

Streams are relayed chunk by chunk as they arrive, without parsing or
re-serialising them. Backends are reached through one keep-alive
:class:`~longroute.gateway.http.upstream.UpstreamPool` each.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from longroute.gateway.admission import Admission, Grant, QueueFullError, QueueTimeoutError
from longroute.gateway.backend_errors import (
    CREDENTIAL_STATUSES,
    MAX_ERROR_BODY_BYTES,
    log_preview,
    relayed_client_error,
)
from longroute.gateway.backends import Backend
from longroute.gateway.config import AdmissionConfig
from longroute.gateway.deadline import Deadline
from longroute.gateway.errors import (
    GatewayError,
    all_failed_error,
    no_candidate_error,
    overloaded_error,
    request_failed_error,
    sse_error_event,
    timeout_error,
)
from longroute.gateway.health import HealthMonitor
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpResponse
from longroute.gateway.http.upstream import UpstreamError, UpstreamPool, UpstreamResponse
from longroute.gateway.http.wire import RenderedHeaders
from longroute.gateway.intake import Job
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.observe import RequestTrace, Tracing
from longroute.headers import (
    ENDPOINT_HEADER,
    MODEL_HEADER,
    PREDICTED_CACHED_HEADER,
    PREDICTED_TTFT_HEADER,
)
from longroute.routing.fleet_view import CandidatesExhaustedError, NoCandidateError
from longroute.types import Request

if TYPE_CHECKING:
    from longroute.gateway.engine_truth import EngineTruth
    from longroute.gateway.tuning import LiveTuning
    from longroute.gateway.wiring import Wiring

log = logging.getLogger("longroute.gateway")

BACKEND_ERRORS = (UpstreamError, TimeoutError, OSError)
# how long the error event of a broken stream may wait on a client that does not read
STALLED_CLIENT_GRACE_S = 1.0
MAX_WHOLE_RESPONSE_BYTES = 256 * 1024 * 1024
"""Largest non-streamed backend answer relayed (a backend cannot fill the gateway's memory)."""


@dataclass(frozen=True, slots=True)
class _Failure:
    """An attempt that failed before any byte reached the client: try another backend.

    ``message`` may be shown to the client (it names the backend and what
    happened, never the backend's own words); ``detail`` is for the log
    (redacted, one line). ``is_sent``: the request reached the backend, so the
    failure may be the request's fault (see the module doc).
    """

    kind: str
    message: str
    detail: str
    is_sent: bool


class _Outcome:
    """What one attempt did, for the accounting in its ``finally`` and in ``forward``.

    ``is_answered``: the backend gave a 2xx (its first byte, when streamed).
    """

    __slots__ = ("has_first_byte", "is_answered", "is_ok")

    def __init__(self) -> None:
        self.has_first_byte = False
        self.is_answered = False
        self.is_ok = False


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
        self._pools: dict[str, UpstreamPool] = {}
        self._headers: dict[str, RenderedHeaders] = {}
        self._stream_headers: dict[str, RenderedHeaders] = {}
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
        for name in list(self._pools):
            backend = wanted.get(name)
            if backend is None or self._urls[name] != _pool_key(backend, connect_timeout_s):
                retired.append(name)
        retiring = {name: self._pools.pop(name) for name in retired}
        for name, backend in wanted.items():
            if name not in self._pools:
                self._pools[name] = UpstreamPool(
                    backend.base_url,
                    connect_timeout_s=connect_timeout_s,
                    keepalive_s=self._keepalive_s,
                    default_headers=backend.request_headers,
                )
                self._urls[name] = _pool_key(backend, connect_timeout_s)
            headers = _backend_headers(backend)
            self._headers[name] = RenderedHeaders(headers)
            self._stream_headers[name] = RenderedHeaders({**headers, "Cache-Control": "no-cache"})
        self._retiring.extend(retiring.values())
        return retired

    def forget(self, name: str) -> None:
        """Drops what is kept for a backend that left, once its last request finished (its
        requests in flight still read its response headers)."""
        if name not in self._pools:
            self._headers.pop(name, None)
            self._stream_headers.pop(name, None)
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
        pool = self._pools[backend]
        return pool.num_open - pool.num_idle

    async def close(self) -> None:
        """Called at shut-down: closes every pooled backend connection."""
        for pool in [*self._pools.values(), *self._retiring]:
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
        failure: _Failure | None = None
        suspects: list[str] = []  # backends that failed it after it was sent: not charged yet
        failed_by: dict[str, str] = {}  # what each suspect did (its last error, if charged)
        for attempt_index in range(config.max_retries + 1):
            if failure is not None:
                self.metrics.retries.inc()
                self.metrics.failovers.labels(failure.kind).inc()
            waited_since_s = time.monotonic()
            grant = await self._acquire(job, request, failure, config)
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
            outcome = _Outcome()
            # as dispatched: with the routing decision's priority (sent to priority backends)
            result = await self._attempt(stream, job, grant, backend, outcome)
            if not isinstance(result, _Failure):
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

    async def _acquire(
        self, job: Job, request: Request, failure: _Failure | None, config: AdmissionConfig
    ) -> Grant:
        seconds_left = job.seconds_left()
        if seconds_left <= 0:
            raise timeout_error(job.trace.request_id)
        try:
            return await self.admission.acquire(
                request,
                request.tried_endpoints,
                min(config.queue_timeout_s, seconds_left),
            )
        except CandidatesExhaustedError as exc:
            # the client's x-longroute-tried names every model: a retry is futile
            raise GatewayError(409, str(exc), kind="exhausted", code="all_models_tried") from None
        except NoCandidateError as exc:
            if failure is not None:
                raise all_failed_error(request.tried_endpoints, failure.message) from None
            causes = self.wiring.redactor.client_text(self.health.causes())
            raise no_candidate_error(request, exc, self.wiring.backends, causes) from None
        except QueueFullError as exc:
            raise overloaded_error(429, "queue_full", str(exc), config.retry_after_s) from None
        except QueueTimeoutError as exc:
            if job.seconds_left() <= 0:
                raise timeout_error(job.trace.request_id) from None
            raise overloaded_error(503, "queue_timeout", str(exc), config.retry_after_s) from None

    async def _attempt(
        self,
        stream: ResponseStream,
        job: Job,
        grant: Grant,
        backend: Backend,
        outcome: _Outcome,
    ) -> HttpResponse | _Failure | None:
        """One try on ``backend``; always gives its slot back."""
        request = grant.request
        try:
            return await self._exchange(stream, job, grant, backend, outcome)
        finally:
            observed = None
            if outcome.is_ok:  # the engine's usage: what the router's hook learns from
                completion = job.trace.usage()
                if completion.source == "backend" and completion.completion_tokens is not None:
                    observed = completion.completion_tokens
            self.admission.finish(
                request,
                backend.name,
                has_first_byte=outcome.has_first_byte,
                is_ok=outcome.is_ok,
                observed_output_tokens=observed,
            )
            tuning = self.tuning
            if tuning is not None:
                trace = job.trace
                tuning.on_attempt(
                    request,
                    backend.name,
                    started_s=trace.started_s,
                    dispatched_s=trace.granted_s or trace.started_s,
                    first_byte_s=trace.first_byte_s if outcome.has_first_byte else None,
                    ended_s=time.monotonic(),
                )

    async def _exchange(
        self,
        stream: ResponseStream,
        job: Job,
        grant: Grant,
        backend: Backend,
        outcome: _Outcome,
    ) -> HttpResponse | _Failure | None:
        request = grant.request
        pool = self._pools[backend.name]
        # one timer bounds the exchange and the stream's relay: both end at the deadline
        deadline = Deadline(max(job.seconds_left(), 0.001))
        try:
            body = job.body_for(backend)
            truth = self.engine_truth
            if truth is not None:  # before dispatch: what its cache will serve
                await truth.settle(backend.name)
                job.trace.predicted_cached_tokens = truth.predicted_cached_tokens(
                    backend.name, request
                )
            priorities = self.wiring.priorities
            if priorities:  # backends that schedule by priority get one
                body = priorities.body(body, request, backend.name)
            lines = self.tracing.attempt(job.trace)
            response = await pool.request("POST", job.route, body, head_lines=lines)
            try:
                status = response.status
                result: HttpResponse | _Failure | None = None  # None: relay the stream
                if status >= 500 or status in CREDENTIAL_STATUSES:
                    result = await self._answered_failure(backend, response)
                elif job.parsed.is_stream and status == 200:
                    chunk = await response.next_chunk()
                    if not chunk:
                        result = _Failure(
                            "backend_empty",
                            f"backend {backend.name} ended the stream before any byte",
                            "",
                            is_sent=True,
                        )
                else:
                    result = await self._relay_whole(job, grant, backend, response, outcome)
            except BaseException:
                response.release()  # an unfinished response closes its connection
                raise
        except BaseException as exc:
            timeout = deadline.exit(exc)
            if timeout is not None:
                return self._backend_failed(job, backend, timeout)
            if isinstance(exc, BACKEND_ERRORS):
                return self._backend_failed(job, backend, exc)
            raise
        if result is not None:
            deadline.exit(None)
            return result
        try:
            await self._relay_stream(
                stream, job, grant, backend, response, chunk, outcome, deadline
            )
        finally:
            response.release()
        return None

    async def _answered_failure(self, backend: Backend, response: UpstreamResponse) -> _Failure:
        """A 5xx or a refusal of the gateway's credentials: the client never sees its body."""
        status = response.status
        try:
            detail = log_preview(await response.read(MAX_ERROR_BODY_BYTES), self.wiring.redactor)
        except UpstreamError:
            detail = "(body unreadable)"
        if status in CREDENTIAL_STATUSES:
            message = f"backend {backend.name} refused the gateway's credentials (HTTP {status})"
            return _Failure("backend_auth", message, detail, is_sent=True)
        message = f"backend {backend.name} answered HTTP {status}"
        return _Failure("backend_5xx", message, detail, is_sent=True)

    def _backend_failed(self, job: Job, backend: Backend, exc: BaseException) -> _Failure:
        if job.seconds_left() <= 0:
            raise timeout_error(job.trace.request_id)
        detail = self.wiring.redactor.text(f"{type(exc).__name__}: {exc}", 500)
        if isinstance(exc, UpstreamError) and exc.kind == "connect":
            message = f"backend {backend.name} could not be reached"
            return _Failure("backend_connect", message, detail, is_sent=False)
        message = f"backend {backend.name} broke off before answering"
        return _Failure("backend_disconnect", message, detail, is_sent=True)

    async def _relay_whole(
        self,
        job: Job,
        grant: Grant,
        backend: Backend,
        response: UpstreamResponse,
        outcome: _Outcome,
    ) -> HttpResponse:
        status = response.status
        redactor = self.wiring.redactor
        if status >= 400:  # the request's own fault (5xx and 401/403/407 failed over before)
            data = await response.read(MAX_ERROR_BODY_BYTES)
            body = relayed_client_error(status, data, redactor, backend.name)
            content_type = JSON_TYPE
        else:
            body = redactor.body(await response.read(MAX_WHOLE_RESPONSE_BYTES))
            content_type = response.content_type
            job.trace.keep_body(body)
        self.health.record(backend.name, True)
        outcome.is_ok = outcome.is_answered = status < 400
        headers = _with_prediction(self._headers[backend.name], grant, job.trace)
        return HttpResponse(status, body, content_type, headers)

    async def _relay_stream(
        self,
        stream: ResponseStream,
        job: Job,
        grant: Grant,
        backend: Backend,
        response: UpstreamResponse,
        chunk: bytes,
        outcome: _Outcome,
        deadline: Deadline,
    ) -> None:
        """Bytes reached us: from here on nothing is replayed, whatever happens.

        ``deadline`` (armed by the caller, exited here) bounds both a silent backend and
        a client that stopped reading. The head goes out with the first chunk, and the
        terminator with the chunk that ends the backend's answer (one write each)."""
        outcome.has_first_byte = outcome.is_answered = True
        self.admission.first_byte(grant.request, backend.name)
        trace = job.trace
        trace.first_byte_s = now_s = time.monotonic()
        self.metrics.observe_ttft(backend.model, backend.name, now_s - job.started_s)
        headers = _with_prediction(self._stream_headers[backend.name], grant, trace)
        redactor = self.wiring.redactor
        last = b""
        num_events = 0
        try:
            try:
                is_last = response.is_drained
                stream.start(
                    200,
                    headers,
                    response.content_type,
                    first=redactor.body(chunk),
                    is_last=is_last,
                )
                while True:
                    num_events += chunk.count(b"data:")
                    trace.prev = last
                    last = chunk
                    if is_last:
                        break
                    await stream.drain()
                    chunk = await response.next_chunk()
                    if not chunk:
                        break
                    is_last = response.is_drained
                    await stream.write(redactor.body(chunk), is_last=is_last)
            except BaseException as exc:
                timeout = deadline.exit(exc)
                if timeout is not None:
                    raise timeout from exc
                raise
            deadline.exit(None)
            await stream.end()
            self.health.record(backend.name, True)
            outcome.is_ok = True
        except (UpstreamError, TimeoutError) as exc:
            await self._end_broken_stream(stream, job, backend, exc)
        finally:
            trace.last = last
            trace.num_events = num_events

    async def _end_broken_stream(
        self, stream: ResponseStream, job: Job, backend: Backend, exc: BaseException
    ) -> None:
        """The backend failed after bytes reached the client: say so, close, never replay."""
        if job.seconds_left() <= 0:
            kind, message = "timeout", "the request timed out mid-stream"
        else:
            kind, message = "midstream", f"backend {backend.name} failed mid-stream"
            self.health.record(backend.name, False, detail=message)
        self.metrics.errors.labels(kind).inc()
        job.trace.error_kind = kind
        detail = self.wiring.redactor.text(f"{type(exc).__name__}: {exc}", 500)
        log.warning("%s: %s (%s)", job.trace.request_id, message, detail)
        try:  # a client that does not read gets its connection closed instead
            async with asyncio.timeout(STALLED_CLIENT_GRACE_S):
                await stream.write(b"\n\n" + sse_error_event(message, kind))
                await stream.end()
        except (TimeoutError, ConnectionResetError):
            if isinstance(exc, TimeoutError):
                self.metrics.errors.labels("client_stalled").inc()
            stream.abort()


def _pool_key(backend: Backend, connect_timeout_s: float) -> tuple[object, ...]:
    """What a backend's pool is built from: a change means a new pool."""
    return (backend.base_url, tuple(backend.request_headers.items()), connect_timeout_s)


def _backend_headers(backend: Backend) -> dict[str, str]:
    return {ENDPOINT_HEADER: backend.name, MODEL_HEADER: backend.model}


def _with_prediction(
    headers: RenderedHeaders, grant: Grant, trace: RequestTrace
) -> Mapping[str, str]:
    """A backend's fixed response headers, plus the router's predicted TTFT (integer ms)
    when it made one for the backend it was sent to, and the cached tokens engine truth
    predicted for it (precise backends only).

    ``headers`` itself (no copy) when it did not: a router that predicts nothing, or
    admission sent the request elsewhere than the router chose (that one was full), so
    the prediction is another backend's.
    """
    decision = grant.decision
    predicted_s = decision.predicted_ttft_s
    cached = trace.predicted_cached_tokens
    if predicted_s is None or decision.endpoint != grant.endpoint or not math.isfinite(predicted_s):
        if cached is None:
            return headers
        return {**headers, PREDICTED_CACHED_HEADER: str(cached)}
    extra = {PREDICTED_TTFT_HEADER: str(round(predicted_s * 1000.0))}
    if cached is not None:
        extra[PREDICTED_CACHED_HEADER] = str(cached)
    return {**headers, **extra}
