"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``.

A :class:`GatewayError` is raised anywhere in request handling and turned
into a JSON response (before any byte went out) or an SSE error event (after).
``kind`` labels ``longroute_errors_total``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from longroute.gateway.http.types import JSON_TYPE, HttpResponse
from longroute.routing.fleet_view import AUTO_MODEL

if TYPE_CHECKING:
    from longroute.gateway.backends import Backend
    from longroute.types import Request

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"


class GatewayError(Exception):
    """A request cannot be served; carries the HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str,
        type_: str = INVALID_REQUEST,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.type_ = type_
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        return error_body(self.message, self.type_, self.code, self.param)

    def response(self) -> HttpResponse:
        return HttpResponse(self.status, self.body(), JSON_TYPE, self.headers)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    error = {"message": message, "type": type_, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


def sse_error_event(message: str, code: str) -> bytes:
    """The last event of a stream whose backend failed after bytes reached the client."""
    return b"data: " + error_body(message, SERVER_ERROR, code) + b"\n\n"


SHUTDOWN = "server_shutdown"
"""The error type and code of a request the gateway ended because it is shutting down."""
_SHUTDOWN_MESSAGE = (
    "the gateway is shutting down and its drain deadline passed before this request "
    "finished; retry it (another replica will take it)"
)


def shutdown_event() -> bytes:
    """The end of a stream cut by the drain deadline: an error event, then ``[DONE]``, so a
    client knows the stream was cut rather than finished (or dropped bare)."""
    return b"data: " + error_body(_SHUTDOWN_MESSAGE, SHUTDOWN, SHUTDOWN) + b"\n\ndata: [DONE]\n\n"


def shutdown_error(retry_after_s: int) -> GatewayError:
    """503 for a non-streamed request cut by the drain deadline."""
    return GatewayError(
        503,
        _SHUTDOWN_MESSAGE,
        kind=SHUTDOWN,
        type_=SHUTDOWN,
        code=SHUTDOWN,
        headers={"Retry-After": str(retry_after_s)},
    )


def draining_error(retry_after_s: int) -> GatewayError:
    """503 for a request that arrives (on a kept-alive connection) while the gateway drains."""
    return GatewayError(
        503,
        "the gateway is shutting down and takes no new requests; retry on another replica",
        kind="draining",
        type_=SERVER_ERROR,
        code="server_shutting_down",
        headers={"Retry-After": str(retry_after_s)},
    )


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, kind="bad_request", param=param)


def overloaded_error(status: int, code: str, message: str, retry_after_s: int) -> GatewayError:
    """429 (queue full) or 503 (queue timeout), with ``Retry-After``."""
    return GatewayError(
        status,
        message,
        kind=code,
        type_=RATE_LIMIT if status == 429 else SERVER_ERROR,
        code=code,
        headers={"Retry-After": str(retry_after_s)},
    )


def timeout_error(request_id: str) -> GatewayError:
    return GatewayError(
        504, f"request {request_id} timed out", kind="timeout", type_=SERVER_ERROR, code="timeout"
    )


def all_failed_error(tried: tuple[str, ...], last_message: str) -> GatewayError:
    return GatewayError(
        502,
        f"no backend could serve the request (tried {', '.join(tried)}); "
        f"last error: {last_message}",
        kind="all_backends_failed",
        type_=SERVER_ERROR,
        code="backend_error",
    )


def request_failed_error(backends: tuple[str, ...], last_message: str) -> GatewayError:
    """A request that failed on every backend it reached: most likely the request's own fault
    (e.g. a prompt the engines cannot handle), so it is not tried further."""
    return GatewayError(
        502,
        f"the request failed on {len(backends)} backend(s) ({', '.join(backends)}) and is not "
        f"retried further; last error: {last_message}",
        kind="request_failed",
        type_=SERVER_ERROR,
        code="backend_error",
    )


def no_candidate_error(
    request: Request, exc: Exception, backends: Mapping[str, Backend], health_causes: str
) -> GatewayError:
    """The router found no candidate: 400 if no backend of the model could ever fit the
    request, else 503 naming the backends' health (``health_causes``; may be empty)."""
    model = request.model
    serving = [
        b.endpoint for b in backends.values() if model in (None, AUTO_MODEL) or b.model == model
    ]
    if serving and not any(e.can_fit(request) for e in serving):
        return GatewayError(400, str(exc), kind="context_length", code="context_length_exceeded")
    message = f"{exc}; backends: {health_causes}" if health_causes else str(exc)
    return GatewayError(
        503, message, kind="no_backend", type_=SERVER_ERROR, code="no_healthy_backend"
    )
