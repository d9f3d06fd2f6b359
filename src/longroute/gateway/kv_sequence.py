"""Sequence tracking of one KV-event stream (one backend, one data-parallel rank).

vLLM numbers its published batches 0, 1, 2, ... from the start of the engine
process. Against the next expected number a received one is:

- ``IN_ORDER``: the expected one;
- ``GAP``: larger: batches were missed (ZeroMQ drops at the high-water mark, a
  reconnect, a subscriber that joined late);
- ``DUPLICATE``: smaller, but inside the window a replay just covered (the live
  copy of a batch the replay already delivered);
- ``RESTART``: smaller otherwise: a new engine process began numbering again.

Pure and O(1) per call: no I/O, no clock.
"""

from __future__ import annotations

import enum


class SequenceVerdict(enum.Enum):
    IN_ORDER = "in_order"
    GAP = "gap"
    DUPLICATE = "duplicate"
    RESTART = "restart"


class SequenceTracker:
    """The next expected sequence of one stream, and the window a replay covered.

    A new tracker expects 0: a first batch numbered above 0 is a gap (the
    batches before it, the engine's history, are unknown until replayed).
    """

    __slots__ = ("_duplicates_from", "_duplicates_to", "expected")

    def __init__(self) -> None:
        self.expected = 0
        self._duplicates_from = 0
        self._duplicates_to = 0  # empty window

    def classify(self, sequence: int) -> SequenceVerdict:
        """What ``sequence`` means against the stream so far (changes nothing)."""
        if sequence == self.expected:
            return SequenceVerdict.IN_ORDER
        if sequence > self.expected:
            return SequenceVerdict.GAP
        if self._duplicates_from <= sequence < self._duplicates_to:
            return SequenceVerdict.DUPLICATE
        return SequenceVerdict.RESTART

    def accept(self, sequence: int) -> None:
        """Batch ``sequence`` was applied (or is given up): expect the next one."""
        self.expected = sequence + 1
        if sequence >= self._duplicates_to:
            self._duplicates_from = self._duplicates_to = 0

    def replayed(self, from_sequence: int) -> None:
        """A replay applied ``from_sequence .. expected - 1``; live copies are duplicates."""
        self._duplicates_from = from_sequence
        self._duplicates_to = self.expected

    def restart(self) -> None:
        """A new engine process: expect its stream from 0."""
        self.expected = 0
        self._duplicates_from = self._duplicates_to = 0
