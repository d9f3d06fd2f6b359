"""One HTTP request's ext_proc message sequence, as a state machine without I/O.

Envoy (``FULL_DUPLEX_STREAMED`` request and response bodies, headers and
trailers sent) opens one ``Process`` stream per HTTP request and sends, in
order: the request headers, the request body in chunks as they arrive (the
last with ``end_of_stream``, or request trailers after it), then the response
headers, body chunks and trailers. :meth:`Exchange.on_message` takes each
message and returns the messages to send back:

- request headers: nothing yet (the body decides), or an ``ImmediateResponse``
  at once for a request that cannot be served whatever its body (unknown path,
  wrong method or media type, missing API key, oversized headers);
- request body chunks: buffered (413 past ``max_body_bytes``); at the end of
  the body the picker routes it, and the answer is the request-headers response
  (the destination in the ``x-gateway-destination-endpoint`` header and in the
  ``envoy.lb`` dynamic metadata), then the body passed on in chunks of at most
  62,000 bytes; or an ``ImmediateResponse`` (400 invalid body, 404 unknown
  model, 429 shed, 503 no ready endpoint, ...);
- response headers, body chunks and trailers: passed on unchanged (the
  response headers gain ``x-longroute-endpoint``); the first body byte is the
  backend's first token for the router, the end of the response its completion.

:meth:`Exchange.close` is called when the stream ends however it ends; an
exchange that picked and did not see its response end (the client hung up, the
upstream broke) frees its slot there, as a failed request.

Messages that do not fit the phase (a body before headers, a response before
the pick) raise :class:`ProtocolError`; the server ends the stream with it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

from longroute.epp import messages
from longroute.epp.picker import Pick
from longroute.gateway.app import check_content_type
from longroute.gateway.errors import GatewayError, bad_request
from longroute.gateway.http.types import JSON_TYPE, Headers
from longroute.gateway.parse import ROUTES
from longroute.headers import ENDPOINT_HEADER

MODELS_PATH = "/v1/models"
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
    DONE = "done"


Responses = list[Any]  # ProcessingResponse messages (generated classes are untyped)


class Exchange:
    """One ``Process`` stream; see the module doc. Not thread-safe (one per stream)."""

    __slots__ = (
        "_body",
        "_headers",
        "_max_body_bytes",
        "_max_header_bytes",
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
    ) -> None:
        self._picker = picker
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
            return self._on_request_headers(message.request_headers)
        if kind == "request_body":
            self._expect(Phase.REQUEST_BODY, kind)
            return self._on_request_body(message.request_body)
        if kind == "request_trailers":
            self._expect(Phase.REQUEST_BODY, kind)
            return [*self._route_request(is_end=False), messages.request_trailers_response()]
        if kind == "response_headers":
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
        if self.pick is not None and not self.pick.is_finished:
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
        return []

    def _on_request_body(self, message: Any) -> Responses:
        body = self._body
        body += message.body
        if len(body) > self._max_body_bytes:
            self._body = bytearray()
            return self._reject(
                GatewayError(
                    413,
                    f"the request body is larger than {self._max_body_bytes} bytes",
                    kind="body_too_large",
                    code="request_too_large",
                )
            )
        if message.end_of_stream:
            return self._route_request(is_end=True)
        return []

    def _route_request(self, *, is_end: bool) -> Responses:
        raw = bytes(self._body)
        self._body = bytearray()
        try:
            pick, raw = self._picker.pick(self._route, self._headers, raw)
        except GatewayError as err:
            return self._reject(err)
        except RecursionError:  # re-serialising a body nested as deep as the decoder allows
            return self._reject(bad_request("the body's JSON is nested too deeply"))
        self.pick = pick
        self.phase = Phase.AWAITING_RESPONSE
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
        answer = messages.response_headers_response(
            {ENDPOINT_HEADER: self.served_by} if self.served_by else {}
        )
        if headers.end_of_stream:
            self._finish()
        else:
            self.phase = Phase.RESPONSE_BODY
        return [answer]

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
