"""Incremental parser of server-sent events (the OpenAI streaming format).

Called by the load generator with every chunk of bytes read from a streamed
response, however the network split it: an event may arrive across many
reads, and one read may hold many events. Only ``data`` fields matter here;
other fields and comment lines (``:``) are skipped. Lines end with ``\\n`` or
``\\r\\n``; an event ends at a blank line. Cost: O(bytes fed); the buffer only
ever holds the unfinished last line.
"""

from __future__ import annotations


class SSEParser:
    """Feed bytes in, get the ``data`` payload of each completed event out, in order."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every event completed by ``chunk`` (multi-line data joined by ``\\n``)."""
        buffer = self._buffer
        buffer += chunk
        events: list[str] = []
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, events)
        del buffer[:start]
        return events

    def finish(self) -> list[str]:
        """At end of stream: the last event, if it lacked its closing blank line."""
        events: list[str] = []
        if self._buffer:
            self._line(bytes(self._buffer).rstrip(b"\r"), events)
            self._buffer.clear()
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(b":"):
            return
        field, _, value = line.partition(b":")
        if field == b"data":
            if value.startswith(b" "):
                value = value[1:]
            self._data.append(value.decode("utf-8", errors="replace"))
