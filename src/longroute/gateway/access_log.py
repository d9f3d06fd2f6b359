"""The access log: one JSON line per request, opt-in (``access_log:`` in the config).

Fields (a stable interface, docs/operations.md): ``time`` (arrival, ISO 8601 UTC
with milliseconds), ``request_id``, ``key_id`` (the client key's id, never the
key; null on an open gateway), ``route``, ``model`` (as the client asked),
``endpoint`` (the backend that answered, or was tried last), ``router``,
``attempts``, ``failovers`` (the reason of each failed attempt), ``status``,
``outcome`` (ok, error, client_disconnect, cut), ``error`` (the error kind, or
null), ``stream``, ``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
``usage`` (backend: from the answer's usage object; estimated: counted by the
gateway), ``queue_ms``, ``ttft_ms``, ``e2e_ms`` (from arrival), ``decision_us``.
Never prompt or answer text; the strings a client chose (request id, model) pass
through the redactor.

Lines go to a buffered file (or stdout, ``path: "-"``), flushed every
``flush_interval_s`` by :meth:`AccessLog.run` and at shutdown, so a request
pays one ``json.dumps`` and one buffered write; a write error is logged once per
streak of failures and never fails a request. :meth:`AccessLog.reopen` (on
reload) lets logrotate move the file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import IO

from longroute.gateway.observe import RequestTrace
from longroute.gateway.redact import Redactor

log = logging.getLogger("longroute.gateway")
STDOUT = "-"
BUFFER_BYTES = 64 * 1024
_MAX_CACHED = 4096


class AccessLog:
    """A sink of finished requests (:class:`~longroute.gateway.observe.RequestSink`)."""

    def __init__(
        self,
        path: str,
        redactor: Redactor,
        router_name: Callable[[], str],
        *,
        own_id_prefix: str,
        flush_interval_s: float = 1.0,
    ) -> None:
        """``own_id_prefix``: the prefix of the ids the gateway makes (RequestIds.prefix);
        any other id is the client's and is redacted."""
        self.path = path
        self.flush_interval_s = flush_interval_s
        self.redactor = redactor  # a reload with new keys replaces it
        self._router_name = router_name
        self.own_id_prefix = own_id_prefix
        self._models: dict[str, str] = {}  # JSON of redacted model names
        self._quotes: dict[str, str] = {}  # JSON of the gateway's own strings
        self._pieces: dict[tuple[str | None, ...], str] = {}  # see _shared
        self._second = -1
        self._second_text = ""
        self._is_failing = False
        self._file: IO[str] = self._open()

    def _open(self) -> IO[str]:
        if self.path == STDOUT:
            return open(
                sys.stdout.fileno(), "w", buffering=BUFFER_BYTES, encoding="utf-8", closefd=False
            )
        return open(self.path, "a", buffering=BUFFER_BYTES, encoding="utf-8")

    def finish(self, trace: RequestTrace) -> None:
        """Writes ``trace``'s line (buffered). The line is formatted by hand: the fields a
        request shares with many others (key id, route, model, backend, router) as one
        cached JSON piece, every other string through ``json.dumps``. That is some 3x
        faster than ``json.dumps`` of a dict, which would cost a few percent of a request."""
        usage = trace.usage()
        started_s = trace.started_s
        failovers = "[]" if not trace.failovers else json.dumps(list(trace.failovers))
        request_id = trace.request_id
        if not request_id.startswith(self.own_id_prefix):  # the client's: redact, escape
            request_id = json.dumps(self._client_text(request_id))
        else:
            request_id = f'"{request_id}"'
        error = trace.error_kind
        predicted = trace.predicted_cached_tokens
        granted_s, first_s, ended_s = trace.granted_s, trace.first_byte_s, trace.ended_s
        prompt, cached, completion = (
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
        )
        self._write(
            f'{{"time":"{self._time(trace.wall_s)}","request_id":{request_id},'
            f"{self._shared(trace)}"
            f'"attempts":{trace.num_attempts},"failovers":{failovers},"status":{trace.status},'
            f'"outcome":"{trace.outcome}","error":{"null" if error is None else json.dumps(error)},'
            f'"stream":{"true" if trace.is_stream else "false"},'
            f'"prompt_tokens":{"null" if prompt is None else prompt},'
            f'"cached_tokens":{"null" if cached is None else cached},'
            f'"predicted_cached_tokens":{"null" if predicted is None else predicted},'
            f'"completion_tokens":{"null" if completion is None else completion},'
            f'"usage":"{usage.source}",'
            f'"queue_ms":{"null" if granted_s is None else f"{(granted_s - started_s) * 1e3:.3f}"},'
            f'"ttft_ms":{"null" if first_s is None else f"{(first_s - started_s) * 1e3:.3f}"},'
            f'"e2e_ms":{"null" if ended_s is None else f"{(ended_s - started_s) * 1e3:.3f}"},'
            f'"decision_us":{trace.decision_s * 1e6:.1f}}}\n'
        )

    def _shared(self, trace: RequestTrace) -> str:
        """The key id, route, model, backend and router fields, as one JSON piece (cached:
        the model is the client's, so the cache is bounded)."""
        key = (trace.key_id, trace.route, trace.model, trace.endpoint, self._router_name())
        piece = self._pieces.get(key)
        if piece is None:
            key_id, route, model, endpoint, router = key
            quote = self._quoted
            piece = (
                f'"key_id":{quote(key_id)},"route":{quote(route)},"model":{self._model(model)},'
                f'"endpoint":{quote(endpoint or None)},"router":{quote(router)},'
            )
            if len(self._pieces) < _MAX_CACHED:
                self._pieces[key] = piece
        return piece

    def _quoted(self, text: str | None) -> str:
        """``text`` as a JSON string (null for None); a gateway-chosen string (a route, a
        backend, a router, an error kind, a key id), so the cache stays small."""
        if text is None:
            return "null"
        quoted = self._quotes.get(text)
        if quoted is None:
            quoted = json.dumps(text)
            if len(self._quotes) < _MAX_CACHED:
                self._quotes[text] = quoted
        return quoted

    def _write(self, line: str) -> None:
        try:
            self._file.write(line)
        except (OSError, ValueError) as exc:  # ValueError: written after close
            self._failed(exc)

    def flush(self) -> None:
        try:
            self._file.flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)
        else:
            if self._is_failing:
                self._is_failing = False
                log.info("access log %s: writing again", self.path)

    def _failed(self, exc: BaseException) -> None:
        if not self._is_failing:
            self._is_failing = True
            log.warning("access log %s: lines lost: %s", self.path, type(exc).__name__)

    async def run(self) -> None:
        """Flushes every ``flush_interval_s``, forever (cancelled at shutdown)."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            self.flush()

    def reopen(self) -> None:
        """Flushes and opens the file again (after logrotate moved it)."""
        self.close()
        try:
            self._file = self._open()
        except OSError as exc:
            self._failed(exc)

    def close(self) -> None:
        self.flush()
        try:
            self._file.close()
        except OSError as exc:
            self._failed(exc)

    def _time(self, wall_s: float) -> str:
        second = int(wall_s)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((wall_s - second) * 1000):03d}Z"

    def _model(self, model: str) -> str:
        """The client's model name, redacted, as a JSON string (cached, bounded)."""
        text = self._models.get(model)
        if text is None:
            text = json.dumps(self._client_text(model))
            if len(self._models) < _MAX_CACHED:  # client-chosen: keep the cache bounded
                self._models[model] = text
        return text

    def _client_text(self, text: str) -> str:
        return self.redactor.text(text) if text else text


__all__ = ["STDOUT", "AccessLog"]
