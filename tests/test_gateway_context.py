"""Context reuse in the gateway: the ``documents`` extension, the prompt, and cache hits.

Unit tests cover parsing and its 400s, block ids, the prompt template, the
conversation store and :class:`ContextReuse`; an in-process gateway checks
pass-through and the HTTP errors; an end-to-end test sends the same stream of
RAG requests through two fresh emulator fleets (reuse on, and documents sent
as given) and compares the emulator's cached prompt tokens.
"""

from __future__ import annotations

import json
import random
import sys
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from longroute.context import Reference
from longroute.demo.fleet import FleetPlan, Replica, start_fleets
from longroute.gateway.config import ContextReuseConfig, parse_gateway_config
from longroute.gateway.context_prompt import (
    CONTEXT_PREAMBLE,
    ConversationTurns,
    HistoryMatch,
    TurnRecord,
    document_block,
    render_context,
    with_context,
)
from longroute.gateway.errors import GatewayError
from longroute.gateway.intake import ContextReuse
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.parse import (
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    Document,
    ParsedBody,
    parse_body,
    parse_context_fields,
)
from longroute.gateway.prompt import chat_prompt_text
from longroute.launcher import Launcher
from longroute.routing.fleet_view import FleetView
from longroute.types import Endpoint
from test_gateway import FakeBackend, async_test, running_fleet

MODEL = "m"


def _doc(name: str, text: str | None = None) -> dict[str, str]:
    return {"id": name, "text": text if text is not None else f"text of {name}"}


def _chat(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages or [{"role": "user", "content": "q"}], **extra}


# ---- parsing ------------------------------------------------------------------------------


def test_context_fields_are_parsed_in_order() -> None:
    assert parse_context_fields(_chat(), ROUTE_CHAT, 8) is None
    body = _chat(documents=[_doc("b"), _doc("a", "")], conversation_id="c1")
    fields = parse_context_fields(body, ROUTE_CHAT, 8)
    assert fields is not None
    assert fields.documents == (Document("b", "text of b"), Document("a", ""))
    assert fields.conversation_id == "c1"
    empty = parse_context_fields(_chat(documents=[]), ROUTE_CHAT, 8)
    assert empty is not None and (empty.documents, empty.conversation_id) == ((), None)


MALFORMED: dict[str, tuple[dict[str, Any], str, str]] = {
    # case: (extension fields, the param named, a phrase of the message)
    "not a list": ({"documents": {"id": "a"}}, "documents", "got dict"),
    "null": ({"documents": None}, "documents", "got null"),
    "too many": ({"documents": [_doc(f"d{i}") for i in range(4)]}, "documents", "at most 3"),
    "entry not an object": ({"documents": [_doc("a"), "b"]}, "documents[1]", "got str"),
    "missing id": ({"documents": [{"text": "t"}]}, "documents[0].id", "got null"),
    "empty id": ({"documents": [{"id": "", "text": "t"}]}, "documents[0].id", "got 0 char"),
    "numeric id": ({"documents": [{"id": 7, "text": "t"}]}, "documents[0].id", "got int"),
    "missing text": ({"documents": [{"id": "a"}]}, "documents[0].text", "got null"),
    "unknown key": ({"documents": [{**_doc("a"), "score": 1}]}, "documents[0]", "score"),
    "duplicate id": (
        {"documents": [_doc("a"), _doc("b"), _doc("a", "other")]},
        "documents[2].id",
        "repeats documents[0].id",
    ),
    "bad conversation": ({"documents": [], "conversation_id": 5}, "conversation_id", "got int"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_context_fields_are_400s_naming_the_field(case: str) -> None:
    extension, param, phrase = MALFORMED[case]
    with pytest.raises(GatewayError) as info:
        parse_context_fields(_chat(**extension), ROUTE_CHAT, 3)
    error = json.loads(info.value.body())["error"]
    assert info.value.status == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert phrase in error["message"], error["message"]


def test_documents_on_text_completions_are_refused() -> None:
    with pytest.raises(GatewayError) as info:
        parse_context_fields({"model": MODEL, "prompt": "x", "documents": []}, ROUTE_COMPLETIONS, 3)
    assert info.value.status == 400 and info.value.param == "documents"
    assert ROUTE_CHAT in info.value.message


# ---- block ids and the prompt template ------------------------------------------------------


def test_block_ids_are_stable_and_depend_on_id_and_text() -> None:
    block = document_block(Document("a", "alpha"))
    assert block == document_block(Document("a", "alpha"))
    assert 0 <= block < 2**63
    assert block == 0x24E9716B471C4D24  # the same in every process and on every machine
    others = {
        document_block(Document("a", "alpha!")),
        document_block(Document("b", "alpha")),
        document_block(Document("ab", "lpha")),  # id and text are delimited
    }
    assert block not in others and len(others) == 3


def test_context_renders_documents_references_and_the_order_annotation() -> None:
    docs = {1: Document("x", "X text"), 2: Document("y", "Y text"), 3: Document("z", "Z text")}
    # relevance order (3, 1, 2); planned (1, 3, 2) with 3 seen in an earlier turn
    text = render_context((3, 1, 2), (1, Reference(3), 2), docs)
    assert text == (
        f"{CONTEXT_PREAMBLE}\n\n[Doc x] X text\n\n"
        "Please refer to [Doc z] in the previous conversation.\n\n[Doc y] Y text\n\n"
        "Please read the context in the following priority order: "
        "[Doc z] > [Doc x] > [Doc y] and answer the question."
    )
    unchanged = render_context((1, 2), (1, 2), docs)
    assert unchanged == f"{CONTEXT_PREAMBLE}\n\n[Doc x] X text\n\n[Doc y] Y text"


def test_context_goes_in_front_of_any_content_shape() -> None:
    assert with_context("why?", "CTX") == "CTX\n\nwhy?"
    assert with_context(None, "CTX") == "CTX"
    assert with_context("", "CTX") == "CTX"
    parts = [{"type": "text", "text": "why?"}]
    assert with_context(parts, "CTX") == [{"type": "text", "text": "CTX\n\n"}, *parts]


def test_conversation_turns_match_a_prefix_and_stay_bounded() -> None:
    turns = ConversationTurns(max_conversations=2)
    first, second = TurnRecord(0, "q1", "R1"), TurnRecord(2, "q2", "R2")
    turns.store("c", (first, second))
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"},
    ]
    assert turns.match("c", history, 4) == _match((first, second), True)
    edited = [*history[:2], {"role": "user", "content": "q2 edited"}, *history[3:]]
    assert turns.match("c", edited, 4) == _match((first,), False)
    assert turns.match("c", history, 2) == _match((first,), False)  # turn 2 retried
    assert turns.match("new", history, 4) == _match((), False)
    turns.store("d", (first,))
    turns.store("e", (first,))  # a third conversation: "c", the least recent, goes
    assert len(turns) == 2 and turns.match("c", history, 4).records == ()
    turns.store("d", ())
    assert len(turns) == 1


def _match(records: tuple[TurnRecord, ...], is_intact: bool) -> HistoryMatch:
    return HistoryMatch(records, is_intact)


# ---- ContextReuse: the rewrite ----------------------------------------------------------------


def _reuse(**config: Any) -> tuple[ContextReuse, GatewayMetrics]:
    fleet = FleetView([Endpoint("a", MODEL, "h100", "local")])
    metrics = GatewayMetrics(fleet, lambda: 0)
    return ContextReuse(ContextReuseConfig(enabled=True, **config), metrics), metrics


def _apply(reuse: ContextReuse, body: dict[str, Any]) -> tuple[dict[str, Any], ParsedBody]:
    raw = json.dumps(body).encode()
    out, parsed = reuse.apply(raw, parse_body(raw, ROUTE_CHAT), ROUTE_CHAT, MODEL)
    assert json.loads(out) == parsed.body
    assert parsed.prompt_text == chat_prompt_text(parsed.body["messages"])
    return parsed.body, parsed


def _counter(metrics: GatewayMetrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no sample {name}")


def test_requests_without_documents_keep_their_bytes() -> None:
    reuse, metrics = _reuse()
    raw = json.dumps(_chat(conversation_id="c", temperature=0.5)).encode()
    parsed = parse_body(raw, ROUTE_CHAT)
    out, out_parsed = reuse.apply(raw, parsed, ROUTE_CHAT, MODEL)
    assert out is raw and out_parsed is parsed
    assert _counter(metrics, "longroute_context_requests_total") == 0


def test_documents_are_ordered_after_earlier_requests_and_fields_removed() -> None:
    reuse, metrics = _reuse()
    system = {"role": "system", "content": "Be brief."}
    first, _ = _apply(
        reuse,
        _chat(
            [system, {"role": "user", "content": "q1"}],
            documents=[_doc("b"), _doc("a"), _doc("c")],
            temperature=0,
        ),
    )
    assert set(first) == {"model", "messages", "temperature"}
    assert first["messages"][0] == system
    assert first["messages"][1]["content"] == (
        f"{CONTEXT_PREAMBLE}\n\n[Doc b] text of b\n\n[Doc a] text of a\n\n[Doc c] text of c\n\nq1"
    )
    second, parsed = _apply(
        reuse,
        _chat(
            [system, {"role": "user", "content": "q2"}], documents=[_doc("d"), _doc("a"), _doc("b")]
        ),
    )
    content = second["messages"][1]["content"]
    # the blocks shared with the first request come first, in its order
    assert content.startswith(
        f"{CONTEXT_PREAMBLE}\n\n[Doc b] text of b\n\n[Doc a] text of a\n\n[Doc d] text of d"
    )
    assert content.endswith(
        "priority order: [Doc d] > [Doc a] > [Doc b] and answer the question.\n\nq2"
    )
    assert parsed.prompt_text is not None and "[Doc d]" in parsed.prompt_text
    assert _counter(metrics, "longroute_context_requests_total") == 2
    assert _counter(metrics, "longroute_context_documents_total") == 6
    assert _counter(metrics, "longroute_context_requests_reordered_total") == 1
    assert _counter(metrics, "longroute_context_documents_deduplicated_total") == 0


def _turn(history: list[dict[str, Any]], question: str, docs: list[str]) -> dict[str, Any]:
    messages = [*history, {"role": "user", "content": question}]
    return _chat(messages, documents=[_doc(d) for d in docs], conversation_id="conv")


def test_a_conversation_resends_its_turns_and_references_seen_documents() -> None:
    reuse, metrics = _reuse()
    turn1, _ = _apply(reuse, _turn([], "q1", ["a", "b"]))
    rendered1 = turn1["messages"][0]["content"]
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "ans1"}]
    turn2, _ = _apply(reuse, _turn(history, "q2", ["c", "a"]))
    # turn 1 is sent as it was rendered, so turn 2's prompt extends turn 1's
    assert turn2["messages"][0]["content"] == rendered1
    assert turn2["messages"][1] == history[1]
    content2 = turn2["messages"][2]["content"]
    assert "Please refer to [Doc a] in the previous conversation." in content2
    assert "[Doc a] text of a" not in content2 and "[Doc c] text of c" in content2
    assert _counter(metrics, "longroute_context_documents_deduplicated_total") == 1

    # the client edited turn 1: its rendering is no longer in the prompt, so nothing
    # may refer to it; every document is sent in full again
    edited = [{"role": "user", "content": "q1 edited"}, history[1]]
    turn2b, _ = _apply(reuse, _turn(edited, "q2", ["c", "a"]))
    assert turn2b["messages"][0]["content"] == "q1 edited"
    assert "[Doc a] text of a" in turn2b["messages"][2]["content"]
    assert "previous conversation" not in json.dumps(turn2b)


def test_without_reuse_documents_are_rendered_as_given() -> None:
    reuse, metrics = _reuse(reorder_enabled=False, dedup_enabled=False)
    _apply(reuse, _turn([], "q1", ["a", "b"]))
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "ans1"}]
    body, _ = _apply(reuse, _turn(history, "q2", ["b", "c"]))
    assert body["messages"][2]["content"] == (
        f"{CONTEXT_PREAMBLE}\n\n[Doc b] text of b\n\n[Doc c] text of c\n\nq2"
    )
    assert _counter(metrics, "longroute_context_documents_deduplicated_total") == 0


def test_the_index_is_bounded_and_models_are_separate() -> None:
    reuse, _ = _reuse(max_indexed_requests=3)
    rng = random.Random(3)
    for i in range(12):
        docs = rng.sample([f"d{j}" for j in range(8)], 4)
        _apply(
            reuse, _chat([{"role": "user", "content": f"q{i}"}], documents=[_doc(d) for d in docs])
        )
    state = reuse.model_context(MODEL)
    assert len(state.pilot.index) == 3 and list(state.indexed) == ["ctx-10", "ctx-11", "ctx-12"]
    state.pilot.index.check_tree()
    assert len(reuse.model_context("other").pilot.index) == 0


def test_documents_without_a_user_message_are_refused() -> None:
    reuse, _ = _reuse()
    body = _chat([{"role": "system", "content": "s"}], documents=[_doc("a")])
    with pytest.raises(GatewayError) as info:
        _apply(reuse, body)
    assert info.value.status == 400 and info.value.param == "messages"
    # no documents, no user message: only the fields go
    out, _ = _apply(reuse, _chat([{"role": "system", "content": "s"}], documents=[]))
    assert out == _chat([{"role": "system", "content": "s"}])


# ---- through an in-process gateway -------------------------------------------------------------


class RawBackend(FakeBackend):
    """A fake backend that also keeps the exact bytes it received."""

    raw_bodies: list[bytes]

    async def completion(self, request: web.Request) -> web.StreamResponse:
        self.raw_bodies.append(await request.read())
        return await super().completion(request)


def _raw_backend() -> RawBackend:
    backend = RawBackend("a", model=MODEL)
    backend.raw_bodies = []
    return backend


@async_test
async def test_gateway_forwards_untouched_rewrites_documents_and_refuses_bad_ones() -> None:
    backend = _raw_backend()
    reuse = {"enabled": True}
    async with running_fleet(backend, router={"name": "prefix-cache"}, context_reuse=reuse) as f:
        plain = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}], "x": 1}'
        status, _, _ = await f.post("/v1/chat/completions", plain)
        assert status == 200 and backend.raw_bodies[-1] == plain  # byte-identical
        body = _chat(documents=[_doc("a")], conversation_id="c", stream=True)
        status, _, data = await f.post("/v1/chat/completions", json.dumps(body).encode())
        assert status == 200 and data.endswith(b"data: [DONE]\n\n")
        forwarded = json.loads(backend.raw_bodies[-1])
        assert "documents" not in forwarded and "conversation_id" not in forwarded
        assert forwarded["messages"][0]["content"].endswith("[Doc a] text of a\n\nq")
        bad = _chat(documents=[_doc("a"), _doc("a")])
        status, headers, data = await f.post("/v1/chat/completions", json.dumps(bad).encode())
        assert status == 400 and headers["Content-Type"].startswith("application/json")
        error = json.loads(data)["error"]
        assert error["param"] == "documents[1].id" and "repeats" in error["message"]
        assert len(backend.raw_bodies) == 2
        assert await f.metric("longroute_context_requests_total") == 1
        assert await f.metric("longroute_errors_total", kind="bad_request") == 1


@async_test
async def test_with_reuse_disabled_documents_pass_untouched() -> None:
    backend = _raw_backend()
    async with running_fleet(backend) as f:
        body = json.dumps(_chat(documents=[_doc("a"), _doc("a")], conversation_id="c")).encode()
        status, _, _ = await f.post("/v1/chat/completions", body)
        assert status == 200 and backend.raw_bodies == [body]


# ---- end to end: cached prompt tokens with and without reuse ------------------------------------

WORDS = (
    *("cache", "prefix", "block", "token", "route", "engine", "latency", "request", "answer"),
    *("context", "batch", "queue", "region", "memory", "decode", "prefill", "result", "value"),
    *("system", "model", "document", "retrieval", "query", "index", "order"),
)
NUM_DOCUMENTS = 20
DOCS_PER_REQUEST = 5


def _corpus(rng: random.Random) -> list[dict[str, str]]:
    return [
        {"id": f"doc-{i}", "text": " ".join(rng.choice(WORDS) for _ in range(60 + 5 * i))}
        for i in range(NUM_DOCUMENTS)
    ]


def _retrieve(rng: random.Random, corpus: list[dict[str, str]]) -> list[dict[str, str]]:
    """5 distinct documents, popular ones more often (weights 1/(rank+1)), in random order."""
    weights = [1.0 / (rank + 1) for rank in range(len(corpus))]
    chosen: list[int] = []
    while len(chosen) < DOCS_PER_REQUEST:
        pick = rng.choices(range(len(corpus)), weights)[0]
        if pick not in chosen:
            chosen.append(pick)
    return [corpus[i] for i in chosen]


def _stream(seed: int = 11) -> list[tuple[str | None, str, list[dict[str, str]]]]:
    """30 steps: (conversation id or None, question, documents); 5 conversations of 2 turns."""
    rng = random.Random(seed)
    corpus = _corpus(rng)
    steps: list[tuple[str | None, str, list[dict[str, str]]]] = []
    for i in range(20):
        steps.append((None, f"Question {i}: what does the context say?", _retrieve(rng, corpus)))
    for c in range(5):
        for turn in range(2):
            question = f"Conversation {c}, turn {turn}: and then?"
            steps.insert(4 * c + 3 * turn + 2, (f"conv-{c}", question, _retrieve(rng, corpus)))
    return steps


def _run_stream(url: str) -> tuple[int, int]:
    """Send the stream in order; (cached prompt tokens, prompt tokens) summed over answers."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
    histories: dict[str, list[ChatCompletionMessageParam]] = {}
    num_cached = num_prompt = 0
    for conversation, question, documents in _stream():
        history = histories.setdefault(conversation, []) if conversation else []
        user: ChatCompletionMessageParam = {"role": "user", "content": question}
        messages = [*history, user]
        extra: dict[str, Any] = {"documents": documents}
        if conversation is not None:
            extra["conversation_id"] = conversation
        answer = client.chat.completions.create(
            model="llama-3-8b",
            messages=messages,
            max_tokens=8,
            extra_body=extra,
        )
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        num_cached += answer.usage.prompt_tokens_details.cached_tokens or 0
        num_prompt += answer.usage.prompt_tokens
        if conversation is not None:
            reply = answer.choices[0].message.content or ""
            history += [user, {"role": "assistant", "content": reply}]
    return num_cached, num_prompt


def test_reuse_gives_more_cached_prompt_tokens_on_the_same_stream(tmp_path: Path) -> None:
    replica = (Replica("solo", "h100", "local", 0.0),)
    quiet = {"rtt_probe_interval_s": None, "scrape_interval_s": None}
    plans = [
        FleetPlan(
            name,
            replicas=replica,
            speed=50.0,
            gateway_overrides={**quiet, "context_reuse": reuse},
        )
        for name, reuse in (
            ("reuse", {"enabled": True}),
            ("asgiven", {"enabled": True, "reorder_enabled": False, "dedup_enabled": False}),
        )
    ]
    for plan in plans:  # both configs validate as written
        parse_gateway_config(
            {
                "backends": [{"name": "x", "url": "http://h", "model": "m"}],
                **plan.gateway_overrides,
            },
            plan.prefix,
        )
    with Launcher(tmp_path, ready_timeout_s=60.0) as launcher:
        with_reuse, as_given = start_fleets(launcher, plans)
        cached_reuse, prompt_reuse = _run_stream(with_reuse.url)
        cached_given, prompt_given = _run_stream(as_given.url)
        planned = _gateway_counters(with_reuse.url)
        planned_given = _gateway_counters(as_given.url)
    print(
        f"\ncached prompt tokens: with reuse {cached_reuse} of {prompt_reuse}, "
        f"documents as given {cached_given} of {prompt_given}",
        file=sys.stderr,
    )
    assert cached_reuse > cached_given, (cached_reuse, cached_given)
    # what the engine had to prefill: fewer with reuse, annotations included
    assert prompt_reuse - cached_reuse < prompt_given - cached_given
    assert planned["longroute_context_requests_total"] == 30
    assert planned["longroute_context_documents_total"] == 30 * DOCS_PER_REQUEST
    assert planned["longroute_context_documents_deduplicated_total"] > 0
    assert planned_given["longroute_context_requests_total"] == 30
    assert planned_given["longroute_context_documents_deduplicated_total"] == 0
    assert planned_given["longroute_context_requests_reordered_total"] == 0


def _gateway_counters(url: str) -> dict[str, float]:
    """The gateway's longroute_context_* samples."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("longroute_context_")
    }
