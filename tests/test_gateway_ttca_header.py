"""``x-longroute-predicted-ttft-ms``: the router's predicted TTFT on every answer it made one for.

Streamed and whole answers carry it (integer milliseconds, rounded) when the
routing decision has ``predicted_ttft_s`` for the backend that answered; a
router that predicts nothing adds no header and costs no copy of the backend's
fixed headers.
"""

from __future__ import annotations

import math

from longroute.gateway.admission import Grant
from longroute.gateway.observe import RequestTrace
from longroute.gateway.proxy import _with_prediction
from longroute.headers import ENDPOINT_HEADER, PREDICTED_CACHED_HEADER, PREDICTED_TTFT_HEADER
from longroute.types import Request, RouteDecision
from test_gateway import FakeBackend, Knobs, async_test, running_fleet

PROFILE = "llama-3-8b"


def _grant(endpoint: str, decision: RouteDecision) -> Grant:
    return Grant(endpoint, decision, 1e-6, Request("r", 0.0, 100, 8))


TRACE = RequestTrace("r", "/v1/chat/completions", 0.0)  # no cached-token prediction


def test_header_is_the_prediction_in_rounded_milliseconds() -> None:
    fixed = {ENDPOINT_HEADER: "a"}
    headers = _with_prediction(
        fixed, _grant("a", RouteDecision("a", predicted_ttft_s=0.1234)), TRACE
    )
    assert headers == {ENDPOINT_HEADER: "a", PREDICTED_TTFT_HEADER: "123"}
    assert fixed == {ENDPOINT_HEADER: "a"}  # the backend's own dict is not changed
    rounded_up = _with_prediction(
        fixed, _grant("a", RouteDecision("a", predicted_ttft_s=0.0456)), TRACE
    )
    assert rounded_up[PREDICTED_TTFT_HEADER] == "46"


def test_no_header_and_no_copy_without_a_prediction_for_the_backend() -> None:
    fixed = {ENDPOINT_HEADER: "b"}
    assert _with_prediction(fixed, _grant("b", RouteDecision("b")), TRACE) is fixed
    # the router chose a (full), admission sent it to b: a's prediction is not b's
    assert (
        _with_prediction(fixed, _grant("b", RouteDecision("a", predicted_ttft_s=0.1)), TRACE)
        is fixed
    )
    for bad in (math.inf, math.nan):
        assert _with_prediction(
            fixed, _grant("b", RouteDecision("b", predicted_ttft_s=bad)), TRACE
        ) is (fixed)


@async_test
async def test_ttca_answers_carry_the_predicted_ttft_streamed_and_whole() -> None:
    a, b = FakeBackend("a", model=PROFILE), FakeBackend("b", model=PROFILE)
    extra = {"hardware": "h100"}
    # some 5,000 tokens at 4 characters a token, tens of ms on an H100; each its own, so
    # that no prefix is cached (a cached prompt is predicted a few ms)
    prompts = [f"{i} " + "word " * 4000 for i in range(4)]
    async with running_fleet(a, b, router={"name": "ttca"}, backend_extra=extra) as f:
        replies = [
            await f.chat(prompt, model=PROFILE, stream=stream, max_tokens=8)
            for prompt, stream in zip(prompts, (True, False, True, False), strict=True)
        ]
    for (status, headers, body), stream in zip(replies, (True, False, True, False), strict=True):
        assert status == 200
        assert body.startswith(b"data: ") == stream
        predicted_ms = int(headers[PREDICTED_TTFT_HEADER])
        assert 5 <= predicted_ms <= 1000, predicted_ms


@async_test
async def test_routers_that_predict_nothing_add_no_header() -> None:
    a, b = FakeBackend("a", Knobs()), FakeBackend("b", Knobs())
    async with running_fleet(a, b, router={"name": "least-load"}) as f:
        replies = [await f.chat(stream=stream) for stream in (True, False)]
    for status, headers, _ in replies:
        assert status == 200 and ENDPOINT_HEADER in headers
        assert PREDICTED_TTFT_HEADER not in headers


def test_the_cached_token_prediction_rides_along_when_there_is_one() -> None:
    fixed = {ENDPOINT_HEADER: "a"}
    trace = RequestTrace("r", "/v1/chat/completions", 0.0)
    trace.predicted_cached_tokens = 896
    alone = _with_prediction(fixed, _grant("a", RouteDecision("a")), trace)
    assert alone == {ENDPOINT_HEADER: "a", PREDICTED_CACHED_HEADER: "896"}
    both = _with_prediction(fixed, _grant("a", RouteDecision("a", predicted_ttft_s=0.05)), trace)
    assert both == {
        ENDPOINT_HEADER: "a",
        PREDICTED_TTFT_HEADER: "50",
        PREDICTED_CACHED_HEADER: "896",
    }
    assert fixed == {ENDPOINT_HEADER: "a"}
