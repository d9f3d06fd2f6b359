"""An OpenAI-compatible chat client that times every response.

Called by the load generator once per request (``chat``) and once per target
before a run (``list_models``). It never raises for a failed request: HTTP
errors, connection errors, timeouts, malformed bodies and streams cut short
come back as :class:`RequestFailure` (status and message), so one bad request
cannot crash a run. Times are ``clock()`` readings (``time.perf_counter`` by
default); the caller makes them relative to its run's start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from longroute.bench.prompts import CHARS_PER_TOKEN
from longroute.bench.sse import SSEParser
from longroute.headers import ENDPOINT_HEADER, MODEL_HEADER

DONE = "[DONE]"
_MAX_MESSAGE_CHARS = 300


#: statuses that mean the key is missing or wrong, not that a model is
AUTH_STATUSES = (401, 403)


class AuthRejected(ValueError):
    """The target refused the credentials (HTTP 401/403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Completion:
    """A successful response. Token counts are None when the target sent no usage;
    ``num_output_units`` then stands in for output tokens: the content chunks of
    a stream, or, without streaming, the text's length in ``CHARS_PER_TOKEN``s.
    ``model`` is the body's ``model``; ``routed_model`` the gateway's
    ``x-longroute-model`` header (None when the target is not a longroute gateway)."""

    text: str
    first_token_s: float
    finish_s: float
    num_output_units: int
    num_output_tokens: int | None
    num_prompt_tokens: int | None
    num_cached_tokens: int | None
    model: str | None
    endpoint: str | None
    routed_model: str | None = None

    @property
    def answering_model(self) -> str | None:
        """The model that answered: the gateway's header, else the body's ``model``."""
        return self.routed_model or self.model


@dataclass(frozen=True, slots=True)
class RequestFailure:
    """A failed request: the HTTP status (None if no response came) and a message."""

    status: int | None
    message: str
    finish_s: float


def normalize_base_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` (trailing slashes ignored) -> ``.../v1``."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"target URL must start with http:// or https://, got {url!r}")
    return base if base.endswith("/v1") else base + "/v1"


def _error_message(body: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body itself, shortened."""
    message: object = body
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error", obj)
        if isinstance(error, dict):
            message = error.get("message", error)
        elif isinstance(error, str):
            message = error
    text = str(message).strip() or "(empty body)"
    return text[:_MAX_MESSAGE_CHARS]


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage_counts(usage: object) -> tuple[int | None, int | None, int | None]:
    """(prompt, cached prompt, completion) tokens of an OpenAI ``usage`` object."""
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None
    return (
        _int_or_none(usage.get("prompt_tokens")),
        cached,
        _int_or_none(usage.get("completion_tokens")),
    )


class _StreamState:
    """What a stream has delivered so far."""

    __slots__ = ("first_token_s", "is_done", "model", "num_chunks", "pieces", "usage")

    def __init__(self) -> None:
        self.first_token_s: float | None = None
        self.pieces: list[str] = []
        self.num_chunks = 0
        self.usage: object = None
        self.model: str | None = None
        self.is_done = False

    def add(self, event: dict[str, Any], now_s: float) -> None:
        """Take one chunk object; the first non-empty content delta sets the TTFT."""
        model = event.get("model")
        if isinstance(model, str):
            self.model = model
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content") or delta.get("reasoning_content")
            if content:
                if self.first_token_s is None:
                    self.first_token_s = now_s
                self.pieces.append(content)
                self.num_chunks += 1


class ChatClient:
    """Sends chat completions to one target through a shared ``aiohttp.ClientSession``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._session = session
        self.base_url = normalize_base_url(base_url)
        self._chat_url = self.base_url + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock

    async def list_models(self, timeout_s: float) -> list[str]:
        """Model ids from ``GET /v1/models``; raises aiohttp errors, TimeoutError, ValueError
        (:class:`AuthRejected` for 401/403: a missing or wrong key)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.get(
            self.base_url + "/models", headers=self._headers, timeout=timeout
        ) as resp:
            body = await resp.text()
            if resp.status in AUTH_STATUSES:
                raise AuthRejected(resp.status, _error_message(body))
            if resp.status != 200:
                raise ValueError(f"GET /v1/models returned {resp.status}: {_error_message(body)}")
        data = json.loads(body).get("data") or []
        return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]

    async def chat(
        self, payload: Mapping[str, object], headers: Mapping[str, str] | None = None
    ) -> Completion | RequestFailure:
        """POST ``payload`` with extra ``headers``; streamed when ``payload["stream"]`` is true."""
        sent = self._headers if not headers else {**self._headers, **headers}
        try:
            async with self._session.post(
                self._chat_url, json=payload, headers=sent, timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    body = await resp.text(errors="replace")
                    return RequestFailure(resp.status, _error_message(body), self._clock())
                routed = (resp.headers.get(ENDPOINT_HEADER), resp.headers.get(MODEL_HEADER))
                if payload.get("stream"):
                    return await self._read_stream(resp, routed)
                return await self._read_body(resp, routed)
        except TimeoutError:
            return RequestFailure(None, "timed out", self._clock())
        except (aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return RequestFailure(None, f"{type(exc).__name__}: {exc}", self._clock())

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, routed: tuple[str | None, str | None]
    ) -> Completion | RequestFailure:
        parser = SSEParser()
        state = _StreamState()
        clock = self._clock
        async for chunk in resp.content.iter_any():
            now_s = clock()
            for data in parser.feed(chunk):
                failure = self._take(state, data, now_s)
                if failure is not None:
                    return failure
        for data in parser.finish():
            failure = self._take(state, data, clock())
            if failure is not None:
                return failure
        finish_s = clock()
        if not state.is_done:
            return RequestFailure(200, f"stream ended before {DONE}", finish_s)
        prompt, cached, completion = _usage_counts(state.usage)
        return Completion(
            "".join(state.pieces),
            finish_s if state.first_token_s is None else state.first_token_s,
            finish_s,
            state.num_chunks,
            completion,
            prompt,
            cached,
            state.model,
            *routed,
        )

    def _take(self, state: _StreamState, data: str, now_s: float) -> RequestFailure | None:
        if data == DONE:
            state.is_done = True
            return None
        event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError(f"stream event is not a JSON object: {data[:80]!r}")
        if "error" in event:
            return RequestFailure(200, _error_message(data), now_s)
        state.add(event, now_s)
        return None

    async def _read_body(
        self, resp: aiohttp.ClientResponse, routed: tuple[str | None, str | None]
    ) -> Completion | RequestFailure:
        body = await resp.read()
        finish_s = self._clock()
        obj = json.loads(body)
        if "error" in obj:
            return RequestFailure(200, _error_message(body.decode("utf-8", "replace")), finish_s)
        message = obj["choices"][0]["message"]
        text = message.get("content") or message.get("reasoning_content") or ""
        prompt, cached, completion = _usage_counts(obj.get("usage"))
        model = obj.get("model")
        return Completion(
            text,
            finish_s,
            finish_s,
            -(-len(text) // CHARS_PER_TOKEN),
            completion,
            prompt,
            cached,
            model if isinstance(model, str) else None,
            *routed,
        )
