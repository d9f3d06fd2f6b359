"""How many more turns a conversation will have, learned from the conversations seen.

:class:`SessionTurns` counts each conversation's turns as they are dispatched (first
attempts only) and keeps a histogram of those counts, over the conversations it tracks
and those it has forgotten (the least recently active beyond ``max_sessions``, which are
most likely over). The expected number of turns after the k-th is the mean residual of
that histogram::

    R(k) = sum over c > k of (c - k) * h[c]  /  sum over c >= k of h[c]

so a conversation at its k-th turn is compared only with conversations that reached k
turns. Conversations still going count with the turns they have had so far, which makes
R a lower bound early in a run (the ttca router's session price, docs/ttca.md, then errs
towards moving). With no conversation seen, R = 0. Counts are capped at
:data:`MAX_TURNS`.

Costs: :meth:`observe` O(1); :meth:`expected_remaining` O(1) amortised (the residuals
are recomputed, O(MAX_TURNS), at most once per :data:`REFRESH_EVERY` observations).
"""

from __future__ import annotations

from collections import OrderedDict

MAX_TURNS = 256
REFRESH_EVERY = 64
"""Observations between two recomputations of the residuals (a histogram of thousands
of conversations moves little in 64 turns)."""


class SessionTurns:
    """Turns per conversation and the expected turns still to come (module docstring)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._turns: OrderedDict[str, int] = OrderedDict()
        self._hist = [0] * (MAX_TURNS + 1)  # conversations by turns so far (index 0 unused)
        self._residual: list[float] = [0.0] * (MAX_TURNS + 2)
        self._since_refresh = REFRESH_EVERY  # stale from the start

    def turns(self, session_id: str) -> int:
        """Turns of ``session_id`` dispatched so far (0 if unknown or forgotten)."""
        return self._turns.get(session_id, 0)

    def observe(self, session_id: str) -> None:
        """One more turn of ``session_id`` was dispatched."""
        turns = self._turns
        count = turns.pop(session_id, 0)
        hist = self._hist
        if count:
            hist[count] -= 1
        count = min(count + 1, MAX_TURNS)
        hist[count] += 1
        turns[session_id] = count  # most recently active last
        if len(turns) > self.max_sessions:
            turns.popitem(last=False)  # forgotten: its count stays in the histogram
        self._since_refresh += 1

    def expected_remaining(self, turn: int) -> float:
        """R(turn): the expected turns after a conversation's ``turn``-th (>= 1)."""
        if self._since_refresh >= REFRESH_EVERY:
            self._refresh()
        return self._residual[min(max(turn, 1), MAX_TURNS)]

    def _refresh(self) -> None:
        """Mean residuals for every k, from the top down: O(MAX_TURNS)."""
        hist, residual = self._hist, self._residual
        reached = 0  # conversations with at least k turns
        beyond = 0  # sum over c >= k of (c - k) * h[c]
        residual[MAX_TURNS + 1] = 0.0
        for k in range(MAX_TURNS, 0, -1):
            beyond += reached  # each conversation with > k turns has one more turn beyond k
            reached += hist[k]
            residual[k] = beyond / reached if reached else 0.0
        self._since_refresh = 0
