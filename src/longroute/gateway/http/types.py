"""The gateway's HTTP values: requests, whole responses and case-insensitive headers.

Shared by the server (:mod:`longroute.gateway.http.server`), the upstream
client (:mod:`longroute.gateway.http.upstream`) and the handlers. Header names are
stored lower-cased, so every lookup is one dict access.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, overload

_T = TypeVar("_T")

JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream"


class Headers(Mapping[str, str]):
    """Case-insensitive, read-only header mapping (a repeated header keeps its last value).

    O(1) lookups; built once per message from the parser's (name, value) pairs.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: dict[str, str] = {name.lower(): value for name, value in items}

    @classmethod
    def from_lower(cls, items: dict[str, str]) -> Headers:
        """Wraps a dict whose keys are already lower-case (no copy)."""
        headers = cls.__new__(cls)
        headers._items = items
        return headers

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    @overload
    def get(self, name: str, /) -> str | None: ...
    @overload
    def get(self, name: str, default: str, /) -> str: ...
    @overload
    def get(self, name: str, default: _T, /) -> str | _T: ...
    def get(self, name: str, default: object = None, /) -> object:
        return self._items.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


def lower_items(headers: Mapping[str, str]) -> Mapping[str, str]:
    """The fields of ``headers`` by lower-case name, for lookups by lower-case names: a
    :class:`Headers`' own dict (no copy; its ``get`` is one C call, where ``Headers.get``
    is a Python call that lower-cases the name first), else a lower-cased copy."""
    if type(headers) is Headers:
        return headers._items
    return {name.lower(): value for name, value in headers.items()}


@dataclass(slots=True)
class HttpRequest:
    """One parsed client request, body complete (the server enforces the size limit)."""

    method: str
    path: str
    query: str
    headers: Headers
    body: bytes
    http_version: str = "1.1"


@dataclass(slots=True)
class HttpResponse:
    """A whole (non-streamed) response; the server adds Content-Length, Date and Connection."""

    status: int
    body: bytes = b""
    content_type: str = JSON_TYPE
    headers: Mapping[str, str] = field(default_factory=dict)


__all__ = ["JSON_TYPE", "SSE_TYPE", "Headers", "HttpRequest", "HttpResponse", "lower_items"]
