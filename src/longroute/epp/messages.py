"""Reading and building the ext_proc messages the endpoint picker exchanges with Envoy.

Field names follow ``envoy/service/ext_proc/v3/external_processor.proto`` (the
generated classes of the ``xds-protos`` package). Header values arrive in
``raw_value`` (Envoy's default) or ``value``; both are read. Everything the
picker sets is built here, so the protocol's constants live in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from functools import lru_cache

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

#: The header and metadata key naming the picked endpoints (``ip:port[,ip:port...]``).
DESTINATION_KEY = "x-gateway-destination-endpoint"
#: The dynamic metadata namespace of the picked endpoints (the protocol's default).
METADATA_NAMESPACE = "envoy.lb"
#: Set by the data plane in the response's metadata_context: the endpoint that served it.
SERVED_KEY = "x-gateway-destination-endpoint-served"
#: Body chunks sent back to Envoy are at most this long (the protocol's recommendation: under
#: 64 KiB, Envoy's default gRPC message limit for ext_proc streams).
MAX_BODY_CHUNK_BYTES = 62_000

_OVERWRITE = HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
BUFFERED = ProcessingMode.BUFFERED
FULL_DUPLEX_STREAMED = ProcessingMode.FULL_DUPLEX_STREAMED


def _mode(response_body_mode: int) -> ProcessingMode:
    """A whole processing mode for ``mode_override``: Envoy takes body modes from an override
    as they are (NONE is also the unset value), so every field is spelled out. A body read
    comes with its trailers (when it has any, they, not the last chunk, end it)."""
    is_read = response_body_mode != ProcessingMode.NONE
    return ProcessingMode(
        request_header_mode=ProcessingMode.SEND,
        response_header_mode=ProcessingMode.SEND,
        request_body_mode=ProcessingMode.BUFFERED,
        response_body_mode=response_body_mode,
        request_trailer_mode=ProcessingMode.SKIP,
        response_trailer_mode=ProcessingMode.SEND if is_read else ProcessingMode.SKIP,
    )


class ResponseBodies(Enum):
    """Which response bodies the picker reads (BUFFERED configs; every one otherwise).

    A body read gives the first token's time (the router's ``on_first_token``, the
    prompt no longer owed, the TTFT histogram), the ``usage`` at its end (the cached
    prompt tokens counter, the observed answer length) and the answer's true end;
    every chunk costs a message each way. Not read: a non-streamed answer's first
    token is taken at its headers (they come with the body), a streamed one has none,
    usage is not counted, and the request ends when Envoy ends the stream."""

    ALL = "all"  #: every answer with a status below 400
    #: streamed (SSE) answers, where the first token comes long after the headers; every
    #: answer when the router reads observed lengths (``needs_observed_length``)
    AUTO = "auto"
    NONE = "none"  #: no answer


#: mode_override for a response whose body the picker reads (each chunk, as it passes).
OBSERVE_BODY_MODE = _mode(ProcessingMode.STREAMED)
#: mode_override for a response whose body goes to the client without the picker.
HEADERS_ONLY_MODE = _mode(ProcessingMode.NONE)


class HeaderTooLargeError(ValueError):
    """The header map is over the picker's bound."""


def read_headers(header_map: object, max_bytes: int) -> dict[str, str]:
    """A header map's entries as ``{lower-case name: value}`` (a repeated name keeps its last
    value); raises :class:`HeaderTooLargeError` past ``max_bytes`` of names and values."""
    out: dict[str, str] = {}
    total = 0
    for header in header_map.headers:  # type: ignore[attr-defined]
        raw = header.raw_value
        value = raw.decode("utf-8", "replace") if raw else header.value
        total += len(header.key) + len(value)
        if total > max_bytes:
            raise HeaderTooLargeError(f"the headers are larger than {max_bytes} bytes")
        out[header.key.lower()] = value
    return out


def served_endpoint(metadata_context: object) -> str | None:
    """The data plane's ``envoy.lb`` / ``x-gateway-destination-endpoint-served`` entry, if set."""
    filter_metadata = metadata_context.filter_metadata  # type: ignore[attr-defined]
    if METADATA_NAMESPACE not in filter_metadata:
        return None
    fields = filter_metadata[METADATA_NAMESPACE].fields
    if SERVED_KEY not in fields:
        return None
    value = fields[SERVED_KEY].string_value
    return value[:256] or None


def _set_headers(headers: Mapping[str, str]) -> HeaderMutation:
    return HeaderMutation(
        set_headers=[
            HeaderValueOption(
                header=HeaderValue(key=name, raw_value=value.encode()), append_action=_OVERWRITE
            )
            for name, value in headers.items()
        ]
    )


def destination_response(destination: str, headers: Mapping[str, str]) -> ProcessingResponse:
    """The answer to the request headers: the destination in a header (overwriting any the
    client sent) and, with the same value, in the ``envoy.lb`` dynamic metadata; ``headers``
    are set too."""
    return ProcessingResponse(
        request_headers=HeadersResponse(response=_destination_common({**headers}, destination)),
        dynamic_metadata=_destination_metadata(destination),
    )


def _destination_common(headers: dict[str, str], destination: str = "") -> CommonResponse:
    if destination:
        headers[DESTINATION_KEY] = destination
    return CommonResponse(header_mutation=_set_headers(headers))


def _destination_metadata(destination: str) -> Struct:
    metadata = Struct()
    metadata.get_or_create_struct(METADATA_NAMESPACE)[DESTINATION_KEY] = destination
    return metadata


#: The answer to the request headers in BUFFERED mode: go on (Envoy then sends the whole
#: body, still holding the headers). Shared: never mutate it.
CONTINUE_REQUEST_HEADERS = ProcessingResponse(request_headers=HeadersResponse())
#: The answer to a STREAMED response body chunk: pass it on unchanged. Shared, as above.
CONTINUE_RESPONSE_BODY = ProcessingResponse(response_body=BodyResponse())


def buffered_destination_response(destination: str, body: bytes | None) -> ProcessingResponse:
    """The answer to the whole request body (BUFFERED mode): the destination header and
    metadata, set here because Envoy holds the request headers until the body is answered;
    ``body`` (when the picker rewrote it) replaces the body, with its content-length.

    Without a body the message is shared by every request to ``destination`` (built once:
    a handful of endpoints); never mutate it."""
    if body is None:
        return _buffered_destination(destination)
    common = _destination_common({"content-length": str(len(body))}, destination)
    common.body_mutation.body = body
    return ProcessingResponse(
        request_body=BodyResponse(response=common),
        dynamic_metadata=_destination_metadata(destination),
    )


@lru_cache(maxsize=1024)
def _buffered_destination(destination: str) -> ProcessingResponse:
    return ProcessingResponse(
        request_body=BodyResponse(response=_destination_common({}, destination)),
        dynamic_metadata=_destination_metadata(destination),
    )


def request_body_responses(body: bytes, *, is_end: bool) -> list[ProcessingResponse]:
    """``body`` streamed back to Envoy in chunks of at most MAX_BODY_CHUNK_BYTES; the last one
    ends the stream when ``is_end`` (no trailers follow). An empty body is one empty chunk."""
    chunks = [body[i : i + MAX_BODY_CHUNK_BYTES] for i in range(0, len(body), MAX_BODY_CHUNK_BYTES)]
    chunks = chunks or [b""]
    last = len(chunks) - 1
    return [
        ProcessingResponse(request_body=_streamed(chunk, is_end=is_end and i == last))
        for i, chunk in enumerate(chunks)
    ]


def response_body_response(chunk: bytes, *, is_end: bool) -> ProcessingResponse:
    """A response body chunk passed on unchanged (full-duplex mode: Envoy sends on only what
    the processor sends back)."""
    return ProcessingResponse(response_body=_streamed(chunk, is_end=is_end))


def _streamed(chunk: bytes, *, is_end: bool) -> BodyResponse:
    streamed = StreamedBodyResponse(body=chunk, end_of_stream=is_end)
    return BodyResponse(
        response=CommonResponse(body_mutation=BodyMutation(streamed_response=streamed))
    )


def response_headers_response(
    headers: Mapping[str, str], mode: ProcessingMode | None = None
) -> ProcessingResponse:
    """The answer to the response headers: continue, setting ``headers``; ``mode`` (a
    mode_override, BUFFERED configs only) says whether the response body comes too."""
    common = CommonResponse(header_mutation=_set_headers(headers)) if headers else CommonResponse()
    return ProcessingResponse(response_headers=HeadersResponse(response=common), mode_override=mode)


@lru_cache(maxsize=1024)
def shared_response_headers_response(
    endpoint_header: str, name: str | None, observe_body: bool
) -> ProcessingResponse:
    """:func:`response_headers_response` setting ``endpoint_header: name`` (none when
    ``name`` is None) with OBSERVE_BODY_MODE or HEADERS_ONLY_MODE, built once per endpoint
    and mode; never mutate it."""
    mode = OBSERVE_BODY_MODE if observe_body else HEADERS_ONLY_MODE
    return response_headers_response({endpoint_header: name} if name else {}, mode)


def request_trailers_response() -> ProcessingResponse:
    return ProcessingResponse(request_trailers=TrailersResponse())


def response_trailers_response() -> ProcessingResponse:
    return ProcessingResponse(response_trailers=TrailersResponse())


def immediate_response(
    status: int, body: bytes, headers: Iterable[tuple[str, str]], details: str
) -> ProcessingResponse:
    """Envoy answers the client itself with ``status`` and ``body``; nothing goes upstream."""
    mutation = _set_headers(dict(headers))
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=status),
            headers=mutation,
            body=body,
            details=details[:128],
        )
    )
