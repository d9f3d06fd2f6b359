"""Keeping secrets and forged lines out of what the gateway shows: responses and logs.

A backend is untrusted: its error bodies may quote the request it got,
``Authorization: Bearer <backend key>`` included, and may contain newlines
that forge log lines. :class:`Redactor` knows the configured secrets (backend
and client API keys) and removes, from any text, every secret, every run of
:data:`FRAGMENT_CHARS` or more characters of one (an engine that prints "sk-ab...yz"
shows part of a key), and every credential-looking token (``Bearer x``,
``api_key=x``); :meth:`Redactor.text` also escapes control characters, so one
record stays one line. :class:`RedactingFilter` applies it to every log record.

Costs: :meth:`Redactor.text` is O(len(text)) set lookups, called only on error
paths and log records; :meth:`Redactor.body` (a backend's 2xx bytes relayed to
a client) is one ``bytes.find`` per configured backend key, O(len(data)).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

FRAGMENT_CHARS = 8
"""Shortest run of a secret's characters that counts as leaking it."""
REDACTED = "[redacted]"
_CREDENTIAL = re.compile(
    r"(?i)(\bbearer\s+|\bbasic\s+|\b(?:api[-_]?key|x-api-key|token|password|secret)"
    r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}\[\]]+"  # no '[': "[redacted]" stays as it is
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
ADDRESS = "[address]"
# what names a network place whoever wrote it: a URL, an IPv4 or bracketed IPv6 address
# (with or without a port), a ('host', port) tuple as Python's socket errors print it
_ADDRESS = re.compile(
    r"(?i)\b[a-z][a-z0-9+.-]*://[^\s\"'<>]+"
    r"|\[[0-9a-f:.]*:[0-9a-f:.]*\](?::\d{1,5})?"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b"
    r"|\(\s*'[^']*'\s*,\s*\d{1,5}\s*\)"
)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or f"\\x{ord(char):02x}"


class Redactor:
    """Removes configured secrets from text; immutable once built.

    ``addresses``: the backends' URLs. :meth:`client_text` removes them (URL, host:port
    and host name) and anything shaped like a network address from a text meant for a
    client; the log keeps them, for the operator.
    """

    __slots__ = ("_fragment_chars", "_fragments", "_hosts", "_secret_bytes", "_secrets")

    def __init__(
        self,
        secrets: Iterable[str],
        *,
        fragment_chars: int = FRAGMENT_CHARS,
        addresses: Iterable[str] = (),
    ) -> None:
        if fragment_chars < 1:
            raise ValueError(f"fragment_chars must be >= 1, got {fragment_chars}")
        self._hosts = _host_names(addresses)
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._secret_bytes = [s.encode("utf-8", "surrogatepass") for s in self._secrets]
        self._fragment_chars = fragment_chars
        self._fragments = {
            secret[i : i + fragment_chars]
            for secret in self._secrets
            for i in range(max(1, len(secret) - fragment_chars + 1))
        }

    @property
    def is_empty(self) -> bool:
        """True when no secret is configured (credential-looking tokens are still removed)."""
        return not self._secrets

    def secrets_only(self, text: str) -> str:
        """``text`` without secrets, fragments of them or credential tokens (newlines kept)."""
        text = _CREDENTIAL.sub(lambda m: m.group(1) + REDACTED, text)
        if not self._secrets:
            return text
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return self._without_fragments(text)

    def text(self, text: str, max_chars: int | None = None) -> str:
        """``text`` redacted, control characters escaped (one line), cut to ``max_chars``."""
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars] + "..."
        return _CONTROL.sub(_escape, self.secrets_only(text))

    def client_text(self, text: str, max_chars: int | None = None) -> str:
        """:meth:`text`, and no backend address: for an error message a client will see."""
        text = _ADDRESS.sub(ADDRESS, self.text(text, max_chars))
        return text if self._hosts is None else self._hosts.sub(ADDRESS, text)

    def body(self, data: bytes) -> bytes:
        """Bytes for a client with every whole configured secret replaced (a 2xx body or
        stream chunk: its content is relayed as it is, only a quoted secret goes)."""
        for secret in self._secret_bytes:
            if secret in data:
                data = data.replace(secret, REDACTED.encode())
        return data

    def _without_fragments(self, text: str) -> str:
        k = self._fragment_chars
        fragments = self._fragments
        spans: list[list[int]] = []
        for start in range(len(text) - k + 1):
            if text[start : start + k] in fragments:
                if spans and start <= spans[-1][1]:
                    spans[-1][1] = start + k
                else:
                    spans.append([start, start + k])
        if not spans:
            return text
        parts: list[str] = []
        position = 0
        for start, end in spans:
            parts.append(text[position:start])
            parts.append(REDACTED)
            position = end
        parts.append(text[position:])
        return "".join(parts)


def _host_names(urls: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern of the host names of ``urls`` as whole names, with any port (longest
    first, so a name is not cut by a shorter one); None without URLs."""
    hosts = {host for url in urls if (host := urlsplit(url).hostname)}
    if not hosts:
        return None
    names = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    return re.compile(rf"(?i)(?<![\w.-])(?:{names})(?::\d{{1,5}})?(?![\w-])")


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message (and traceback) in place.

    Attach it to a logger (it then sees that logger's own records) or to a
    handler (every record the handler emits). The message becomes one line:
    control characters are escaped, so a backend's text cannot forge records.
    """

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_longroute_redacted", False):
            return True  # already done (a logger's filter, then a handler's)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep what the record has, as text
            message = f"{record.msg!r} % {record.args!r}"
        record.msg = self.redactor.text(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.secrets_only(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redactor.secrets_only(record.stack_info)
        record._longroute_redacted = True
        return True


__all__ = ["ADDRESS", "FRAGMENT_CHARS", "REDACTED", "RedactingFilter", "Redactor"]
