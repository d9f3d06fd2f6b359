"""Every request field, fuzzed through the whole in-process gateway (hypothesis).

One gateway (context reuse on, so ``documents`` are parsed too) runs for the module on an
event loop in a background thread, in front of an always-200 fake backend; each example is
sent over a raw loopback socket, so any byte can be on the wire: lone surrogates (escaped
and as raw UTF-8), invalid UTF-8, 10,000-deep nesting, 400-digit integers, NaN, odd header
values and Content-Types. Properties of every answer: 200 or a 4xx (the backend never
fails, so a 5xx is the gateway's bug), every 4xx an OpenAI-style JSON error whose message
is short (no echo of a huge input), and /metrics still 200 afterwards.

Explicit regression tests pin the named inputs, 415 for non-JSON bodies and the
``WWW-Authenticate`` header of a 401.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from longroute.gateway import GatewaySecrets
from test_gateway import MODEL, FakeBackend, Fleet, Knobs, async_test, running_fleet
from test_http_server import Reply, read_reply

T = TypeVar("T")

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
IO_TIMEOUT_S = 10.0  # any one exchange with the gateway
MAX_MESSAGE_CHARS = 4096  # an error message is a few KiB at most
MAX_ERROR_BODY_BYTES = 16 * 1024
MIB = 1 << 20

FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)


# ---- a raw client ------------------------------------------------------------------------------


async def send(
    host: str,
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: list[tuple[str, str]] | None = None,
) -> Reply:
    """One request on a fresh connection (``Connection: close``); headers are sent as latin-1,
    exactly as given, and a Content-Type only when ``headers`` has one."""
    head = f"{method} {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers or [])
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), IO_TIMEOUT_S)
    try:
        writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
        return await asyncio.wait_for(read_reply(reader), IO_TIMEOUT_S)
    finally:
        writer.close()


def address(fleet: Fleet) -> tuple[str, int]:
    url = urlsplit(fleet.url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


def assert_openai_error(reply: Reply, status: int | None = None) -> dict[str, Any]:
    """A 4xx whose body is ``{"error": {"message": str, "type": str, ...}}``, short."""
    assert 400 <= reply.status < 500, (reply.status, reply.body[:500])
    if status is not None:
        assert reply.status == status, (reply.status, reply.body[:500])
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    assert len(reply.body) <= MAX_ERROR_BODY_BYTES, (len(reply.body), reply.body[:300])
    document = json.loads(reply.body)
    assert isinstance(document, dict)
    error = document["error"]
    assert isinstance(error, dict)
    assert isinstance(error["message"], str) and isinstance(error["type"], str), error
    assert len(error["message"]) <= MAX_MESSAGE_CHARS, error["message"][:300]
    return error


def assert_served_or_refused(reply: Reply) -> None:
    """200, or an OpenAI-style 4xx: never a 5xx, since the backend always succeeds."""
    if reply.status != 200:
        assert_openai_error(reply)


# ---- JSON with raw fragments -------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """Bytes spliced verbatim into the serialised JSON (what json.dumps cannot write)."""

    label: str
    data: bytes

    def __repr__(self) -> str:
        return f"Raw({self.label!r})"


def deep_arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


RAW_FRAGMENTS = [
    Raw("arrays nested 10000 deep", deep_arrays(10_000)),
    Raw("objects nested 10000 deep", deep_objects(10_000)),
    Raw("arrays nested 200 deep", deep_arrays(200)),
    Raw("lone surrogate as raw UTF-8", b'"a\xed\xa0\x80b"'),
    Raw("0xff in a string", b'"\xff"'),
    Raw("overlong '/' in a string", b'"\xc0\xaf"'),
    Raw("truncated UTF-8 in a string", b'"\xe4\xb8"'),
    Raw("escaped lone surrogate", b'"\\ud800"'),
    Raw("escaped low surrogate first", b'"\\udc00\\ud800"'),
    Raw("escaped NUL", b'"\\u0000"'),
    Raw("1 followed by 400 zeros", b"1" + b"0" * 400),
    Raw("5000-digit integer", b"9" * 5000),
    Raw("1e400", b"1e400"),
    Raw("-0", b"-0"),
    Raw("NaN", b"NaN"),
    Raw("-Infinity", b"-Infinity"),
]

_PLACEHOLDER = "\x00\x01raw-{}-\x01\x00"


def encode(value: object, *, ensure_ascii: bool = True) -> bytes:
    """``value`` as JSON bytes; Raw fragments spliced in, lone surrogates kept: escaped with
    ``ensure_ascii``, else written as (invalid) raw UTF-8."""
    raws: list[bytes] = []

    def swap(item: object) -> object:
        if isinstance(item, Raw):
            raws.append(item.data)
            return _PLACEHOLDER.format(len(raws) - 1)
        if isinstance(item, list):
            return [swap(x) for x in item]
        if isinstance(item, dict):
            return {key: swap(x) for key, x in item.items()}
        return item

    data = json.dumps(swap(value), ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    for i, raw in enumerate(raws):
        placeholder = json.dumps(_PLACEHOLDER.format(i), ensure_ascii=ensure_ascii).encode()
        data = data.replace(placeholder, raw, 1)
    return data


def short_repr(text: str, size: int) -> str:
    return text if len(text) <= 300 else f"{text[:240]}...({size} long)...{text[-40:]}"


class Payload(bytes):
    """Request body bytes whose repr (in hypothesis' reports) is short."""

    def __repr__(self) -> str:
        return short_repr(bytes.__repr__(self), len(self))


class Value(str):
    """A header value whose repr (in hypothesis' reports) is short."""

    def __repr__(self) -> str:
        return short_repr(str.__repr__(self), len(self))


# ---- strategies --------------------------------------------------------------------------------

HUGE = "h" * 20_000  # far more than an error message may hold
ODD_TEXTS = [
    "",
    " ",
    "\ud800",
    "a\udfffb",
    "\x00",
    "\u202e\u200b",
    "é中🙂",
    "x" * 300,
    HUGE,
    MODEL,
    MODEL + "\x00",
]
SPECIAL_INTS = [0, -1, 1, 2**31, 2**63, 2**64, 10**30, -(10**30), 10**400, -(10**400)]


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in ``n`` draws. Hypothesis favours the bounds of integers (and the ends
    of sampled_from), so this tests a residue away from both ends."""
    return st.integers(0, 100 * n - 1).map(lambda x: x % n == 1)


def mostly(
    plausible: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """``plausible`` three times in four, else ``wild`` (so that a fair share of the examples
    gets past validation and through the proxy to the backend). Not ``one_of``: hypothesis
    neither weights its branches nor keeps repeated ones."""
    return one_in(4).flatmap(lambda is_wild: wild if is_wild else plausible)


clean_texts = st.text(max_size=30)  # hypothesis draws no surrogates by default
texts = clean_texts | st.sampled_from(ODD_TEXTS)
ints = st.integers() | st.sampled_from(SPECIAL_INTS)
raws = st.sampled_from(RAW_FRAGMENTS)
scalars = st.none() | st.booleans() | ints | st.floats() | texts | raws
any_json = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=10,
)
clean_json = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(-1e6, 1e6) | clean_texts,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(clean_texts, children, max_size=3)
    ),
    max_leaves=6,
)
models = mostly(st.just(MODEL), st.one_of(texts, ints, st.none(), any_json))
counts = mostly(
    st.integers(1, 4096), st.one_of(ints, st.floats(), st.booleans(), texts, st.none(), raws)
)
roles = mostly(st.sampled_from(["user", "system", "assistant", "tool"]), texts | any_json)
parts = mostly(
    st.fixed_dictionaries({"type": st.just("text"), "text": clean_texts}),
    st.fixed_dictionaries({"type": texts | any_json}, optional={"text": texts | any_json})
    | any_json,
)
contents = mostly(
    clean_texts | st.lists(parts, max_size=3) | st.none(),
    st.one_of(texts, ints, st.floats(), any_json),
)
message = mostly(
    st.fixed_dictionaries({"role": roles, "content": contents}, optional={"name": clean_texts}),
    any_json,
)
messages = mostly(st.lists(message, min_size=1, max_size=4), any_json)
token_ids = mostly(st.integers(0, 50_000), ints | any_json)
prompts = mostly(
    st.one_of(
        clean_texts,
        st.lists(clean_texts, min_size=1, max_size=3),
        st.lists(token_ids, min_size=1, max_size=5),
        st.lists(st.lists(token_ids, min_size=1, max_size=3), min_size=1, max_size=3),
    ),
    any_json,
)
document = mostly(
    st.fixed_dictionaries({"id": st.text(min_size=1, max_size=8), "text": clean_texts}),
    st.fixed_dictionaries({"id": texts | any_json}, optional={"text": any_json, "x": any_json})
    | any_json,
)
documents = mostly(st.lists(document, max_size=3), any_json)
OPTIONAL_FIELDS = {
    "stream": mostly(st.booleans(), any_json),
    "max_tokens": counts,
    "max_completion_tokens": counts,
    "n": counts,
    "user": mostly(clean_texts, texts | any_json),
    "documents": documents,
    "conversation_id": mostly(st.text(min_size=1, max_size=8), texts | any_json),
}

header_chars = st.characters(codec="latin-1", exclude_characters="\r\n")
header_values = mostly(
    st.text(header_chars, max_size=40),
    st.sampled_from(
        ["", ",", " , ,", MODEL, f"{MODEL}, {MODEL}", "m," * 1500, "\t x \t", "a" * 9000]
    ),
).map(Value)
content_types = mostly(
    st.sampled_from([None, "application/json", "application/json; charset=utf-8"]),
    st.sampled_from(
        [
            "APPLICATION/JSON",
            "application/vnd.x+json",
            "application/json; charset=latin-1",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "*/*",
            "",
        ]
    ),
)


@st.composite
def request_headers(draw: st.DrawFn) -> list[tuple[str, str]]:
    headers = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "x-longroute-tried": header_values,
                "x-longroute-task": header_values,
                "x-longroute-session": header_values,
                "Authorization": header_values,
            },
        )
    )
    content_type = draw(content_types)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return list(headers.items())


@st.composite
def request_bodies(draw: st.DrawFn, route: str) -> bytes:
    """A body for ``route``: mostly object-shaped with any value in any field."""
    main, main_values = ("messages", messages) if route == CHAT else ("prompt", prompts)
    body: dict[str, object] = draw(
        st.fixed_dictionaries({"model": models, main: main_values}, optional=OPTIONAL_FIELDS)
    )
    if draw(one_in(10)):
        del body[draw(st.sampled_from(["model", main]))]  # a required field missing
    extras = mostly(
        st.dictionaries(clean_texts, clean_json, max_size=2),
        st.dictionaries(texts, any_json, min_size=1, max_size=2),
    )
    body.update(draw(extras))  # extra fields (rarely, overrides)
    return Payload(encode(body, ensure_ascii=draw(st.booleans())))


top_level_bodies = st.one_of(
    any_json.map(encode),  # mostly not an object
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"",
            b"null",
            b"{",
            b'{"model": "' + MODEL.encode() + b'", "messages": [',
            b"\xef\xbb\xbf{}",  # a UTF-8 BOM
            b"\xff\xfe{\x00}\x00",  # UTF-16
            deep_arrays(10_000),
            b'{"model": "' + MODEL.encode() + b'"}' + b" garbage",
        ]
    ),
).map(Payload)


# ---- the shared gateway ------------------------------------------------------------------------


class LiveGateway:
    """A gateway served on an event loop in a background thread. (Not a dataclass: hypothesis
    would print every field, the backend's record of every body included.)"""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, host: str, port: int, backend: FakeBackend
    ) -> None:
        self.loop = loop
        self.host = host
        self.port = port
        self.backend = backend

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 3 * IO_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def __repr__(self) -> str:
        return f"LiveGateway({self.host}:{self.port})"


@pytest.fixture(scope="module")
def gateway() -> Iterator[LiveGateway]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzz-gateway", daemon=True)
    thread.start()
    stack = AsyncExitStack()
    backend = FakeBackend("a")

    async def start() -> Fleet:
        fleet = running_fleet(backend, context_reuse={"enabled": True})
        return await stack.enter_async_context(fleet)

    try:
        fleet = asyncio.run_coroutine_threadsafe(start(), loop).result(30.0)
        host, port = address(fleet)
        yield LiveGateway(loop, host, port, backend)
    finally:
        try:
            asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(30.0)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10.0)
            loop.close()


broken_by: list[str] = []  # the first example after which /metrics failed


def check_example(
    gateway: LiveGateway, path: str, body: bytes, headers: list[tuple[str, str]]
) -> None:
    """Sends one example and checks the properties; /metrics must answer 200 afterwards."""
    assert not broken_by, f"an earlier example left the gateway broken: {broken_by[0]}"

    async def exchange() -> tuple[Reply, Reply]:
        reply = await send(gateway.host, gateway.port, "POST", path, body, headers)
        metrics = await send(gateway.host, gateway.port, "GET", "/metrics")
        return reply, metrics

    reply, metrics = gateway.run(exchange())
    event(f"status {reply.status}")  # shown by pytest --hypothesis-show-statistics
    if metrics.status != 200:
        broken_by.append(f"POST {path} {body[:200]!r} headers {headers!r}")
    assert_served_or_refused(reply)
    assert metrics.status == 200, metrics.body[:300]


@FUZZ_SETTINGS
@given(body=request_bodies(CHAT), headers=request_headers())
def test_fuzz_chat_completions(
    gateway: LiveGateway, body: bytes, headers: list[tuple[str, str]]
) -> None:
    check_example(gateway, CHAT, body, headers)


@FUZZ_SETTINGS
@given(body=request_bodies(COMPLETIONS), headers=request_headers())
def test_fuzz_completions(
    gateway: LiveGateway, body: bytes, headers: list[tuple[str, str]]
) -> None:
    check_example(gateway, COMPLETIONS, body, headers)


@settings(FUZZ_SETTINGS, max_examples=100)
@given(route=st.sampled_from([CHAT, COMPLETIONS]), body=top_level_bodies)
def test_fuzz_bodies_that_are_not_objects(gateway: LiveGateway, route: str, body: bytes) -> None:
    check_example(gateway, route, body, [("Content-Type", "application/json")])


def test_the_fuzzed_gateway_serves_a_valid_request(gateway: LiveGateway) -> None:
    """Control: the fuzz fixture's gateway forwards a valid request (200 reaches the fake)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    reply = gateway.run(send(gateway.host, gateway.port, "POST", CHAT, encode(body)))
    assert reply.status == 200
    assert json.loads(reply.body)["choices"][0]["message"]["content"].startswith("a-0")


def test_encode_splices_raw_fragments_and_keeps_surrogates() -> None:
    value = {"a": [Raw("n", b"1" + b"0" * 5)], "s": "\ud800"}
    assert encode(value) == b'{"a": [100000], "s": "\\ud800"}'
    assert encode(value, ensure_ascii=False) == b'{"a": [100000], "s": "\xed\xa0\x80"}'


# ---- explicit regressions ----------------------------------------------------------------------


def chat_body(content: object = "hi", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


JSON_HEADERS = [("Content-Type", "application/json")]


async def post_then_metrics(fleet: Fleet, data: bytes) -> tuple[Reply, Reply]:
    host, port = address(fleet)
    reply = await send(host, port, "POST", CHAT, data, JSON_HEADERS)
    metrics = await send(host, port, "GET", "/metrics")
    return reply, metrics


NAMED_INPUTS = [
    pytest.param(
        encode(chat_body(metadata=Raw("deep", deep_arrays(10_000)))),
        id="JSON nested 10,000 deep",
    ),
    pytest.param(encode(chat_body("a\ud800b")), id="lone surrogate escaped in a message"),
    pytest.param(
        encode(chat_body("a\ud800b"), ensure_ascii=False),
        id="invalid UTF-8 ED A0 80 in a message",
    ),
    pytest.param(
        encode(chat_body(Raw("ff", b'"a\xffb"'))),
        id="invalid UTF-8 FF in a message",
    ),
]


@pytest.mark.parametrize("data", NAMED_INPUTS)
def test_named_hostile_bodies_are_400(data: bytes) -> None:
    async def scenario() -> None:
        backend = FakeBackend("a")
        async with running_fleet(backend) as fleet:
            reply, metrics = await post_then_metrics(fleet, data)
        error = assert_openai_error(reply, 400)
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        assert metrics.status == 200
        assert backend.bodies == []  # nothing reached the backend

    async_test(scenario)()


@async_test
async def test_max_tokens_of_401_digits_is_400_and_metrics_stay_up_meanwhile() -> None:
    backend = FakeBackend("a", Knobs(delay_s=1.0))  # were it forwarded, it would be in flight
    data = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1%s}'
    data = data % (MODEL.encode(), b"0" * 400)
    async with running_fleet(backend) as fleet:
        host, port = address(fleet)
        request = asyncio.create_task(send(host, port, "POST", CHAT, data, JSON_HEADERS))
        await asyncio.sleep(0.2)
        during = await send(host, port, "GET", "/metrics")
        reply = await request
        after = await send(host, port, "GET", "/metrics")
    assert during.status == 200
    assert after.status == 200
    error = assert_openai_error(reply, 400)
    assert error["param"] == "max_tokens"
    assert backend.bodies == []


@async_test
async def test_error_messages_do_not_echo_a_1_mib_input() -> None:
    huge = "q" * MIB
    bodies = [
        chat_body(max_tokens=huge),  # the wrong value of a field
        {"model": huge, "messages": [{"role": "user", "content": "x"}]},  # an unknown model
        chat_body(documents=[{"id": huge, "text": "t"}]),
    ]
    async with running_fleet(FakeBackend("a"), context_reuse={"enabled": True}) as fleet:
        host, port = address(fleet)
        for body in bodies:
            reply = await send(host, port, "POST", CHAT, encode(body), JSON_HEADERS)
            assert_openai_error(reply)  # short message, short body


# ---- Content-Type (415) and WWW-Authenticate (401) ---------------------------------------------


@async_test
async def test_non_json_content_type_is_415() -> None:
    data = encode(chat_body())
    refused = ["text/plain", "application/x-www-form-urlencoded"]
    accepted: list[str | None] = [None, "application/json; charset=utf-8", "application/vnd.x+json"]
    backend = FakeBackend("a")
    async with running_fleet(backend) as fleet:
        host, port = address(fleet)
        refusals = []
        for content_type in refused:
            for path in (CHAT, COMPLETIONS):
                headers = [("Content-Type", content_type)]
                refusals.append(await send(host, port, "POST", path, data, headers))
        assert backend.bodies == []
        for maybe_type in accepted:
            headers = [] if maybe_type is None else [("Content-Type", maybe_type)]
            reply = await send(host, port, "POST", CHAT, data, headers)
            assert reply.status == 200, (maybe_type, reply.body[:300])
    for reply in refusals:
        error = assert_openai_error(reply, 415)
        assert error["code"] == "unsupported_media_type"
    assert len(backend.bodies) == len(accepted)


@async_test
async def test_401_carries_a_bearer_www_authenticate_challenge() -> None:
    secrets = GatewaySecrets({}, frozenset({"k"}))
    data = encode(chat_body())
    async with running_fleet(FakeBackend("a"), secrets=secrets) as fleet:
        host, port = address(fleet)
        missing = await send(host, port, "POST", CHAT, data, JSON_HEADERS)
        wrong = await send(
            host, port, "POST", CHAT, data, [*JSON_HEADERS, ("Authorization", "Bearer nope")]
        )
        models = await send(host, port, "GET", "/v1/models")
        right = await send(
            host, port, "POST", CHAT, data, [*JSON_HEADERS, ("Authorization", "Bearer k")]
        )
    for reply in (missing, wrong, models):
        error = assert_openai_error(reply, 401)
        assert error["code"] == "invalid_api_key"
        assert reply.headers.get("www-authenticate", "").startswith("Bearer"), reply.headers
    assert right.status == 200
    assert "www-authenticate" not in right.headers
