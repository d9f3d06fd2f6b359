"""The completion handler: one client request from its bytes to its answer, observed.

Called by the gateway's dispatch once per ``POST /v1/chat/completions`` or
``/v1/completions`` (with the request id dispatch chose). It authorises,
parses, resolves the model, applies context reuse, builds the router's
Request and hands the :class:`~longroute.gateway.intake.Job` to the proxy;
every outcome (an answer, a GatewayError, a client that left, a cut at the
drain's deadline, a bug) ends in the request's
:class:`~longroute.gateway.observe.RequestTrace`, which goes to the gateway's
sinks (usage counters, access log, spans) once. It reads the gateway's wiring
at the start of each request, so a reload takes effect at the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from longroute.gateway.errors import SERVER_ERROR, GatewayError, bad_request, shutdown_error
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpRequest, HttpResponse, lower_items
from longroute.gateway.intake import Job, authorize
from longroute.gateway.lifecycle import end_cut_stream
from longroute.gateway.observe import RequestTrace, valid_traceparent, valid_tracestate
from longroute.gateway.parse import parse_body
from longroute.gateway.priority import without_client_priority

if TYPE_CHECKING:
    from longroute.gateway.app import Gateway

log = logging.getLogger("longroute.gateway")

# the status counted for a request whose client left before its answer (nginx's 499)
CLIENT_CLOSED_STATUS = 499


class CompletionHandler:
    """Serves one completion route of ``gateway``."""

    def __init__(self, gateway: Gateway, route: str) -> None:
        self.gateway = gateway
        self.route = route

    async def __call__(
        self, http_request: HttpRequest, stream: ResponseStream, request_id: str
    ) -> HttpResponse | None:
        """A whole response, or None when the answer was streamed through ``stream``."""
        gw = self.gateway
        headers = lower_items(http_request.headers)
        trace = RequestTrace(
            request_id,
            self.route,
            time.monotonic(),
            traceparent=valid_traceparent(headers.get("traceparent")),
            tracestate=valid_tracestate(headers.get("tracestate")),
        )
        gw.tracing.begin(trace)
        response: HttpResponse | None
        try:
            response = await self._serve(http_request, headers, stream, trace)
        except GatewayError as err:
            response = self._failed(trace, err.kind, err.response())
        except RecursionError:  # e.g. re-serialising a body nested as deep as the decoder allows
            error = bad_request("the body's JSON is nested too deeply")
            response = self._failed(trace, "bad_request", error.response())
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or not gw.drain.is_cut(task):
                self._end(trace, CLIENT_CLOSED_STATUS, "client_disconnect")
                raise
            # the drain's deadline passed: end the request here (its backend connection
            # was closed by the cancellation, so the engine aborts it)
            task.uncancel()
            response = await self._cut(stream, trace)
        except ConnectionResetError:
            self._end(trace, CLIENT_CLOSED_STATUS, "client_disconnect")
            raise
        except Exception:  # a bug must still give the client an answer
            log.exception("unexpected error while serving %s (request %s)", self.route, request_id)
            error = GatewayError(
                500, "internal gateway error", kind="internal", type_=SERVER_ERROR,
                code="internal_error",
            )  # fmt: skip
            response = self._failed(trace, "internal", error.response())
        self._end(trace, 200 if response is None else response.status, None)
        return response

    async def _serve(
        self,
        http_request: HttpRequest,
        headers: Mapping[str, str],
        stream: ResponseStream,
        trace: RequestTrace,
    ) -> HttpResponse | None:
        """``headers``: the request's, by lower-case name (:func:`lower_items`)."""
        gw = self.gateway
        wiring = gw.wiring
        key = authorize(headers, wiring.client_api_keys)
        if key is not None:
            trace.key_id = wiring.client_key_ids[key]
        check_content_type(headers.get("content-type"))
        route = self.route
        raw = http_request.body
        raw, parsed = without_client_priority(raw, parse_body(raw, route))
        trace.model = parsed.model
        trace.is_stream = parsed.is_stream
        target = wiring.models.get(parsed.model)
        if target is None:
            raise _model_not_found(parsed.model)
        trace.is_model_known = True
        if wiring.context is not None:  # requests with documents: plan and rewrite
            raw, parsed = wiring.context.apply(raw, parsed, route, target)
        request = wiring.requests.build(parsed, target, http_request.headers, route)
        trace.prompt_tokens_estimate = request.num_prompt_tokens
        job = Job(
            route, raw, parsed, request, trace,
            is_alias=parsed.model not in wiring.served_models,
            started_s=trace.started_s,
            timeout_s=wiring.config.admission.request_timeout_s,
        )  # fmt: skip
        response = await gw.proxy.forward(stream, job)
        if response is None or response.status < 400:  # an answer: learn its length
            wiring.requests.observe(job)
        return response

    def _failed(self, trace: RequestTrace, kind: str, response: HttpResponse) -> HttpResponse:
        self.gateway.metrics.errors.labels(kind).inc()
        trace.error_kind = kind
        return response

    async def _cut(self, stream: ResponseStream, trace: RequestTrace) -> HttpResponse | None:
        """Ends a request the drain cut: the stream with its event, else a 503."""
        gw = self.gateway
        gw.metrics.errors.labels("server_shutdown").inc()
        trace.error_kind = "server_shutdown"
        trace.outcome = "cut"
        if stream.is_started:
            await end_cut_stream(stream)
            return None
        return shutdown_error(gw.wiring.config.admission.retry_after_s).response()

    def _end(self, trace: RequestTrace, status: int, outcome: str | None) -> None:
        """Counts the request and hands its trace to the sinks (a failing sink is logged)."""
        gw = self.gateway
        now_s = time.monotonic()
        trace.ended_s = now_s
        trace.status = status
        if outcome is not None:
            trace.outcome = outcome
            trace.error_kind = outcome
            gw.metrics.errors.labels(outcome).inc()
        elif trace.error_kind is not None and trace.outcome == "ok":
            trace.outcome = "error"
        # a model label only for a model served here: client-chosen labels are unbounded
        model_label = trace.model if trace.is_model_known else ""
        gw.metrics.count_request(self.route, model_label, trace.endpoint, status)
        if status < 400 and trace.outcome == "ok":
            gw.metrics.observe_e2e(trace.served_model, trace.endpoint, now_s - trace.started_s)
        gw.observer.finish(trace)  # each sink's failure is logged there


def check_content_type(content_type: str | None) -> None:
    """A 415 unless the body is sent as JSON: ``application/json`` or ``application/*+json``
    (parameters such as charset allowed); no Content-Type is taken as JSON, as FastAPI does."""
    if content_type is None or content_type == JSON_TYPE:
        return
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type == JSON_TYPE or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    raise GatewayError(
        415,
        f"the body must be sent as {JSON_TYPE}, not {content_type[:64]!r}",
        kind="unsupported_media_type",
        code="unsupported_media_type",
    )


def _model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model `{model}` does not exist or is not served here.",
        kind="model_not_found",
        code="model_not_found",
        param="model",
    )


__all__ = ["CLIENT_CLOSED_STATUS", "CompletionHandler", "check_content_type"]
