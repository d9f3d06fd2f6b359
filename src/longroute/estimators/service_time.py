"""Seconds a request would spend at one endpoint: queue, prefill and decode, learned online.

:class:`EndpointTimeModel` is the router-side picture of one replica that the
``ttca`` router prices requests with. It keeps the work this router sent there
(O(1) counters, updated at dispatch, first token and completion) and predicts,
for a new request with ``uncached`` prompt tokens after ``cached`` ones:

* **prefill phase** (queue wait plus its own prefill): every prompt token
  still owed by requests dispatched before it (FCFS, as vLLM and SGLang
  schedule prefills), then its own, run in chunks of at most
  ``max_num_batched_tokens - decodes`` tokens next to the running decodes (the
  chunked-prefill iteration of vLLM v1 and Sarathi). The phase is
  ``n`` iterations of the average chunk, each timed by the endpoint's
  :class:`RuntimePredictor` (roofline: compute or memory bound, attention over
  the chunks' cached context, the decodes' KV reads), ``n = ceil(work / chunk)``.
  The engine has been at the prompts owed since before the request: given the time
  it is sent and the round trip, the wait for them is cut by the time the engine will
  have worked on them when it arrives (since the oldest was sent, at most since the
  one before it left the queue), never below the request's own prefill. Without it
  the wait was counted as if none had started: a turn behind a queue waited 0.3-0.66x
  of what was predicted (``gorgo``, issue 35).
* **decode step**: one iteration of every sequence that will be decoding once
  it is admitted (running ones, those ahead of it, and itself) over their KV.
  Concentrating load lengthens it: the GORGO finding, priced here. Only for
  about the running batch's mean remaining output, though: after that the
  batch has drained, and the rest of a long answer is priced beside the
  requests now waiting for a first token alone.

Running decodes come from the router's own counters, or from the engine's
scraped ``num_running`` when that is larger (traffic from other routers).

**Self-calibration.** The profile may be wrong (another GPU, a slower engine,
load the model does not see). Each observation, the engine-side part of a
first token (TTFT minus the network round trip) or a time per output token,
is divided by what was predicted for it at dispatch, before any correction,
and an EWMA of the log of that ratio becomes a multiplicative correction of
later predictions (``ttft_correction``, ``tpot_correction``). Ratios are
clamped to [1/20, 20] so one outlier cannot run away with it; with
``alpha = 0.1`` a 2x error is learned to within 20% in about 15 observations.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs

MAX_RATIO = 20.0
"""Observed/predicted ratios beyond [1/MAX_RATIO, MAX_RATIO] are clamped before learning."""


_new_tuple = tuple.__new__
"""Builds a :class:`Prediction` from its five fields without NamedTuple's Python-level
``__new__`` (a third of a microsecond, 16 times a decision)."""

_State = tuple[
    int | None,
    int,
    int,
    int,
    int,
    float,
    int,
    int,
    float,
    float,
    float,
    float,
    tuple[tuple[float, float, float], tuple[float, float, float]] | None,
]
"""EndpointTimeModel's counters as predict() reads them (see ``_refresh``)."""


class Prediction(NamedTuple):
    """Predicted engine-side seconds at one endpoint, before network (a tuple: one is
    built per candidate per decision, and a frozen dataclass costs 10x more to make).

    ``prefill_s`` and ``step_s`` are the profile's (uncorrected) figures, kept so an
    observation can be judged against them; ``ttft_engine_s`` and ``tpot_s`` carry
    the learned corrections. ``externality_s`` (corrected) is what the request would
    add to the others at the endpoint: its prefill chunks lengthen every running
    decode's iterations, and its place in the decode batch lengthens their steps.
    """

    prefill_s: float
    step_s: float
    ttft_engine_s: float
    tpot_s: float
    externality_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Calibration:
    """One endpoint's learned corrections and the figures behind them (for /metrics)."""

    ttft_correction: float
    tpot_correction: float
    num_ttft_observed: int
    num_tpot_observed: int
    last_predicted_ttft_s: float | None
    last_observed_ttft_s: float | None
    last_predicted_tpot_s: float | None
    last_observed_tpot_s: float | None


class EndpointTimeModel:
    """Router-side counters and time predictions for one endpoint (see module docstring).

    Every method is O(1). The owner (the router) calls :meth:`add_pending` at
    dispatch, :meth:`start_decoding` at the first token, and :meth:`end_pending`
    or :meth:`end_decoding` when the request leaves. What :meth:`predict` reads of
    the counters (and the decode-only iteration times they imply) is kept until one
    of them changes: a router prices every endpoint per request, and between two
    requests only the chosen endpoint's counters move.
    """

    __slots__ = (
        "_iteration_s",
        "_last_started_s",
        "_log_tpot",
        "_log_ttft",
        "_pending_since",
        "_state",
        "alpha",
        "budget_tokens",
        "decode_context_tokens",
        "decode_remaining_tokens",
        "last_observed_tpot_s",
        "last_observed_ttft_s",
        "last_predicted_tpot_s",
        "last_predicted_ttft_s",
        "num_decoding",
        "num_pending",
        "num_tpot_observed",
        "num_ttft_observed",
        "pending_context_tokens",
        "pending_pairs",
        "pending_tokens",
        "predictor",
        "tpot_correction",
        "ttft_correction",
    )

    def __init__(
        self, predictor: RuntimePredictor, max_num_batched_tokens: int, alpha: float
    ) -> None:
        self.predictor = predictor
        self.budget_tokens = max(1, max_num_batched_tokens)
        self.alpha = alpha
        self.pending_tokens = 0  # uncached prompt tokens owed by requests before first token
        self.pending_pairs = 0.0  # their attention (query, key) pairs
        self.pending_context_tokens = 0  # their cached context tokens
        self.num_pending = 0
        # (dispatch time, seconds of its own prefill alone) of the prompts owed, oldest
        # first, and when the last of them left the queue (its first token came back): how
        # long the engine has been at the queue
        self._pending_since: deque[tuple[float, float]] = deque()
        self._last_started_s = -math.inf
        self.num_decoding = 0
        self.decode_context_tokens = 0.0  # sum of decoding sequences' mean KV length
        self.decode_remaining_tokens = 0.0  # sum of their mean remaining output
        self._iteration_s = predictor.iteration_time_s
        # what predict() needs of the counters; dropped when one changes
        self._state: _State | None = None
        self._log_ttft = 0.0
        self._log_tpot = 0.0
        self.ttft_correction = 1.0
        self.tpot_correction = 1.0
        self.num_ttft_observed = 0
        self.num_tpot_observed = 0
        self.last_predicted_ttft_s: float | None = None
        self.last_observed_ttft_s: float | None = None
        self.last_predicted_tpot_s: float | None = None
        self.last_observed_tpot_s: float | None = None

    # ---- prediction ----------------------------------------------------------
    def predict(
        self,
        uncached: int,
        cached: int,
        num_output_tokens: int,
        engine_running: int | None,
        now_s: float | None = None,
        rtt_s: float = 0.0,
    ) -> Prediction:
        """Engine-side seconds for a request of ``uncached`` new prompt tokens after
        ``cached`` ones that will decode ``num_output_tokens`` tokens here, sent at
        ``now_s`` over a round trip of ``rtt_s`` (without ``now_s`` the queue ahead is
        taken as not yet started: :meth:`queue_progress_s`)."""
        state = self._state
        if state is None or state[0] != engine_running:
            state = self._refresh(engine_running)
        (
            _,
            decodes,
            context,
            chunk,
            pending_tokens,
            pending_pairs,
            pending_context,
            num_pending,
            others_kv,
            horizon,
            base_s,
            fewer_s,
            lines,
        ) = state
        iteration_s = self._iteration_s
        own_pairs = float(uncached * cached) + uncached * (uncached + 1) / 2.0  # causal
        work = pending_tokens + uncached
        n = 0
        if work > 0:
            n = -(-work // chunk)
            one_s = iteration_s(
                -(-work // n),
                (pending_pairs + own_pairs) / n,
                int((pending_context + cached) / n),
                decodes,
                context,
            )
            prefill_s = n * one_s
        else:  # fully cached: one iteration computes the first token
            one_s = prefill_s = iteration_s(0, 0.0, cached, decodes + 1, context)
        batch = decodes + num_pending + 1
        own_kv = uncached + cached + num_output_tokens / 2.0
        kv = int(others_kv + own_kv)
        if lines is None:
            step_s = iteration_s(0, 0.0, 0, batch, kv)
        else:  # the same figure without a call (RuntimePredictor.decode_step_line)
            fixed_s, attention_s, kv_s = lines[0]
            busy_s, read_s = kv * attention_s, (kv + batch) * kv_s
            step_s = fixed_s + (busy_s if busy_s > read_s else read_s)
        # today's batch drains within about its mean remaining output; the tokens after
        # that are decoded beside the requests now waiting for a first token only
        # (later arrivals are spread by routing): a long answer is not priced at the
        # snapshot's batch for its whole length
        near = float(num_output_tokens)
        if horizon < near:
            near = horizon
        far = num_output_tokens - near
        mean_step_s = step_s
        if far > 0.0:
            kv = int(pending_context + own_kv)
            if lines is None:
                lone_s = iteration_s(0, 0.0, 0, num_pending + 1, kv)
            else:
                fixed_s, attention_s, kv_s = lines[1]
                busy_s, read_s = kv * attention_s, (kv + num_pending + 1) * kv_s
                lone_s = fixed_s + (busy_s if busy_s > read_s else read_s)
            mean_step_s = (near * step_s + far * lone_s) / num_output_tokens
        ttft_s = prefill_s
        own_s = -1.0  # its own chunks' seconds beside the decodes, without the queue ahead
        m = 0
        if num_pending > 0 and uncached > 0:
            m = -(-uncached // chunk)
            with_chunk_s = iteration_s(
                -(-uncached // m), own_pairs / m, int(cached / m), decodes, context
            )
            own_s = m * with_chunk_s
        if now_s is not None and num_pending > 0 and pending_tokens > 0:
            # the engine has been at the queue since before this request: only what is left
            # of it is waited for (never less than the request's own prefill)
            progress_s = self.queue_progress_s(now_s, rtt_s)
            if progress_s > 0.0:
                if own_s < 0.0:  # fully cached: one iteration computes the first token
                    own_s = iteration_s(0, 0.0, cached, decodes + 1, context)
                wait_s = prefill_s - own_s
                if wait_s > 0.0:
                    ttft_s = prefill_s - (wait_s if wait_s < progress_s else progress_s)
        externality_s = 0.0
        if decodes > 0:
            # each running decode waits for this prompt's chunks beside it ...
            if uncached > 0:
                # with no prompt queued ahead its chunks are the prefill's iterations above;
                # else its own chunks alone, without the prompts queued ahead
                beside_s = n * (one_s - base_s) if num_pending == 0 else own_s - m * base_s
                externality_s = decodes * beside_s
            # ... and then steps beside one more sequence while they share the batch
            externality_s += (batch - 1) * (step_s - fewer_s) * near
        correction = self.ttft_correction
        return _new_tuple(
            Prediction,
            (
                prefill_s,
                mean_step_s,
                ttft_s * correction,
                mean_step_s * self.tpot_correction,
                externality_s * correction,
            ),
        )

    def queue_progress_s(self, now_s: float, rtt_s: float) -> float:
        """Seconds the engine will have worked on the prompts owed here by the time a
        request sent at ``now_s`` reaches it (``rtt_s`` the round trip): since the oldest
        was sent, and at most since the one before it left the queue (its first token
        reached the router half a round trip after the engine made it, and the new
        request arrives half a round trip after ``now_s``), and at most the oldest one's
        own prefill alone (uncorrected). 0 with none owed."""
        if not self._pending_since:
            return 0.0
        sent_s, head_s = self._pending_since[0]
        since_sent = now_s - sent_s
        since_started = now_s - self._last_started_s + rtt_s
        progress = since_sent if since_sent < since_started else since_started
        # no more than the oldest prompt's own prefill: past it, its first token would be
        # back; one that is late says the engine is slower than priced (or stalled), and
        # the rest of the queue is then taken as not started
        if progress > head_s:
            progress = head_s
        return progress if progress > 0.0 else 0.0

    def prefill_alone_s(self, uncached: int, cached: int) -> float:
        """Seconds to prefill ``uncached`` tokens after ``cached`` ones on an idle engine, as
        one iteration (corrected): what a cached prefix saves each later turn. O(1)."""
        pairs = uncached * cached + uncached * (uncached + 1) / 2.0
        return self._iteration_s(uncached, pairs, cached, 0, 0) * self.ttft_correction

    def _refresh(self, engine_running: int | None) -> _State:
        """What :meth:`predict` needs of the counters (and the decode-only iteration
        times of the running decodes and of everyone but the new request), kept until a
        counter or the scraped ``engine_running`` changes: between two changes at this
        endpoint the router prices many requests."""
        decodes = own = self.num_decoding
        if engine_running is not None and engine_running > decodes:
            decodes = engine_running
        context = self.decode_context_tokens
        if decodes > own and own > 0:
            context *= decodes / own  # others' sequences: our mean length
        chunk = self.budget_tokens - decodes
        if chunk < 1:
            chunk = 1
        others_kv = context + self.pending_context_tokens + self.pending_tokens
        horizon = self.decode_remaining_tokens / own if own > 0 else math.inf
        base_s = fewer_s = 0.0
        if decodes > 0:
            iteration_s = self._iteration_s
            base_s = iteration_s(0, 0.0, 0, decodes, int(context))
            fewer_s = iteration_s(0, 0.0, 0, decodes + self.num_pending, int(others_kv))
        # decode steps of the batch with the new request, and of it beside the prompts
        # queued ahead alone: each (fixed, attention, KV) seconds, or None
        line = self.predictor.decode_step_line
        step = line(decodes + self.num_pending + 1)
        lone = line(self.num_pending + 1)
        lines = None if step is None or lone is None else (step, lone)
        state = self._state = (
            engine_running,
            decodes,
            int(context),
            chunk,
            self.pending_tokens,
            self.pending_pairs,
            self.pending_context_tokens,
            self.num_pending,
            others_kv,
            horizon,
            base_s,
            fewer_s,
            lines,
        )
        return state

    # ---- counters ------------------------------------------------------------
    def add_pending(self, uncached: int, cached: int, sent_s: float | None = None) -> None:
        """One more prompt owed, sent at ``sent_s`` (None: its progress is not tracked)."""
        self._state = None
        pairs = causal_attention_pairs(uncached, cached)
        if sent_s is not None:
            own_s = self._iteration_s(uncached, pairs, cached, 0, 0) if uncached > 0 else 0.0
            self._pending_since.append((sent_s, own_s))
        self.pending_tokens += uncached
        self.pending_pairs += pairs
        self.pending_context_tokens += cached
        self.num_pending += 1

    def end_pending(
        self,
        uncached: int,
        cached: int,
        sent_s: float | None = None,
        now_s: float | None = None,
    ) -> None:
        """A prompt sent at ``sent_s`` left the queue at ``now_s`` (its first token came
        back, or it ended without one)."""
        self._state = None
        since = self._pending_since
        if sent_s is not None and since:
            if since[0][0] == sent_s:  # first tokens come back in the order prompts were sent
                since.popleft()
            else:  # out of order (a failover, a release without a token)
                for entry in since:
                    if entry[0] == sent_s:
                        since.remove(entry)
                        break
        if now_s is not None:
            self._last_started_s = now_s
        self.pending_tokens -= uncached
        self.pending_pairs -= causal_attention_pairs(uncached, cached)
        self.pending_context_tokens -= cached
        self.num_pending -= 1
        if self.num_pending == 0:  # drop float residue
            self.pending_pairs = 0.0

    def start_decoding(
        self,
        uncached: int,
        cached: int,
        kv_tokens: float,
        remaining_tokens: float,
        sent_s: float | None = None,
        now_s: float | None = None,
    ) -> None:
        """``remaining_tokens``: the output it has left to decode, on average over its
        decode (half its expected output); ``sent_s`` and ``now_s`` as :meth:`end_pending`."""
        self._state = None
        self.end_pending(uncached, cached, sent_s, now_s)
        self.num_decoding += 1
        self.decode_context_tokens += kv_tokens
        self.decode_remaining_tokens += remaining_tokens

    def end_decoding(self, kv_tokens: float, remaining_tokens: float) -> None:
        self._state = None
        self.num_decoding -= 1
        self.decode_context_tokens -= kv_tokens
        self.decode_remaining_tokens -= remaining_tokens
        if self.num_decoding == 0:
            self.decode_context_tokens = 0.0
            self.decode_remaining_tokens = 0.0

    # ---- learning ------------------------------------------------------------
    def observe_ttft(
        self, predicted_s: float, observed_s: float, uncorrected_s: float, observed_engine_s: float
    ) -> None:
        """Learn from one first token: ``observed_engine_s`` (TTFT minus the round trip)
        against ``uncorrected_s``, the profile's prediction at dispatch."""
        self.last_predicted_ttft_s = predicted_s
        self.last_observed_ttft_s = observed_s
        self.num_ttft_observed += 1
        self._log_ttft = self._learn(self._log_ttft, observed_engine_s, uncorrected_s)
        self.ttft_correction = math.exp(self._log_ttft)

    def observe_tpot(self, predicted_s: float, observed_s: float, uncorrected_s: float) -> None:
        """Learn from one completed decode's mean time per output token."""
        self.last_predicted_tpot_s = predicted_s
        self.last_observed_tpot_s = observed_s
        self.num_tpot_observed += 1
        self._log_tpot = self._learn(self._log_tpot, observed_s, uncorrected_s)
        self.tpot_correction = math.exp(self._log_tpot)

    def share_corrections(self, learner: EndpointTimeModel) -> None:
        """Takes ``learner``'s corrections as long as this model has learned none of its
        own (each kind apart): endpoints timed from the same prior start from what a peer
        learned, not from the prior, so one that has not answered yet is not priced as the
        prior says while its peers turned out 10x faster. O(1)."""
        if self.num_ttft_observed == 0:
            self._log_ttft, self.ttft_correction = learner._log_ttft, learner.ttft_correction
        if self.num_tpot_observed == 0:
            self._log_tpot, self.tpot_correction = learner._log_tpot, learner.tpot_correction

    def _learn(self, log_correction: float, observed_s: float, uncorrected_s: float) -> float:
        if not (uncorrected_s > 0.0 and observed_s > 0.0):
            return log_correction
        ratio = observed_s / uncorrected_s
        ratio = min(max(ratio, 1.0 / MAX_RATIO), MAX_RATIO)
        return log_correction + self.alpha * (math.log(ratio) - log_correction)

    def calibration(self) -> Calibration:
        return Calibration(
            self.ttft_correction,
            self.tpot_correction,
            self.num_ttft_observed,
            self.num_tpot_observed,
            self.last_predicted_ttft_s,
            self.last_observed_ttft_s,
            self.last_predicted_tpot_s,
            self.last_observed_tpot_s,
        )
