"""Forwarding with failover: one client request, one or more backend attempts.

An attempt may fail over to another backend only while no byte has reached
the client: on a connect error or timeout, a 5xx status, or the backend
breaking off before its first body byte. Each failed backend joins the
request's ``tried_endpoints`` and is never tried again for it. Once bytes
went out, nothing is replayed: a backend that dies mid-stream ends the
client's stream with an SSE error event. Every attempt runs under the
request's deadline, so nothing waits forever.

Streams are relayed chunk by chunk as they arrive, without parsing or
re-serialising them. Backends are reached through one keep-alive
:class:`~longroute.gateway.upstream.UpstreamPool` each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from longroute.gateway.admission import Admission, Grant, QueueFullError, QueueTimeoutError
from longroute.gateway.backends import Backend
from longroute.gateway.config import AdmissionConfig
from longroute.gateway.errors import (
    SERVER_ERROR,
    GatewayError,
    all_failed_error,
    overloaded_error,
    sse_error_event,
    timeout_error,
)
from longroute.gateway.health import HealthMonitor
from longroute.gateway.http_server import ResponseStream
from longroute.gateway.http_types import HttpResponse
from longroute.gateway.intake import Job
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.upstream import UpstreamError, UpstreamPool, UpstreamResponse
from longroute.headers import ENDPOINT_HEADER, MODEL_HEADER
from longroute.routing.fleet_view import AUTO_MODEL, CandidatesExhaustedError, NoCandidateError
from longroute.types import Request

log = logging.getLogger("longroute.gateway")

BACKEND_ERRORS = (UpstreamError, TimeoutError, OSError)
MAX_ERROR_DETAIL_CHARS = 300
# how long the error event of a broken stream may wait on a client that does not read
STALLED_CLIENT_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class _Failure:
    """An attempt that failed before any byte reached the client: try another backend."""

    kind: str
    message: str


class _Outcome:
    """What one attempt did, for the accounting in its ``finally``."""

    __slots__ = ("has_first_byte", "is_ok")

    def __init__(self) -> None:
        self.has_first_byte = False
        self.is_ok = False


class Proxy:
    """Sends each job to backends granted by admission, failing over as the module says.

    Called by the completion handler, once per client request (:meth:`forward`).
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        admission: Admission,
        health: HealthMonitor,
        metrics: GatewayMetrics,
        config: AdmissionConfig,
        *,
        keepalive_s: float,
    ) -> None:
        self.backends = backends
        self.admission = admission
        self.health = health
        self.metrics = metrics
        self.config = config
        self._pools = {
            name: UpstreamPool(
                b.base_url,
                connect_timeout_s=config.connect_timeout_s,
                keepalive_s=keepalive_s,
                default_headers=b.request_headers,
            )
            for name, b in backends.items()
        }
        self._headers = {name: _backend_headers(b) for name, b in backends.items()}
        self._stream_headers = {
            name: {**h, "Cache-Control": "no-cache"} for name, h in self._headers.items()
        }

    async def close(self) -> None:
        """Called at shut-down: closes every pooled backend connection."""
        for pool in self._pools.values():
            await pool.close()

    async def forward(self, stream: ResponseStream, job: Job) -> tuple[HttpResponse | None, str]:
        """Serve ``job``: a whole response, or None when it was streamed through ``stream``.

        Returns the backend that answered too. Raises GatewayError.
        """
        request = job.request
        failure: _Failure | None = None
        for attempt_index in range(self.config.max_retries + 1):
            if failure is not None:
                self.metrics.retries.inc()
            grant = await self._acquire(job, request, failure)
            backend = self.backends[grant.endpoint]
            result = await self._attempt(stream, job, request, backend)
            if not isinstance(result, _Failure):
                return result, backend.name
            failure = result
            self.metrics.errors.labels(result.kind).inc()
            log.debug(
                "attempt %d of %s on %s failed: %s",
                attempt_index + 1,
                request.request_id,
                backend.name,
                result.message,
            )
            request = replace(
                request,
                attempt=request.attempt + 1,
                tried_endpoints=(*request.tried_endpoints, backend.name),
            )
        assert failure is not None
        raise all_failed_error(request.tried_endpoints, failure.message)

    async def _acquire(self, job: Job, request: Request, failure: _Failure | None) -> Grant:
        seconds_left = job.seconds_left()
        if seconds_left <= 0:
            raise timeout_error(job.request.request_id)
        try:
            return await self.admission.acquire(
                request,
                request.tried_endpoints,
                min(self.config.queue_timeout_s, seconds_left),
            )
        except CandidatesExhaustedError as exc:
            # the client's x-longroute-tried names every model: a retry is futile
            raise GatewayError(409, str(exc), kind="exhausted", code="all_models_tried") from None
        except NoCandidateError as exc:
            if failure is not None:
                raise all_failed_error(request.tried_endpoints, failure.message) from None
            raise self._no_candidate(request, exc) from None
        except QueueFullError as exc:
            raise overloaded_error(429, "queue_full", str(exc), self.config.retry_after_s) from None
        except QueueTimeoutError as exc:
            if job.seconds_left() <= 0:
                raise timeout_error(request.request_id) from None
            raise overloaded_error(
                503, "queue_timeout", str(exc), self.config.retry_after_s
            ) from None

    def _no_candidate(self, request: Request, exc: NoCandidateError) -> GatewayError:
        """400 if no backend of the model could ever fit the request, else 503."""
        serving = [
            b.endpoint
            for b in self.backends.values()
            if request.model in (None, AUTO_MODEL) or b.model == request.model
        ]
        if serving and not any(e.can_fit(request) for e in serving):
            return GatewayError(
                400, str(exc), kind="context_length", code="context_length_exceeded"
            )
        return GatewayError(
            503, str(exc), kind="no_backend", type_=SERVER_ERROR, code="no_healthy_backend"
        )

    async def _attempt(
        self, stream: ResponseStream, job: Job, request: Request, backend: Backend
    ) -> HttpResponse | _Failure | None:
        """One try on ``backend``; always gives its slot back."""
        outcome = _Outcome()
        try:
            return await self._exchange(stream, job, request, backend, outcome)
        finally:
            self.admission.finish(
                request, backend.name, has_first_byte=outcome.has_first_byte, is_ok=outcome.is_ok
            )

    async def _exchange(
        self,
        stream: ResponseStream,
        job: Job,
        request: Request,
        backend: Backend,
        outcome: _Outcome,
    ) -> HttpResponse | _Failure | None:
        pool = self._pools[backend.name]
        try:
            async with asyncio.timeout(max(job.seconds_left(), 0.001)):
                response = await pool.request("POST", job.route, job.body_for(backend))
                try:
                    if response.status >= 500:
                        detail = await _error_detail(response)
                        self.health.record(backend.name, False)
                        return _Failure("backend_5xx", f"{backend.name} answered HTTP {detail}")
                    if job.parsed.is_stream and response.status == 200:
                        chunk = await response.next_chunk()
                        if not chunk:
                            self.health.record(backend.name, False)
                            return _Failure(
                                "backend_empty", f"{backend.name} ended the stream before any byte"
                            )
                    else:
                        return await self._relay_whole(backend, response, outcome)
                except BaseException:
                    response.release()  # an unfinished response closes its connection
                    raise
        except BACKEND_ERRORS as exc:
            return self._backend_failed(job, backend, exc)
        try:
            await self._relay_stream(stream, job, request, backend, response, chunk, outcome)
        finally:
            response.release()
        return None

    def _backend_failed(self, job: Job, backend: Backend, exc: BaseException) -> _Failure:
        if job.seconds_left() <= 0:
            raise timeout_error(job.request.request_id)
        self.health.record(backend.name, False)
        kind = "backend_connect"
        if isinstance(exc, UpstreamError) and exc.kind != "connect":
            kind = "backend_disconnect"
        return _Failure(kind, f"{backend.name}: {type(exc).__name__}: {exc}")

    async def _relay_whole(
        self, backend: Backend, response: UpstreamResponse, outcome: _Outcome
    ) -> HttpResponse:
        data = await response.read()
        self.health.record(backend.name, True)
        outcome.is_ok = response.status < 400
        return HttpResponse(
            response.status, data, response.content_type, self._headers[backend.name]
        )

    async def _relay_stream(
        self,
        stream: ResponseStream,
        job: Job,
        request: Request,
        backend: Backend,
        response: UpstreamResponse,
        chunk: bytes,
        outcome: _Outcome,
    ) -> None:
        """Bytes reached us: from here on nothing is replayed, whatever happens."""
        outcome.has_first_byte = True
        self.admission.first_byte(request, backend.name)
        self.metrics.ttft.observe(time.monotonic() - job.started_s)
        stream.start(200, self._stream_headers[backend.name], response.content_type)
        try:
            # the deadline bounds both a silent backend and a client that stopped reading
            async with asyncio.timeout(max(job.seconds_left(), 0.0)):
                while chunk:
                    await stream.write(chunk)
                    chunk = await response.next_chunk()
            await stream.end()
            self.health.record(backend.name, True)
            outcome.is_ok = True
        except ConnectionResetError:  # the client went away; release() drops the backend too
            self.metrics.errors.labels("client_disconnect").inc()
        except (UpstreamError, TimeoutError) as exc:
            await self._end_broken_stream(stream, job, backend, exc)

    async def _end_broken_stream(
        self, stream: ResponseStream, job: Job, backend: Backend, exc: BaseException
    ) -> None:
        """The backend failed after bytes reached the client: say so, close, never replay."""
        if job.seconds_left() <= 0:
            kind, message = "timeout", "the request timed out mid-stream"
        else:
            kind, message = "midstream", f"backend {backend.name} failed mid-stream"
            self.health.record(backend.name, False)
        self.metrics.errors.labels(kind).inc()
        log.warning("%s: %s (%s: %s)", job.request.request_id, message, type(exc).__name__, exc)
        try:  # a client that does not read gets its connection closed instead
            async with asyncio.timeout(STALLED_CLIENT_GRACE_S):
                await stream.write(b"\n\n" + sse_error_event(message, kind))
                await stream.end()
        except (TimeoutError, ConnectionResetError):
            if isinstance(exc, TimeoutError):
                self.metrics.errors.labels("client_stalled").inc()
            stream.abort()


def _backend_headers(backend: Backend) -> dict[str, str]:
    return {ENDPOINT_HEADER: backend.name, MODEL_HEADER: backend.model}


async def _error_detail(response: UpstreamResponse) -> str:
    try:
        text = (await response.read()).decode(errors="replace")
    except UpstreamError:
        text = ""
    return f"{response.status}: {text[:MAX_ERROR_DETAIL_CHARS]}".rstrip(": ")
