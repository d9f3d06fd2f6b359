"""The profiler's HTTP client: streamed requests timed chunk by chunk, and the engine's pages.

Called by :mod:`longroute.profiling.measure` for every measured request and once for
``/v1/models`` and ``/metrics``. Everything the target sends is treated as hostile:
bodies and SSE lines are bounded (:data:`MAX_BODY_BYTES`), JSON that is not what an
OpenAI-compatible server sends becomes a :class:`TargetError` with one line naming
the problem, never a traceback. Times are ``time.perf_counter`` seconds since the
request was sent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from longroute.bench.sse import SSEParser

Api = Literal["completions", "chat"]
MAX_BODY_BYTES = 4 << 20
"""Most bytes read of one response (a page, or a whole stream)."""
_MAX_MESSAGE_CHARS = 200


class TargetError(Exception):
    """The target cannot be profiled: unreachable, no stream, no usage, or an HTTP error.
    The message is one line, meant for the terminal."""


@dataclass(frozen=True, slots=True)
class StreamResult:
    """One streamed request: first content chunk, every content chunk's arrival, usage."""

    ttft_s: float
    last_token_s: float
    num_chunks: int
    num_prompt_tokens: int
    num_cached_tokens: int | None
    num_completion_tokens: int


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_MESSAGE_CHARS else line[:_MAX_MESSAGE_CHARS] + "..."


def _usage(obj: dict[str, Any]) -> tuple[int, int | None, int] | None:
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not (isinstance(prompt, int) and isinstance(completion, int)) or prompt < 0:
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return prompt, cached if isinstance(cached, int) and cached >= 0 else None, completion


def _has_token(obj: dict[str, Any], api: Api) -> bool:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if choice.get("finish_reason"):  # a token came, though it may decode to no text
        return True
    if api == "completions":
        return bool(choice.get("text"))
    delta = choice.get("delta")  # a role-only first delta is not a token
    return isinstance(delta, dict) and bool(delta.get("content"))


def _unreachable(root: str, exc: BaseException) -> TargetError:
    return TargetError(f"cannot reach {root}: {_short(str(exc)) or type(exc).__name__}")


class EngineClient:
    """One target: ``base_url`` (``http://host:port``), ``model``, an optional API key.
    Use as an async context manager (it owns one aiohttp session)."""

    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 120.0
    ) -> None:
        base = base_url.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise TargetError(f"target must start with http:// or https://, got {base_url!r}")
        self.root = base.removesuffix("/v1")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.sends_ignore_eos = True  # off once the target refuses the field

    async def __aenter__(self) -> EngineClient:
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use EngineClient as an async context manager"
        return self._session

    async def get_text(self, path: str) -> tuple[int, str]:
        """(status, body) of ``GET path``; TargetError when the target cannot be reached."""
        try:
            async with self.session.get(self.root + path) as response:
                body = await response.content.read(MAX_BODY_BYTES)
                return response.status, body.decode("utf-8", errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _unreachable(self.root, exc) from None

    def _body(self, prompt: str, max_tokens: int, api: Api) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.sends_ignore_eos:
            body["ignore_eos"] = True  # vLLM/SGLang: generate exactly max_tokens
        if api == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        return body

    async def stream(self, prompt: str, max_tokens: int, api: Api) -> StreamResult:
        """One streamed request, timed; TargetError for anything but a usable stream.
        A target that refuses ``ignore_eos`` (HTTP 400 naming it) is asked again
        without it, and never sent it again."""
        try:
            return await self._stream(prompt, max_tokens, api)
        except TargetError as exc:
            text = str(exc)
            if not (self.sends_ignore_eos and "HTTP 400" in text and "ignore_eos" in text):
                raise
        self.sends_ignore_eos = False
        return await self._stream(prompt, max_tokens, api)

    async def _stream(self, prompt: str, max_tokens: int, api: Api) -> StreamResult:
        path = "/v1/completions" if api == "completions" else "/v1/chat/completions"
        start_s = time.perf_counter()
        try:
            async with self.session.post(
                self.root + path, json=self._body(prompt, max_tokens, api)
            ) as response:
                if response.status != 200:
                    text = (await response.content.read(64 << 10)).decode("utf-8", "replace")
                    raise TargetError(f"HTTP {response.status} from {path}: {_short(text)}")
                if "text/event-stream" not in response.headers.get("Content-Type", ""):
                    raise TargetError(
                        f"{path} does not stream (Content-Type "
                        f"{response.headers.get('Content-Type')!r}, asked stream: true)"
                    )
                return await self._read_stream(response, start_s, api, path)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _unreachable(self.root, exc) from None

    async def _read_stream(
        self, response: aiohttp.ClientResponse, start_s: float, api: Api, path: str
    ) -> StreamResult:
        parser, first_s, last_s, num_chunks = SSEParser(), None, 0.0, 0
        usage: tuple[int, int | None, int] | None = None
        num_bytes = 0
        async for chunk in response.content.iter_any():
            now_s = time.perf_counter() - start_s
            num_bytes += len(chunk)
            if num_bytes > MAX_BODY_BYTES:
                raise TargetError(f"{path}: stream longer than {MAX_BODY_BYTES} bytes")
            for data in parser.feed(chunk):
                if data.strip() == "[DONE]":
                    continue
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise TargetError(f"{path}: an SSE event is not JSON: {_short(data)}") from None
                if not isinstance(obj, dict):
                    raise TargetError(f"{path}: an SSE event is not an object: {_short(data)}")
                if _has_token(obj, api):
                    first_s = now_s if first_s is None else first_s
                    last_s, num_chunks = now_s, num_chunks + 1
                usage = _usage(obj) or usage
        if first_s is None:
            raise TargetError(f"{path}: the stream carried no content (no token streamed)")
        if usage is None:
            raise TargetError(
                f"{path}: the engine reports no usage (usage.prompt_tokens) in its stream with "
                "stream_options.include_usage; longroute profile needs real token counts"
            )
        prompt, cached, completion = usage
        return StreamResult(first_s, last_s, num_chunks, prompt, cached, completion)
