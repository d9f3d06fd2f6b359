"""The endpoint picker's protocol state machine over recorded ext_proc message sequences.

Each test feeds an :class:`Exchange` the messages Envoy sends for one HTTP
request (headers, body chunks, end of stream, trailers, the response phases,
or a hang-up at any point) and checks what it answers and what the picker's
accounting (slots in the fleet view, metrics) says afterwards. No network: the
picker's monitoring loops are never started.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from epp_messages import chat_body as body_of
from epp_messages import (
    destination,
    forwarded_body,
    immediate,
    kinds,
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
)
from longroute.epp.exchange import Exchange, Phase, ProtocolError
from longroute.epp.messages import DESTINATION_KEY, MAX_BODY_CHUNK_BYTES
from longroute.epp.picker import EndpointPicker
from longroute.gateway.config import parse_gateway_config
from longroute.gateway.secrets import GatewaySecrets
from longroute.headers import ENDPOINT_HEADER

ADDRESSES = {"a": "127.0.0.1:8001", "b": "127.0.0.1:8002", "c": "127.0.0.1:8003"}
MAX_BODY_BYTES = 256 * 1024


def make_picker(router: str = "prefix-cache", max_concurrency: int = 8) -> EndpointPicker:
    config = parse_gateway_config(
        {
            "backends": [
                {
                    "name": name,
                    "url": f"http://{address}",
                    "model": "llama-3-8b",
                    "max_concurrency": max_concurrency,
                }
                for name, address in ADDRESSES.items()
            ],
            "router": {"name": router},
            "admission": {"max_body_bytes": MAX_BODY_BYTES},
        },
        "test",
    )
    return EndpointPicker(config, GatewaySecrets({}, None))


@pytest.fixture
def picker() -> EndpointPicker:
    return make_picker()


def exchange(picker: EndpointPicker) -> Exchange:
    return Exchange(picker, max_body_bytes=MAX_BODY_BYTES)


def inflight(picker: EndpointPicker) -> dict[str, int]:
    return {n: picker.fleet.state(n).num_inflight_requests for n in ADDRESSES}


def counter(picker: EndpointPicker, name: str, **labels: str) -> float:
    value = picker.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def send_request(ex: Exchange, raw: bytes, num_chunks: int = 1) -> list[Any]:
    """Headers, then ``raw`` in ``num_chunks`` body messages; every answer, in order."""
    out = ex.on_message(request_headers())
    assert out == []
    size = -(-len(raw) // num_chunks)
    for i in range(num_chunks):
        out += ex.on_message(
            request_body(raw[i * size : (i + 1) * size], end_of_stream=i == num_chunks - 1)
        )
    return out


# ---- the request: buffered to its end, picked, passed on ------------------------------


def test_headers_then_chunks_then_pick_with_header_and_metadata(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    raw = body_of()
    assert ex.on_message(request_headers()) == []
    assert ex.on_message(request_body(raw[:10], end_of_stream=False)) == []  # buffered
    out = ex.on_message(request_body(raw[10:], end_of_stream=True))
    assert kinds(out) == ["request_headers", "request_body"]
    header_value, metadata_value = destination(out)
    assert header_value == metadata_value  # the protocol: never two different values
    assert header_value in ADDRESSES.values()
    assert forwarded_body(out) == (raw, [len(raw)], True)
    assert ex.phase is Phase.AWAITING_RESPONSE
    assert sum(inflight(picker).values()) == 1


def test_a_body_over_62000_bytes_goes_back_in_chunks(picker: EndpointPicker) -> None:
    raw = body_of("x" * 150_000)
    out = send_request(exchange(picker), raw, num_chunks=7)
    data, sizes, is_end = forwarded_body(out)
    assert data == raw and is_end
    assert len(sizes) == 3 and max(sizes) == MAX_BODY_CHUNK_BYTES


def test_request_trailers_end_the_body(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    ex.on_message(request_headers())
    assert ex.on_message(request_body(body_of(), end_of_stream=False)) == []
    out = ex.on_message(request_trailers())
    assert kinds(out) == ["request_headers", "request_body", "request_trailers"]
    assert forwarded_body(out)[2] is False  # the trailers end the stream, not the body


def test_the_clients_own_destination_header_is_overwritten(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    ex.on_message(request_headers(extra={DESTINATION_KEY: "10.9.9.9:22"}))
    out = ex.on_message(request_body(body_of(), end_of_stream=True))
    (first,) = [r for r in out if r.WhichOneof("response") == "request_headers"]
    (option,) = first.request_headers.response.header_mutation.set_headers
    assert option.append_action == option.OVERWRITE_IF_EXISTS_OR_ADD
    assert destination(out)[0] != "10.9.9.9:22"


def test_prefix_cache_keeps_a_conversation_on_one_endpoint(picker: EndpointPicker) -> None:
    history = "You are helpful. " * 100
    picked = set()
    for turn in range(5):
        history += f" turn {turn} question and answer."
        ex = exchange(picker)
        out = send_request(ex, body_of(history))
        picked.add(destination(out)[0])
        ex.on_message(response_headers(200))
        ex.on_message(response_body(b'{"usage": {"prompt_tokens": 40}}', end_of_stream=True))
    assert len(picked) == 1
    assert inflight(picker) == dict.fromkeys(ADDRESSES, 0)


# ---- the response: observed, passed on, accounted ----------------------------------


def test_streamed_response_first_token_and_completion(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    out = send_request(ex, body_of(stream=True))
    name = picker.names_by_address[destination(out)[0]]
    (answer,) = ex.on_message(response_headers(200))
    set_headers = answer.response_headers.response.header_mutation.set_headers
    assert {h.header.key: h.header.raw_value.decode() for h in set_headers} == {
        ENDPOINT_HEADER: name
    }
    assert picker.fleet.state(name).num_queued_tokens > 0  # the prompt is still owed
    events = [b'data: {"choices": []}\n\n', b"data: [DONE]\n\n"]
    (echo,) = ex.on_message(response_body(events[0], end_of_stream=False))
    streamed = echo.response_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (events[0], False)
    model = picker.backends[name].model
    assert counter(picker, "longroute_ttft_seconds_count", model=model, endpoint=name) == 1
    assert inflight(picker)[name] == 1
    usage = b'data: {"usage": {"prompt_tokens": 100, '
    usage += b'"prompt_tokens_details": {"cached_tokens": 64}}}\n\n'
    ex.on_message(response_body(usage, end_of_stream=False))
    (last,) = ex.on_message(response_body(events[1], end_of_stream=True))
    assert last.response_body.response.body_mutation.streamed_response.end_of_stream
    assert ex.is_done and inflight(picker)[name] == 0
    labels = {"route": "/v1/chat/completions", "model": "llama-3-8b", "endpoint": name}
    assert counter(picker, "longroute_requests_total", **labels, code="200") == 1
    assert counter(picker, "longroute_epp_prompt_tokens_total", endpoint=name, kind="cached") == 64
    uncached = counter(picker, "longroute_epp_prompt_tokens_total", endpoint=name, kind="uncached")
    assert uncached == 36


def test_response_trailers_and_headers_only_responses_finish(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    send_request(ex, body_of())
    ex.on_message(response_headers(200))
    ex.on_message(response_body(b"{}", end_of_stream=False))
    assert kinds(ex.on_message(request_trailers_as_response())) == ["response_trailers"]
    assert ex.is_done and sum(inflight(picker).values()) == 0
    ex = exchange(picker)
    send_request(ex, body_of())
    ex.on_message(response_headers(503, end_of_stream=True))  # e.g. Envoy's own local reply
    assert ex.is_done and sum(inflight(picker).values()) == 0


def request_trailers_as_response() -> Any:
    from envoy.service.ext_proc.v3.external_processor_pb2 import HttpTrailers, ProcessingRequest

    return ProcessingRequest(response_trailers=HttpTrailers())


# ---- hang-ups ----------------------------------------------------------------------


def test_client_hangs_up_mid_body(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    ex.on_message(request_headers())
    assert ex.on_message(request_body(body_of()[:20], end_of_stream=False)) == []
    ex.close()  # the stream ends: Envoy saw the client go
    assert ex.is_done and sum(inflight(picker).values()) == 0
    assert counter(picker, "longroute_errors_total", kind="client_disconnect") == 1
    ex.close()  # idempotent
    assert counter(picker, "longroute_errors_total", kind="client_disconnect") == 1


@pytest.mark.parametrize("stage", ["picked", "first_byte"])
def test_client_hangs_up_after_the_pick_frees_the_slot(picker: EndpointPicker, stage: str) -> None:
    ex = exchange(picker)
    name = picker.names_by_address[destination(send_request(ex, body_of()))[0]]
    if stage == "first_byte":
        ex.on_message(response_headers(200))
        ex.on_message(response_body(b"data: {}\n\n", end_of_stream=False))
    assert inflight(picker)[name] == 1
    ex.close()
    assert inflight(picker)[name] == 0
    labels = {"route": "/v1/chat/completions", "model": "llama-3-8b", "endpoint": name}
    assert counter(picker, "longroute_requests_total", **labels, code="499") == 1


# ---- refusals: ImmediateResponse ---------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"{not json", 400),
        (b"\xff\xfe", 400),
        (b"[1, 2]", 400),
        (json.dumps({"model": "llama-3-8b"}).encode(), 400),
        (b"[" * 100_000 + b"]" * 100_000, 400),
        (body_of(model="no-such-model"), 404),
    ],
)
def test_invalid_bodies_are_refused(picker: EndpointPicker, raw: bytes, status: int) -> None:
    ex = exchange(picker)
    code, headers, body = immediate(send_request(ex, raw))
    assert code == status and headers["content-type"] == "application/json"
    assert "error" in json.loads(body)
    assert ex.is_done and sum(inflight(picker).values()) == 0
    assert ex.on_message(response_headers(200)) == []  # nothing more to say


def test_an_oversized_body_is_refused_before_its_end(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    ex.on_message(request_headers())
    out: list[Any] = []
    for _ in range(5):
        out += ex.on_message(request_body(b"x" * 60_000, end_of_stream=False))
    assert immediate(out)[0] == 413
    assert ex.is_done


def test_oversized_headers_are_refused(picker: EndpointPicker) -> None:
    ex = Exchange(picker, max_body_bytes=MAX_BODY_BYTES, max_header_bytes=1024)
    out = ex.on_message(request_headers(extra={"x-big": "y" * 2000}))
    assert immediate(out)[0] == 431


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [("/v1/models", "GET", 200), ("/admin", "GET", 404), ("/v1/chat/completions", "GET", 405)],
)
def test_paths_answered_at_the_headers(
    picker: EndpointPicker, path: str, method: str, status: int
) -> None:
    ex = exchange(picker)
    code, _, body = immediate(ex.on_message(request_headers(path, method, end_of_stream=True)))
    assert code == status
    if status == 200:
        assert json.loads(body)["data"][0]["id"] == "llama-3-8b"


def test_a_post_without_a_body_is_a_bad_request(picker: EndpointPicker) -> None:
    ex = exchange(picker)
    assert immediate(ex.on_message(request_headers(end_of_stream=True)))[0] == 400


def test_no_ready_endpoint_is_a_503(picker: EndpointPicker) -> None:
    for name in ADDRESSES:
        picker.fleet.set_health(name, False)
    code, _, body = immediate(send_request(exchange(picker), body_of()))
    assert code == 503
    assert json.loads(body)["error"]["code"] == "no_healthy_backend"


def test_every_backend_full_is_shed_with_a_429() -> None:
    picker = make_picker(max_concurrency=1)
    for _ in ADDRESSES:  # one request fills each backend
        out = send_request(exchange(picker), body_of())
        assert kinds(out) == ["request_headers", "request_body"]
    code, headers, _ = immediate(send_request(exchange(picker), body_of()))
    assert code == 429 and headers["retry-after"] == "1"


def test_messages_out_of_order_are_protocol_errors(picker: EndpointPicker) -> None:
    with pytest.raises(ProtocolError):
        exchange(picker).on_message(request_body(b"{}", end_of_stream=True))
    with pytest.raises(ProtocolError):
        exchange(picker).on_message(response_headers(200))
    ex = exchange(picker)
    ex.on_message(request_headers())
    with pytest.raises(ProtocolError):
        ex.on_message(response_body(b"x", end_of_stream=True))
