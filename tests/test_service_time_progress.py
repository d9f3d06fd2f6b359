"""EndpointTimeModel's queue ahead drains while the router waits (issue 35): a request
that finds prompts owed at an endpoint waits only for what is left of them, counted
from when the oldest was sent or the one before it left the queue, at most the oldest
one's own prefill, and never less than its own prefill."""

from __future__ import annotations

import pytest

from longroute.estimators.parallel import endpoint_predictor
from longroute.estimators.service_time import EndpointTimeModel
from longroute.types import Endpoint

ENDPOINT = Endpoint("e", "phi-3-mini", "a100-80g", "r")


def _model() -> EndpointTimeModel:
    return EndpointTimeModel(endpoint_predictor(ENDPOINT), 2048, 0.0)


def test_without_a_clock_the_queue_is_taken_as_not_started() -> None:
    model = _model()
    model.add_pending(16_000, 0, 0.0)
    untimed = model.predict(500, 8_000, 100, None)
    assert model.predict(500, 8_000, 100, None, 0.0, 0.0) == untimed


def test_the_wait_shrinks_by_the_time_the_engine_has_been_at_the_queue() -> None:
    model = _model()
    alone = model.predict(500, 8_000, 100, None).ttft_engine_s
    model.add_pending(16_000, 0, 10.0)
    queued = model.predict(500, 8_000, 100, None, 10.0, 0.0).ttft_engine_s
    wait_s = queued - alone
    assert wait_s > 0.3  # a 16K prompt ahead
    later = model.predict(500, 8_000, 100, None, 10.2, 0.0).ttft_engine_s
    assert later == pytest.approx(queued - 0.2, rel=1e-3)
    # half a round trip out and half back: sent 0.1 s ago over 0.2 s, the engine will
    # have been at it 0.1 s when the request arrives (never longer than since it was sent)
    assert model.predict(500, 8_000, 100, None, 10.1, 0.2).ttft_engine_s == pytest.approx(
        queued - 0.1, rel=1e-3
    )
    # no more credit than the oldest prompt's own prefill: a first token that is late says
    # the engine is slower than priced (or stalled), and the wait stops shrinking there
    head_s = model.queue_progress_s(1e9, 0.0)
    assert 0.3 < head_s < wait_s + 0.1
    at_head = model.predict(500, 8_000, 100, None, 10.0 + head_s, 0.0).ttft_engine_s
    assert model.predict(500, 8_000, 100, None, 15.0, 0.0).ttft_engine_s == at_head
    assert alone <= at_head < alone + 0.1 * wait_s


def test_the_next_prompt_starts_when_the_one_before_it_leaves() -> None:
    model = _model()
    model.add_pending(16_000, 0, 0.0)
    model.add_pending(16_000, 0, 0.1)
    model.start_decoding(16_000, 0, 16_050.0, 50.0, 0.0, 2.0)  # the first one's first token
    fresh = model.predict(500, 8_000, 100, None, 2.0, 0.0).ttft_engine_s
    # sent 1.9 s ago but only just started: the whole of it is still ahead
    untimed = model.predict(500, 8_000, 100, None).ttft_engine_s
    assert fresh == untimed
    assert model.predict(500, 8_000, 100, None, 2.25, 0.0).ttft_engine_s == pytest.approx(
        untimed - 0.25, rel=1e-3
    )
    model.end_pending(16_000, 0, 0.1, 2.5)
    assert model.queue_progress_s(3.0, 0.0) == 0.0  # nothing owed
