"""The endpoint picker over the BUFFERED config ``epp_config()`` writes: fewer messages.

Envoy sends the request headers (answered ``CONTINUE`` at once), the whole body
in one message (answered with the destination, the body replaced only where the
picker rewrote it), the response headers (answered with a ``mode_override``
saying whether the response body comes to the picker), then the response body
chunks where asked for. What each ``--response-bodies`` policy reads, and what a
request that was not read is accounted as, is checked here message by message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpHeaders, ProcessingRequest

from epp_messages import chat_body, destination, kinds, request_body, request_headers
from epp_messages import response_body as response_chunk
from longroute.epp import messages
from longroute.epp.exchange import Exchange, Phase, ResponseBodies
from longroute.epp.picker import EndpointPicker
from longroute.headers import ENDPOINT_HEADER
from test_epp_exchange import ADDRESSES, MAX_BODY_BYTES, counter, inflight, make_picker

SSE = "text/event-stream"
USAGE = b'data: {"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}}}'


@pytest.fixture
def picker() -> EndpointPicker:
    return make_picker()


def buffered_headers(**kwargs: Any) -> ProcessingRequest:
    """Request headers as Envoy sends them first, with the filter's protocol config."""
    message = request_headers(**kwargs)
    message.protocol_config.request_body_mode = ProcessingMode.BUFFERED
    message.protocol_config.response_body_mode = ProcessingMode.STREAMED
    return message


def response_headers(status: int = 200, content_type: str = "application/json") -> Any:
    pairs = {":status": str(status), "content-type": content_type}
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return ProcessingRequest(response_headers=HttpHeaders(headers=HeaderMap(headers=values)))


def routed(
    picker: EndpointPicker, policy: ResponseBodies = ResponseBodies.AUTO, raw: bytes | None = None
) -> tuple[Exchange, list[Any]]:
    ex = Exchange(picker, max_body_bytes=MAX_BODY_BYTES, response_bodies=policy)
    assert ex.on_message(buffered_headers()) == [messages.CONTINUE_REQUEST_HEADERS]
    out = ex.on_message(request_body(chat_body() if raw is None else raw, end_of_stream=True))
    return ex, out


def override(answer: Any) -> int:
    """The response body mode an answer to the response headers asks for."""
    assert answer.HasField("mode_override")
    mode = answer.mode_override
    assert mode.request_body_mode == ProcessingMode.BUFFERED  # body modes are taken as given
    return int(mode.response_body_mode)


def requests_total(picker: EndpointPicker, name: str, code: str) -> float:
    labels = {"route": "/v1/chat/completions", "model": "llama-3-8b", "endpoint": name}
    return counter(picker, "longroute_requests_total", **labels, code=code)


def ttft_count(picker: EndpointPicker, name: str) -> float:
    return counter(picker, "longroute_ttft_seconds_count", model="llama-3-8b", endpoint=name)


def test_the_body_answer_sets_the_destination_without_sending_the_body_back(
    picker: EndpointPicker,
) -> None:
    ex, out = routed(picker)
    assert kinds(out) == ["request_body"]
    (answer,) = out
    common = answer.request_body.response
    assert not common.HasField("body_mutation")  # the body goes on as Envoy holds it
    (option,) = common.header_mutation.set_headers
    assert option.header.key == messages.DESTINATION_KEY
    metadata = answer.dynamic_metadata.fields[messages.METADATA_NAMESPACE].struct_value
    value = metadata.fields[messages.DESTINATION_KEY].string_value
    assert option.header.raw_value.decode() == value and value in ADDRESSES.values()
    assert ex.phase is Phase.AWAITING_RESPONSE and sum(inflight(picker).values()) == 1


def test_a_rewritten_body_replaces_the_original_with_its_length(picker: EndpointPicker) -> None:
    raw = chat_body(priority=5)  # the client's priority field is not passed on
    _, (answer,) = routed(picker, raw=raw)
    common = answer.request_body.response
    sent = common.body_mutation.body
    assert sent and "priority" not in json.loads(sent)
    options = common.header_mutation.set_headers
    headers = {o.header.key: o.header.raw_value.decode() for o in options}
    assert headers["content-length"] == str(len(sent))
    assert headers[messages.DESTINATION_KEY] in ADDRESSES.values()


def test_a_body_over_the_limit_is_refused_and_a_bodiless_post_routed_at_its_headers(
    picker: EndpointPicker,
) -> None:
    _, out = routed(picker, raw=b"x" * (MAX_BODY_BYTES + 1))
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == 413
    ex = Exchange(picker, max_body_bytes=MAX_BODY_BYTES)
    out = ex.on_message(buffered_headers(end_of_stream=True))
    assert kinds(out) == ["immediate_response"]  # no body: refused (400) like serve does
    assert out[0].immediate_response.status.code == 400


def test_envoys_own_413_for_a_body_over_its_buffer_passes_and_counts(
    picker: EndpointPicker,
) -> None:
    """Envoy refuses a body over ``per_connection_buffer_limit_bytes`` itself: the picker sees
    the response headers of that answer instead of the body, and lets it pass."""
    ex = Exchange(picker, max_body_bytes=MAX_BODY_BYTES)
    assert ex.on_message(buffered_headers()) == [messages.CONTINUE_REQUEST_HEADERS]
    (answer,) = ex.on_message(response_headers(413, "text/plain"))
    assert kinds([answer]) == ["response_headers"]
    assert override(answer) == ProcessingMode.NONE and ex.is_done
    assert counter(picker, "longroute_errors_total", kind="body_too_large") == 1
    ex.close()
    assert inflight(picker) == dict.fromkeys(ADDRESSES, 0)


def test_auto_passes_a_non_streamed_answer_and_finishes_it_at_the_streams_end(
    picker: EndpointPicker,
) -> None:
    ex, out = routed(picker)
    name = picker.names_by_address[destination_of(out)]
    (answer,) = ex.on_message(response_headers(200))
    assert override(answer) == ProcessingMode.NONE
    set_headers = answer.response_headers.response.header_mutation.set_headers
    assert {h.header.key: h.header.raw_value.decode() for h in set_headers} == {
        ENDPOINT_HEADER: name
    }
    assert ex.phase is Phase.AWAITING_END
    assert ttft_count(picker, name) == 1  # its body came with its headers
    assert inflight(picker)[name] == 1  # not finished before the stream ends
    ex.close()
    assert inflight(picker)[name] == 0 and requests_total(picker, name, "200") == 1


def test_auto_reads_a_streamed_answer_chunk_by_chunk(picker: EndpointPicker) -> None:
    ex, out = routed(picker)
    name = picker.names_by_address[destination_of(out)]
    (answer,) = ex.on_message(response_headers(200, SSE))
    assert override(answer) == ProcessingMode.STREAMED
    assert answer.mode_override.response_trailer_mode == ProcessingMode.SEND
    assert ttft_count(picker, name) == 0  # the headers come before the first token
    first = ex.on_message(response_chunk(b'data: {"choices": []}\n\n', end_of_stream=False))
    assert first == [messages.CONTINUE_RESPONSE_BODY]  # passed on unchanged
    assert ttft_count(picker, name) == 1
    ex.on_message(response_chunk(USAGE + b"\n\n", end_of_stream=True))
    assert ex.is_done and inflight(picker)[name] == 0
    assert counter(picker, "longroute_epp_prompt_tokens_total", endpoint=name, kind="cached") == 64


def test_all_reads_a_non_streamed_answers_usage(picker: EndpointPicker) -> None:
    ex, out = routed(picker, ResponseBodies.ALL)
    name = picker.names_by_address[destination_of(out)]
    (answer,) = ex.on_message(response_headers(200))
    assert override(answer) == ProcessingMode.STREAMED
    ex.on_message(response_chunk(USAGE[len(b"data: ") :], end_of_stream=True))
    assert ex.is_done and requests_total(picker, name, "200") == 1
    assert counter(picker, "longroute_epp_prompt_tokens_total", endpoint=name, kind="cached") == 64


def test_none_reads_no_answer_and_a_streamed_one_has_no_first_token(
    picker: EndpointPicker,
) -> None:
    ex, out = routed(picker, ResponseBodies.NONE)
    name = picker.names_by_address[destination_of(out)]
    (answer,) = ex.on_message(response_headers(200, SSE))
    assert override(answer) == ProcessingMode.NONE
    ex.close()
    assert ttft_count(picker, name) == 0 and requests_total(picker, name, "200") == 1


def test_an_error_answer_is_not_read_and_counts_as_failed(picker: EndpointPicker) -> None:
    ex, out = routed(picker, ResponseBodies.ALL)
    name = picker.names_by_address[destination_of(out)]
    (answer,) = ex.on_message(response_headers(503))
    assert override(answer) == ProcessingMode.NONE
    ex.close()
    assert ttft_count(picker, name) == 0 and requests_total(picker, name, "503") == 1
    assert inflight(picker)[name] == 0


def test_a_hang_up_before_the_response_frees_the_slot_as_failed(picker: EndpointPicker) -> None:
    ex, out = routed(picker)
    name = picker.names_by_address[destination_of(out)]
    ex.close()
    assert inflight(picker)[name] == 0 and requests_total(picker, name, "499") == 1


def test_answers_to_the_response_headers_are_shared_per_endpoint() -> None:
    build = messages.shared_response_headers_response
    assert build(ENDPOINT_HEADER, "a", True) is build(ENDPOINT_HEADER, "a", True)
    assert build(ENDPOINT_HEADER, "a", True) is not build(ENDPOINT_HEADER, "a", False)
    assert messages.buffered_destination_response("10.0.0.1:80", None) is (
        messages.buffered_destination_response("10.0.0.1:80", None)
    )


def test_auto_reads_every_answer_for_a_router_that_learns_lengths() -> None:
    from longroute.epp.server import ExtProcService

    assert ExtProcService(make_picker()).response_bodies is ResponseBodies.AUTO
    picker = make_picker("ttca")
    assert ExtProcService(picker).response_bodies is ResponseBodies.ALL
    assert ExtProcService(picker, ResponseBodies.NONE).response_bodies is ResponseBodies.NONE


def destination_of(out: list[Any]) -> str:
    (answer,) = out
    fields = answer.dynamic_metadata.fields[messages.METADATA_NAMESPACE].struct_value.fields
    return str(fields[messages.DESTINATION_KEY].string_value)


def test_the_full_duplex_config_is_still_understood(picker: EndpointPicker) -> None:
    ex = Exchange(picker, max_body_bytes=MAX_BODY_BYTES)
    assert ex.on_message(request_headers()) == []  # no protocol_config: full duplex
    out = ex.on_message(request_body(chat_body(), end_of_stream=True))
    assert kinds(out) == ["request_headers", "request_body"]
    assert destination(out)[0] in ADDRESSES.values()
