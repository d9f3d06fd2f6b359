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

Lines are kept in a list of at most :data:`BATCH_LINES` and written as one string to
a buffered file (or stdout, ``path: "-"``), flushed every ``flush_interval_s`` by
:meth:`AccessLog.run` and at shutdown, so a request pays one formatted string and a
list append; a write error is logged once per streak of failures and never fails a
request. :meth:`AccessLog.reopen` (on reload) lets logrotate move the file.
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
BATCH_LINES = 64
"""Lines kept before they go to the file's buffer as one string (about 30 KiB)."""
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
        self._router_name = router_name
        self.own_id_prefix = own_id_prefix
        self._models: dict[str, str] = {}  # JSON of redacted model names
        self._quotes: dict[str, str] = {}  # JSON of the gateway's own strings
        self._pieces: dict[tuple[object, ...], str] = {}  # see _shared
        self._redactor = redactor
        self._second = -1
        self._second_text = ""
        self._milli = -1
        self._milli_text = ""
        self._lines: list[str] = []  # formatted, not yet written (at most BATCH_LINES)
        self._is_failing = False
        self._file: IO[str] = self._open()

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        """A reload's (new keys): the cached texts redacted with the old one are dropped."""
        self._redactor = redactor
        self._models.clear()
        self._pieces.clear()

    def _open(self) -> IO[str]:
        if self.path == STDOUT:
            return open(
                sys.stdout.fileno(), "w", buffering=BUFFER_BYTES, encoding="utf-8", closefd=False
            )
        return open(self.path, "a", buffering=BUFFER_BYTES, encoding="utf-8")

    def finish(self, trace: RequestTrace) -> None:
        """Formats ``trace``'s line and keeps it (written by BATCH_LINES). The line is
        formatted by hand: the fields a request shares with many others (key id, route,
        model, backend, router, attempts, failovers, status, outcome, error, stream) as
        one cached JSON piece, the time as one cached text per millisecond, every other
        string through ``json.dumps``. That is some 3x faster than ``json.dumps`` of a
        dict, which would cost a few percent of a request."""
        usage = trace.usage()
        started_s = trace.started_s
        request_id = trace.request_id
        if not request_id.startswith(self.own_id_prefix):  # the client's: redact, escape
            request_id = json.dumps(self._client_text(request_id))
        else:
            request_id = f'"{request_id}"'
        predicted = trace.predicted_cached_tokens
        granted_s, first_s, ended_s = trace.granted_s, trace.first_byte_s, trace.ended_s
        prompt, cached, completion = (
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
        )
        lines = self._lines
        lines.append(
            f'{{"time":"{self._time(trace.wall_s)}","request_id":{request_id},'
            f"{self._shared(trace)}"
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
        if len(lines) >= BATCH_LINES:
            self._write_lines()

    def _shared(self, trace: RequestTrace) -> str:
        """The fields from ``key_id`` to ``stream`` as one JSON piece (cached, bounded: the
        model is the client's; a piece past the bound is formatted each time)."""
        key = (
            trace.key_id, trace.route, trace.model, trace.endpoint, self._router_name(),
            trace.num_attempts, trace.failovers, trace.status, trace.outcome,
            trace.error_kind, trace.is_stream,
        )  # fmt: skip
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._format_shared(trace, key[4])
            if len(self._pieces) < _MAX_CACHED:
                self._pieces[key] = piece
        return piece

    def _format_shared(self, trace: RequestTrace, router: str) -> str:
        quote = self._quoted
        failovers = trace.failovers
        error = trace.error_kind
        return (
            f'"key_id":{quote(trace.key_id)},"route":{quote(trace.route)},'
            f'"model":{self._model(trace.model)},"endpoint":{quote(trace.endpoint or None)},'
            f'"router":{quote(router)},"attempts":{trace.num_attempts},'
            f'"failovers":{"[]" if not failovers else json.dumps(list(failovers))},'
            f'"status":{trace.status},"outcome":{json.dumps(trace.outcome)},'
            f'"error":{"null" if error is None else json.dumps(error)},'
            f'"stream":{"true" if trace.is_stream else "false"},'
        )

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

    def _write_lines(self) -> None:
        """Hands the kept lines to the file's buffer, as one string."""
        text = "".join(self._lines)
        self._lines.clear()
        try:
            self._file.write(text)
        except (OSError, ValueError) as exc:  # ValueError: written after close
            self._failed(exc)

    def flush(self) -> None:
        if self._lines:
            self._write_lines()
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
        """``wall_s`` as ISO 8601 UTC with milliseconds (its text kept per millisecond)."""
        milli = int(wall_s * 1000)
        if milli == self._milli:
            return self._milli_text
        second, rest = divmod(milli, 1000)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        self._milli = milli
        self._milli_text = text = f"{self._second_text}.{rest:03d}Z"
        return text

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
