"""Relaying a streamed answer once its first chunk arrived: nothing is replayed after.

Called by :mod:`longroute.gateway.attempt` for a 200 stream whose first chunk
was read (an empty stream failed over before). Chunks are relayed as they
arrive, redacted but never parsed or re-serialised: the head goes out with the
first chunk and the terminator with the chunk that ends the backend's answer,
one write each. A backend that dies or falls silent mid-stream ends the
client's stream with an SSE error event; a client that does not read that
event within :data:`STALLED_CLIENT_GRACE_S` gets its connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from longroute.gateway.admission import Grant
from longroute.gateway.backends import Backend
from longroute.gateway.deadline import Deadline
from longroute.gateway.errors import sse_error_event
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.upstream import UpstreamError, UpstreamResponse
from longroute.gateway.intake import Job
from longroute.gateway.response_headers import with_prediction

if TYPE_CHECKING:
    from longroute.gateway.attempt import Outcome
    from longroute.gateway.proxy import Proxy

log = logging.getLogger("longroute.gateway")

# how long the error event of a broken stream may wait on a client that does not read
STALLED_CLIENT_GRACE_S = 1.0


async def relay_stream(
    proxy: Proxy,
    stream: ResponseStream,
    job: Job,
    grant: Grant,
    backend: Backend,
    response: UpstreamResponse,
    chunk: bytes,
    outcome: Outcome,
    deadline: Deadline,
) -> None:
    """Bytes reached us: from here on nothing is replayed, whatever happens.

    ``deadline`` (armed by the caller, exited here) bounds both a silent backend and
    a client that stopped reading. The head goes out with the first chunk, and the
    terminator with the chunk that ends the backend's answer (one write each)."""
    outcome.has_first_byte = outcome.is_answered = True
    proxy.admission.first_byte(grant.request, backend.name)
    trace = job.trace
    trace.first_byte_s = now_s = time.monotonic()
    proxy.metrics.observe_ttft(backend.model, backend.name, now_s - job.started_s)
    headers = with_prediction(proxy.stream_headers[backend.name], grant, trace)
    redactor = proxy.wiring.redactor
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
        proxy.health.record(backend.name, True)
        outcome.is_ok = True
    except (UpstreamError, TimeoutError) as exc:
        await _end_broken_stream(proxy, stream, job, backend, exc)
    finally:
        trace.last = last
        trace.num_events = num_events


async def _end_broken_stream(
    proxy: Proxy, stream: ResponseStream, job: Job, backend: Backend, exc: BaseException
) -> None:
    """The backend failed after bytes reached the client: say so, close, never replay."""
    if job.seconds_left() <= 0:
        kind, message = "timeout", "the request timed out mid-stream"
    else:
        kind, message = "midstream", f"backend {backend.name} failed mid-stream"
        proxy.health.record(backend.name, False, detail=message)
    proxy.metrics.errors.labels(kind).inc()
    job.trace.error_kind = kind
    detail = proxy.wiring.redactor.text(f"{type(exc).__name__}: {exc}", 500)
    log.warning("%s: %s (%s)", job.trace.request_id, message, detail)
    try:  # a client that does not read gets its connection closed instead
        async with asyncio.timeout(STALLED_CLIENT_GRACE_S):
            await stream.write(b"\n\n" + sse_error_event(message, kind))
            await stream.end()
    except (TimeoutError, ConnectionResetError):
        if isinstance(exc, TimeoutError):
            proxy.metrics.errors.labels("client_stalled").inc()
        stream.abort()
