"""One attempt of a request on one backend: send it, then relay or fail over.

Called by :meth:`longroute.gateway.proxy.Proxy.forward` once per attempt
(:func:`attempt`). An attempt either answers the client (a whole response, or a
stream relayed by :mod:`longroute.gateway.stream_relay`) or returns a
:class:`Failure` while no byte has reached the client, so the proxy may try
another backend. Failures are told apart as the proxy's failure accounting
needs them (:attr:`Failure.is_sent`). Whatever happens, the attempt's slot goes
back to admission, and the answer's usage to the router's completion hook.

Nothing a backend says reaches the client unredacted: error bodies go through
:mod:`longroute.gateway.backend_errors`, 2xx bodies lose any quoted backend key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from longroute.gateway.admission import Grant
from longroute.gateway.backend_errors import (
    CREDENTIAL_STATUSES,
    MAX_ERROR_BODY_BYTES,
    log_preview,
    relayed_client_error,
)
from longroute.gateway.backends import Backend
from longroute.gateway.deadline import Deadline
from longroute.gateway.errors import timeout_error
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpResponse
from longroute.gateway.http.upstream import UpstreamError, UpstreamResponse
from longroute.gateway.intake import Job
from longroute.gateway.response_headers import with_prediction
from longroute.gateway.stream_relay import relay_stream

if TYPE_CHECKING:
    from longroute.gateway.proxy import Proxy

BACKEND_ERRORS = (UpstreamError, TimeoutError, OSError)
MAX_WHOLE_RESPONSE_BYTES = 256 * 1024 * 1024
"""Largest non-streamed backend answer relayed (a backend cannot fill the gateway's memory)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that failed before any byte reached the client: try another backend.

    ``message`` may be shown to the client (it names the backend and what
    happened, never the backend's own words); ``detail`` is for the log
    (redacted, one line). ``is_sent``: the request reached the backend, so the
    failure may be the request's fault (see :mod:`longroute.gateway.proxy`).
    """

    kind: str
    message: str
    detail: str
    is_sent: bool


class Outcome:
    """What one attempt did, for the accounting in its ``finally`` and in ``forward``.

    ``is_answered``: the backend gave a 2xx (its first byte, when streamed).
    """

    __slots__ = ("has_first_byte", "is_answered", "is_ok")

    def __init__(self) -> None:
        self.has_first_byte = False
        self.is_answered = False
        self.is_ok = False


async def attempt(
    proxy: Proxy,
    stream: ResponseStream,
    job: Job,
    grant: Grant,
    backend: Backend,
    outcome: Outcome,
) -> HttpResponse | Failure | None:
    """One try on ``backend``; always gives its slot back."""
    request = grant.request
    try:
        return await _exchange(proxy, stream, job, grant, backend, outcome)
    finally:
        observed = None
        if outcome.is_ok:  # the engine's usage: what the router's hook learns from
            completion = job.trace.usage()
            if completion.source == "backend" and completion.completion_tokens is not None:
                observed = completion.completion_tokens
        proxy.admission.finish(
            request,
            backend.name,
            has_first_byte=outcome.has_first_byte,
            is_ok=outcome.is_ok,
            observed_output_tokens=observed,
        )
        tuning = proxy.tuning
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
    proxy: Proxy,
    stream: ResponseStream,
    job: Job,
    grant: Grant,
    backend: Backend,
    outcome: Outcome,
) -> HttpResponse | Failure | None:
    request = grant.request
    pool = proxy.pools[backend.name]
    # one timer bounds the exchange and the stream's relay: both end at the deadline
    deadline = Deadline(max(job.seconds_left(), 0.001), stream.loop)
    try:
        body = job.body_for(backend)
        truth = proxy.engine_truth
        if truth is not None:  # before dispatch: what its cache will serve
            await truth.settle(backend.name)
            job.trace.predicted_cached_tokens = truth.predicted_cached_tokens(backend.name, request)
        priorities = proxy.wiring.priorities
        if priorities:  # backends that schedule by priority get one
            body = priorities.body(body, request, backend.name)
        lines = proxy.tracing.attempt(job.trace)
        response = await pool.request("POST", job.route, body, head_lines=lines)
        try:
            status = response.status
            result: HttpResponse | Failure | None = None  # None: relay the stream
            if status >= 500 or status in CREDENTIAL_STATUSES:
                result = await _answered_failure(proxy, backend, response)
            elif job.parsed.is_stream and status == 200:
                chunk = await response.next_chunk()
                if not chunk:
                    result = Failure(
                        "backend_empty",
                        f"backend {backend.name} ended the stream before any byte",
                        "",
                        is_sent=True,
                    )
            else:
                result = await _relay_whole(proxy, job, grant, backend, response, outcome)
        except BaseException:
            response.release()  # an unfinished response closes its connection
            raise
    except BaseException as exc:
        timeout = deadline.exit(exc)
        if timeout is not None:
            return _backend_failed(proxy, job, backend, timeout)
        if isinstance(exc, BACKEND_ERRORS):
            return _backend_failed(proxy, job, backend, exc)
        raise
    if result is not None:
        deadline.exit(None)
        return result
    try:
        await relay_stream(proxy, stream, job, grant, backend, response, chunk, outcome, deadline)
    finally:
        response.release()
    return None


async def _answered_failure(proxy: Proxy, backend: Backend, response: UpstreamResponse) -> Failure:
    """A 5xx or a refusal of the gateway's credentials: the client never sees its body."""
    status = response.status
    try:
        detail = log_preview(await response.read(MAX_ERROR_BODY_BYTES), proxy.wiring.redactor)
    except UpstreamError:
        detail = "(body unreadable)"
    if status in CREDENTIAL_STATUSES:
        message = f"backend {backend.name} refused the gateway's credentials (HTTP {status})"
        return Failure("backend_auth", message, detail, is_sent=True)
    message = f"backend {backend.name} answered HTTP {status}"
    return Failure("backend_5xx", message, detail, is_sent=True)


def _backend_failed(proxy: Proxy, job: Job, backend: Backend, exc: BaseException) -> Failure:
    if job.seconds_left() <= 0:
        raise timeout_error(job.trace.request_id)
    detail = proxy.wiring.redactor.text(f"{type(exc).__name__}: {exc}", 500)
    if isinstance(exc, UpstreamError) and exc.kind == "connect":
        message = f"backend {backend.name} could not be reached"
        return Failure("backend_connect", message, detail, is_sent=False)
    message = f"backend {backend.name} broke off before answering"
    return Failure("backend_disconnect", message, detail, is_sent=True)


async def _relay_whole(
    proxy: Proxy,
    job: Job,
    grant: Grant,
    backend: Backend,
    response: UpstreamResponse,
    outcome: Outcome,
) -> HttpResponse:
    status = response.status
    redactor = proxy.wiring.redactor
    if status >= 400:  # the request's own fault (5xx and 401/403/407 failed over before)
        data = await response.read(MAX_ERROR_BODY_BYTES)
        body = relayed_client_error(status, data, redactor, backend.name)
        content_type = JSON_TYPE
    else:
        body = redactor.body(await response.read(MAX_WHOLE_RESPONSE_BYTES))
        content_type = response.content_type
        job.trace.keep_body(body)
    proxy.health.record(backend.name, True)
    outcome.is_ok = outcome.is_answered = status < 400
    headers = with_prediction(proxy.headers[backend.name], grant, job.trace)
    return HttpResponse(status, body, content_type, headers)
