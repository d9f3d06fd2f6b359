"""Recorded ext_proc message sequences, as Envoy sends them, for the endpoint picker's tests."""

from __future__ import annotations

import json
from typing import Any

from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    HttpTrailers,
    ProcessingRequest,
)

from longroute.epp.messages import DESTINATION_KEY, METADATA_NAMESPACE

CHAT = "/v1/chat/completions"


def header_map(headers: dict[str, str]) -> HeaderMap:
    # Envoy sends values as raw_value bytes
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()])


def request_headers(
    path: str = CHAT,
    method: str = "POST",
    *,
    end_of_stream: bool = False,
    extra: dict[str, str] | None = None,
) -> ProcessingRequest:
    headers = {":method": method, ":path": path, ":authority": "gw", ":scheme": "http"}
    headers.update({"content-type": "application/json", **(extra or {})})
    return ProcessingRequest(
        request_headers=HttpHeaders(headers=header_map(headers), end_of_stream=end_of_stream)
    )


def request_body(chunk: bytes, *, end_of_stream: bool) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=chunk, end_of_stream=end_of_stream))


def request_trailers() -> ProcessingRequest:
    return ProcessingRequest(request_trailers=HttpTrailers(trailers=header_map({"x-t": "1"})))


def response_headers(status: int = 200, *, end_of_stream: bool = False) -> ProcessingRequest:
    headers = header_map({":status": str(status), "content-type": "application/json"})
    return ProcessingRequest(
        response_headers=HttpHeaders(headers=headers, end_of_stream=end_of_stream)
    )


def response_body(chunk: bytes, *, end_of_stream: bool) -> ProcessingRequest:
    return ProcessingRequest(response_body=HttpBody(body=chunk, end_of_stream=end_of_stream))


def chat_body(content: str = "Hello there!", *, stream: bool = False, **extra: Any) -> bytes:
    body = {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "stream": stream,
        **extra,
    }
    return json.dumps(body).encode()


def kinds(responses: list[Any]) -> list[str]:
    return [r.WhichOneof("response") for r in responses]


def destination(responses: list[Any]) -> tuple[str, str]:
    """The destination in the header mutation and in the dynamic metadata of the answer."""
    (first,) = [r for r in responses if r.WhichOneof("response") == "request_headers"]
    header_values = {
        h.header.key: (h.header.raw_value.decode() or h.header.value)
        for h in first.request_headers.response.header_mutation.set_headers
    }
    metadata = first.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value
    return header_values[DESTINATION_KEY], metadata.fields[DESTINATION_KEY].string_value


def forwarded_body(responses: list[Any]) -> tuple[bytes, list[int], bool]:
    """The request body streamed back: the bytes, each chunk's size, the last end_of_stream."""
    streamed = [
        r.request_body.response.body_mutation.streamed_response
        for r in responses
        if r.WhichOneof("response") == "request_body"
    ]
    data = b"".join(s.body for s in streamed)
    return data, [len(s.body) for s in streamed], streamed[-1].end_of_stream


def immediate(responses: list[Any]) -> tuple[int, dict[str, str], bytes]:
    (only,) = responses
    answer = only.immediate_response
    headers = {
        h.header.key: (h.header.raw_value.decode() or h.header.value)
        for h in answer.headers.set_headers
    }
    return int(answer.status.code), headers, answer.body
