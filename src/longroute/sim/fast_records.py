"""A request and its record built at half the cost of their dataclass ``__init__``.

The simulator builds one :class:`~longroute.types.Request` per turn it issues and one
:class:`~longroute.metrics.records.RequestRecord` per answer. Both are frozen slotted
dataclasses, whose generated ``__init__`` sets each of their 20 and 21 fields through
``object.__setattr__`` by name (2.4 and 3.1 us here). Setting them through the slots'
own descriptors gives equal objects for about half of that, as
:mod:`longroute.routing._snapshot` does for ``EndpointState``. ``new_request`` still
runs ``Request.__post_init__``, so a bad request fails as it would have. The field lists
and defaults are checked at import: a field added to either class fails here rather than
leaving a slot unset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longroute.metrics.records import RequestRecord
from longroute.types import SLO, Language, Request

_REQUEST_FIELDS = (
    "request_id", "arrival_s", "num_prompt_tokens", "num_output_tokens", "block_hashes",
    "block_size_tokens", "max_output_tokens", "model", "language", "task", "session_id",
    "program_id", "stage", "workflow", "prompt", "priority", "slo", "attempt",
    "tried_endpoints", "tried_models",
)  # fmt: skip
# the fields new_request leaves at their defaults, with the defaults it sets
_REQUEST_DEFAULTS: dict[str, Any] = {
    "program_id": None, "stage": None, "workflow": None, "prompt": None, "priority": None,
    "attempt": 1, "tried_endpoints": (), "tried_models": (),
}  # fmt: skip
_RECORD_FIELDS = (
    "request_id", "session_id", "router", "endpoint", "model", "region", "arrival_s",
    "dispatch_s", "first_token_s", "finish_s", "num_prompt_tokens", "num_cached_tokens",
    "num_output_tokens", "attempt", "num_preemptions", "slo", "query_id", "is_correct",
    "program_id", "stage", "queue_s",
)  # fmt: skip


def _check() -> None:
    fields = dataclasses.fields(Request)
    defaults = {f.name: f.default for f in fields if f.name in _REQUEST_DEFAULTS}
    if tuple(f.name for f in fields) != _REQUEST_FIELDS or defaults != _REQUEST_DEFAULTS:
        raise ImportError("Request's fields changed: update longroute.sim.fast_records")
    if tuple(f.name for f in dataclasses.fields(RequestRecord)) != _RECORD_FIELDS:
        raise ImportError("RequestRecord's fields changed: update longroute.sim.fast_records")
    if getattr(RequestRecord, "__post_init__", None) is not None:
        raise ImportError("RequestRecord gained a __post_init__: update sim.fast_records")


_check()
_new = object.__new__
_post_init = Request.__post_init__
(_q_id, _q_arrival, _q_prompt, _q_output, _q_hashes, _q_block, _q_max, _q_model, _q_language,
 _q_task, _q_session, _q_program, _q_stage, _q_workflow, _q_text, _q_priority, _q_slo,
 _q_attempt, _q_endpoints, _q_models) = (
    getattr(Request, n).__set__ for n in _REQUEST_FIELDS
)  # fmt: skip
(_r_id, _r_session, _r_router, _r_endpoint, _r_model, _r_region, _r_arrival, _r_dispatch,
 _r_first, _r_finish, _r_prompt, _r_cached, _r_output, _r_attempt, _r_preemptions, _r_slo,
 _r_query, _r_correct, _r_program, _r_stage, _r_queue) = (
    getattr(RequestRecord, n).__set__ for n in _RECORD_FIELDS
)  # fmt: skip


def new_request(
    request_id: str,
    arrival_s: float,
    num_prompt_tokens: int,
    num_output_tokens: int,
    block_hashes: tuple[int, ...],
    block_size_tokens: int,
    max_output_tokens: int | None,
    model: str | None,
    language: Language | None,
    task: str | None,
    session_id: str | None,
    slo: SLO | None,
) -> Request:
    """``Request(...)`` with these fields (keyword names alike) and the rest at their
    defaults: a first attempt, no workflow, prompt text or priority (module doc)."""
    request: Request = _new(Request)
    _q_id(request, request_id)
    _q_arrival(request, arrival_s)
    _q_prompt(request, num_prompt_tokens)
    _q_output(request, num_output_tokens)
    _q_hashes(request, block_hashes)
    _q_block(request, block_size_tokens)
    _q_max(request, max_output_tokens)
    _q_model(request, model)
    _q_language(request, language)
    _q_task(request, task)
    _q_session(request, session_id)
    _q_program(request, None)
    _q_stage(request, None)
    _q_workflow(request, None)
    _q_text(request, None)
    _q_priority(request, None)
    _q_slo(request, slo)
    _q_attempt(request, 1)
    _q_endpoints(request, ())
    _q_models(request, ())
    _post_init(request)
    return request


def new_record(
    request_id: str,
    session_id: str | None,
    router: str,
    endpoint: str,
    model: str,
    region: str | None,
    arrival_s: float,
    dispatch_s: float,
    first_token_s: float,
    finish_s: float,
    num_prompt_tokens: int,
    num_cached_tokens: int,
    num_output_tokens: int,
    attempt: int,
    num_preemptions: int,
    slo: SLO | None,
    query_id: str | None,
    is_correct: bool | None,
    program_id: str | None,
    stage: int | None,
    queue_s: float | None,
) -> RequestRecord:
    """``RequestRecord(...)`` with every field given, positionally (module doc)."""
    record: RequestRecord = _new(RequestRecord)
    _r_id(record, request_id)
    _r_session(record, session_id)
    _r_router(record, router)
    _r_endpoint(record, endpoint)
    _r_model(record, model)
    _r_region(record, region)
    _r_arrival(record, arrival_s)
    _r_dispatch(record, dispatch_s)
    _r_first(record, first_token_s)
    _r_finish(record, finish_s)
    _r_prompt(record, num_prompt_tokens)
    _r_cached(record, num_cached_tokens)
    _r_output(record, num_output_tokens)
    _r_attempt(record, attempt)
    _r_preemptions(record, num_preemptions)
    _r_slo(record, slo)
    _r_query(record, query_id)
    _r_correct(record, is_correct)
    _r_program(record, program_id)
    _r_stage(record, stage)
    _r_queue(record, queue_s)
    return record
