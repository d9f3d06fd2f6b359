"""One HTTP request's ext_proc message sequence, as a state machine without I/O.

Envoy opens one ``Process`` stream per HTTP request. :meth:`Exchange.on_message`
takes each message and returns the messages to send back. Two Envoy configs are
understood, told apart by the ``protocol_config`` of the first message:

**BUFFERED** (:func:`~longroute.epp.envoy.epp_config`, mode overrides allowed):

- request headers: ``CONTINUE`` (Envoy then buffers the body and sends it in one
  message, still holding the headers), or an ``ImmediateResponse`` at once for a
  request that cannot be served whatever its body (unknown path, wrong method or
  media type, missing API key, oversized headers);
- request body: routed; the answer sets the destination (the
  ``x-gateway-destination-endpoint`` header and the ``envoy.lb`` dynamic
  metadata) and replaces the body only where the picker rewrote it; or an
  ``ImmediateResponse`` (400, 404, 413, 429, 503, ...);
- response headers: continue (adding ``x-longroute-endpoint``) with a
  ``mode_override`` saying whether the response body comes to the picker (see
  :class:`ResponseBodies`); without it the exchange waits for the stream's end,
  which Envoy sends when the HTTP stream ends, and finishes the request there
  with the status of the headers;
- response body chunks (when asked for): passed on unchanged, the first is the
  backend's first token, the last (or the trailers) the end of the answer.

**FULL_DUPLEX_STREAMED** (earlier configs): the request headers are answered at
the body's end, with the destination, then the body in chunks of at most 62,000
bytes; every response body chunk is read and sent back.

:meth:`Exchange.close` is called when the stream ends however it ends; an
exchange that picked and did not see its response end (the client hung up, the
upstream broke) frees its slot there, as a failed request, unless it was passing
the response body without reading it (then the request ends there as answered).

Messages that do not fit the phase (a body before headers, a response before
the pick) raise :class:`ProtocolError`; the server ends the stream with it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

from longroute.epp import messages
from longroute.epp.messages import ResponseBodies as ResponseBodies
from longroute.epp.picker import Pick
from longroute.gateway.app import check_content_type
from longroute.gateway.errors import GatewayError, bad_request
from longroute.gateway.http.types import JSON_TYPE, Headers
from longroute.gateway.parse import ROUTES
from longroute.headers import ENDPOINT_HEADER

MODELS_PATH = "/v1/models"
SSE_TYPE = "text/event-stream"
#: Bytes of request or response header names and values at most (Envoy's own default
#: limit is 60 KiB); more is answered 431.
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
CLIENT_CLOSED_STATUS = 499


class ProtocolError(Exception):
    """A message that cannot come at this point of the exchange."""


class Picker(Protocol):
    """What an exchange needs of :class:`~longroute.epp.picker.EndpointPicker`."""

    models_body: bytes
    names_by_address: dict[str, str]

    def check_client(self, headers: Headers) -> None: ...
    def pick(self, route: str, headers: Headers, raw: bytes) -> tuple[Pick, bytes]: ...
    def first_byte(self, pick: Pick) -> None: ...
    def observe_body(self, pick: Pick, chunk: bytes) -> None: ...
    def finish(self, pick: Pick, status: int | None) -> None: ...
    def count_rejected(self, route: str, status: int, kind: str) -> None: ...


class Phase(Enum):
    REQUEST_HEADERS = "request_headers"
    REQUEST_BODY = "request_body"
    AWAITING_RESPONSE = "awaiting_response"
    RESPONSE_BODY = "response_body"
    #: the response body passes without the picker; the stream's end ends the request
    AWAITING_END = "awaiting_end"
    DONE = "done"


Responses = list[Any]  # ProcessingResponse messages (generated classes are untyped)


class Exchange:
    """One ``Process`` stream; see the module doc. Not thread-safe (one per stream)."""

    __slots__ = (
        "_body",
        "_headers",
        "_is_buffered",
        "_max_body_bytes",
        "_max_header_bytes",
        "_observe",
        "_picker",
        "_route",
        "_status",
        "phase",
        "pick",
        "served_by",
    )

    def __init__(
        self,
        picker: Picker,
        *,
        max_body_bytes: int,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        response_bodies: ResponseBodies = ResponseBodies.ALL,
    ) -> None:
        self._picker = picker
        self._observe = response_bodies
        self._is_buffered = False
        self._max_body_bytes = max_body_bytes
        self._max_header_bytes = max_header_bytes
        self._body = bytearray()
        self._headers = Headers()
        self._route = ""
        self._status: int | None = None
        self.phase = Phase.REQUEST_HEADERS
        self.pick: Pick | None = None
        self.served_by: str | None = None

    @property
    def is_done(self) -> bool:
        return self.phase is Phase.DONE

    def on_message(self, message: Any) -> Responses:
        """The responses to one ProcessingRequest (possibly none yet)."""
        kind = message.WhichOneof("request")
        if self.phase is Phase.DONE:
            return []  # e.g. a response phase after an ImmediateResponse: nothing to add
        if kind == "request_headers":
            self._expect(Phase.REQUEST_HEADERS, kind)
            if message.HasField("protocol_config"):
                mode = message.protocol_config.request_body_mode
                self._is_buffered = mode == messages.BUFFERED
            return self._on_request_headers(message.request_headers)
        if kind == "request_body":
            self._expect(Phase.REQUEST_BODY, kind)
            return self._on_request_body(message.request_body)
        if kind == "request_trailers":
            self._expect(Phase.REQUEST_BODY, kind)
            return [*self._route_request(is_end=False), messages.request_trailers_response()]
        if kind == "response_headers":
            if self.phase is Phase.REQUEST_BODY and self._is_buffered:
                return self._on_local_reply(message.response_headers)
            self._expect(Phase.AWAITING_RESPONSE, kind)
            return self._on_response_headers(message)
        if kind == "response_body":
            self._expect(Phase.RESPONSE_BODY, kind)
            return self._on_response_body(message.response_body)
        if kind == "response_trailers":
            self._expect(Phase.RESPONSE_BODY, kind)
            self._finish()
            return [messages.response_trailers_response()]
        raise ProtocolError(f"unexpected message {kind!r}")

    def close(self) -> None:
        """The stream ended; an unfinished pick is released as failed. Idempotent."""
        if self.phase is Phase.AWAITING_END:  # the unread response body has passed
            self._finish()
        elif self.pick is not None and not self.pick.is_finished:
            self._picker.finish(self.pick, None)
        elif self.phase is Phase.REQUEST_BODY:  # the client hung up mid-body
            self._picker.count_rejected(self._route, CLIENT_CLOSED_STATUS, "client_disconnect")
        self.phase = Phase.DONE

    # ---- request ---------------------------------------------------------------------
    def _expect(self, phase: Phase, kind: str) -> None:
        if self.phase is not phase:
            raise ProtocolError(f"{kind} arrived while the exchange is at {self.phase.value}")

    def _on_request_headers(self, message: Any) -> Responses:
        try:
            raw = messages.read_headers(message.headers, self._max_header_bytes)
        except messages.HeaderTooLargeError as exc:
            return self._reject(GatewayError(431, str(exc), kind="head_too_large"))
        headers = self._headers = Headers.from_lower(raw)
        method = headers.get(":method", "")
        path = headers.get(":path", "").partition("?")[0]
        self._route = path if path in ROUTES else ""
        try:
            self._picker.check_client(headers)
            if method == "GET" and path == MODELS_PATH:
                return self._answer(200, self._picker.models_body)
            if path not in ROUTES:
                shown = f"{method} {path}"[:200]
                raise GatewayError(404, f"Invalid URL ({shown})", kind="unknown_url")
            if method != "POST":
                raise GatewayError(405, f"{path} takes POST, not {method[:16]}", kind="method")
            check_content_type(headers.get("content-type"))
        except GatewayError as err:
            return self._reject(err)
        self.phase = Phase.REQUEST_BODY
        if message.end_of_stream:  # a POST without a body: routed (and refused) as one
            return self._route_request(is_end=True)
        return [messages.CONTINUE_REQUEST_HEADERS] if self._is_buffered else []

    def _on_request_body(self, message: Any) -> Responses:
        if self._is_buffered:  # the whole body in one message: no copy to gather it
            raw = message.body  # each read of a bytes field is a copy: read it once
            if len(raw) > self._max_body_bytes:
                return self._reject(self._too_large())
            return self._route_request(is_end=True, raw=raw)
        body = self._body
        body += message.body
        if len(body) > self._max_body_bytes:
            self._body = bytearray()
            return self._reject(self._too_large())
        if message.end_of_stream:
            return self._route_request(is_end=True)
        return []

    def _too_large(self) -> GatewayError:
        return GatewayError(
            413,
            f"the request body is larger than {self._max_body_bytes} bytes",
            kind="body_too_large",
            code="request_too_large",
        )

    def _route_request(self, *, is_end: bool, raw: bytes | None = None) -> Responses:
        """``raw``: a whole body from a BUFFERED body message (answered there); else the
        body gathered so far, answered in full-duplex chunks or at the headers."""
        is_buffered_body = raw is not None
        if raw is None:
            raw = bytes(self._body)
            self._body = bytearray()
        received = raw
        try:
            pick, raw = self._picker.pick(self._route, self._headers, raw)
        except GatewayError as err:
            return self._reject(err)
        except RecursionError:  # re-serialising a body nested as deep as the decoder allows
            return self._reject(bad_request("the body's JSON is nested too deeply"))
        self.pick = pick
        self.phase = Phase.AWAITING_RESPONSE
        if is_buffered_body:
            rewritten = None if raw is received or raw == received else raw
            return [messages.buffered_destination_response(pick.destination, rewritten)]
        return [
            messages.destination_response(pick.destination, {}),
            *messages.request_body_responses(raw, is_end=is_end),
        ]

    # ---- response --------------------------------------------------------------------
    def _on_response_headers(self, message: Any) -> Responses:
        pick = self.pick
        assert pick is not None
        headers = message.response_headers
        try:
            raw = messages.read_headers(headers.headers, self._max_header_bytes)
        except messages.HeaderTooLargeError:
            raw = {}
        status = raw.get(":status", "")
        self._status = int(status) if status.isdigit() and len(status) == 3 else 502
        served = messages.served_endpoint(message.metadata_context)
        names = self._picker.names_by_address
        primary = pick.destination.partition(",")[0]
        self.served_by = names.get(served or primary) or names.get(primary)
        if not self._is_buffered:
            answer = messages.response_headers_response(
                {ENDPOINT_HEADER: self.served_by} if self.served_by else {}
            )
            if headers.end_of_stream:
                self._finish()
            else:
                self.phase = Phase.RESPONSE_BODY
            return [answer]
        is_ok = self._status < 400
        is_sse = raw.get("content-type", "").startswith(SSE_TYPE)
        observe = is_ok and not headers.end_of_stream and self._reads_body(is_sse)
        if headers.end_of_stream:
            self._finish()
        elif observe:
            self.phase = Phase.RESPONSE_BODY
        else:
            if is_ok and not is_sse:  # the answer's body comes with its headers
                self._picker.first_byte(pick)
            self.phase = Phase.AWAITING_END
        shared = messages.shared_response_headers_response
        return [shared(ENDPOINT_HEADER, self.served_by, observe)]

    def _on_local_reply(self, message: Any) -> Responses:
        """Envoy answered the client itself before the body came (a body over its buffer
        limit: 413); its answer passes, counted as refused, and its body is not read."""
        try:
            status = messages.read_headers(message.headers, self._max_header_bytes)[":status"]
        except (messages.HeaderTooLargeError, KeyError):
            status = ""
        code = int(status) if status.isdigit() and len(status) == 3 else 502
        kind = "body_too_large" if code == 413 else "envoy_local_reply"
        self._picker.count_rejected(self._route, code, kind)
        self.phase = Phase.DONE
        return [messages.shared_response_headers_response(ENDPOINT_HEADER, None, False)]

    def _reads_body(self, is_sse: bool) -> bool:
        policy = self._observe
        return policy is ResponseBodies.ALL or (policy is ResponseBodies.AUTO and is_sse)

    def _on_response_body(self, message: Any) -> Responses:
        pick = self.pick
        assert pick is not None
        chunk = message.body
        if chunk:
            if not pick.has_first_byte and self._status is not None and self._status < 400:
                self._picker.first_byte(pick)
            self._picker.observe_body(pick, chunk)
        is_end = bool(message.end_of_stream)
        if is_end:
            self._finish()
        if self._is_buffered:  # STREAMED: the chunk passes on unchanged
            return [messages.CONTINUE_RESPONSE_BODY]
        return [messages.response_body_response(chunk, is_end=is_end)]

    def _finish(self) -> None:
        if self.pick is not None:
            self._picker.finish(self.pick, self._status)
        self.phase = Phase.DONE

    # ---- answers by the picker itself -----------------------------------------------
    def _answer(self, status: int, body: bytes) -> Responses:
        self.phase = Phase.DONE
        headers = [("content-type", JSON_TYPE)]
        return [messages.immediate_response(status, body, headers, "longroute_epp")]

    def _reject(self, err: GatewayError) -> Responses:
        self._picker.count_rejected(self._route, err.status, err.kind)
        self.phase = Phase.DONE
        headers = [("content-type", JSON_TYPE), *((k.lower(), v) for k, v in err.headers.items())]
        details = f"longroute_epp_{err.kind}"
        return [messages.immediate_response(err.status, err.body(), headers, details)]
