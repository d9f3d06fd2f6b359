"""The engine model of one replica: continuous batching with chunked prefill.

Per iteration, as vLLM v1 schedules: every decoding sequence gets one token,
then prefilling sequences (admission order) get the chunks the packer
grants, then waiting sequences are admitted in queue-policy order while
seats, budget and KV memory last. (vLLM walks one running list; decodes sit
before newer prefills in it, and it requires ``max_num_batched_tokens >=
max_num_seqs``, so decodes always fit — the same outcome.) KV memory is
counted in tokens: shared prefix-cache blocks plus private allocations
rounded up to the KV block size. When a sequence cannot grow, the most
recently admitted one is preempted (recompute, vLLM's default) and returns
to the queue front; its cached prefix blocks usually survive. With a slack
queue policy (EDF, LRS, LARS) prefills are instead re-ordered by the policy
every iteration, chunk by chunk (Medha's preemption, :mod:`longroute.sim.preemptive`).

Speed, without losing iteration-level fidelity:

* Decoding sequences advance in lock-step, so their progress is implicit in
  a decode-step counter; finishes and KV-block crossings come from two heaps
  keyed by step. An iteration costs O(prefills + events), not O(batch).
* When an iteration is pure decode with nothing to admit, nothing changes
  until a sequence finishes, memory runs short or work arrives, so the engine
  jumps over those iterations at once (a *stretch*) with the predictor's
  closed-form sum of decode step times. An arrival cuts a stretch at the end
  of the iteration in progress. A test checks this equals stepping.

Under SPP a first token is reported when it leaves the pipeline, after its last
round; under KVP round times sum per sequence (:mod:`longroute.sim.parallel_engine`).

A front end that shares the engine's cores (``predictor.shared_frontend_s()`` > 0: a
measured CPU engine) takes that many seconds from a busy engine per arriving request:
the iteration in flight ends that much later, and the request joins the queue that
much after it arrived (its front-end work, run beside the engine, took twice as long
as alone). At an idle engine nothing changes: the predictor's first-token delay holds
the front end's time as latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from longroute.estimators.runtime import RuntimePredictor
from longroute.queueing.base import QueuePolicy
from longroute.sim.batching import BatchPacker
from longroute.sim.decode_group import DecodeGroup
from longroute.sim.events import EventLoop
from longroute.sim.kv_memory import KvMemory
from longroute.sim.parallel_engine import (
    kvp_plan_time_s,
    next_drained_s,
    start_decoding_drained,
)
from longroute.sim.preemptive import schedule_preemptive
from longroute.sim.sequence import Sequence
from longroute.types import Endpoint, Request


class EngineListener(Protocol):
    def on_first_token(self, seq: Sequence, t_s: float) -> None: ...

    def on_finish(self, seq: Sequence, t_s: float) -> None: ...


class EngineModel:
    def __init__(
        self,
        endpoint: Endpoint,
        predictor: RuntimePredictor,
        loop: EventLoop,
        listener: EngineListener,
        *,
        queue: QueuePolicy,
        packer: BatchPacker,
        prefix_block_tokens: int,
        is_prefix_caching: bool = True,
        is_fast_forward: bool = True,
    ) -> None:
        if endpoint.max_num_batched_tokens < endpoint.max_num_seqs:
            raise ValueError(
                f"endpoint {endpoint.name!r}: max_num_batched_tokens "
                f"({endpoint.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({endpoint.max_num_seqs}), as vLLM requires"
            )
        self.endpoint = endpoint
        self.predictor = predictor
        self.loop = loop
        self.listener = listener
        self.queue = queue
        self.packer = packer
        # a slack policy (EDF, LRS, LARS) re-orders prefills in progress every iteration
        self._is_preemptive = bool(getattr(queue, "is_preemptive", False))
        # an aging policy (stjf) counts scheduling rounds: it is told the iteration count
        self._observe_iterations: Callable[[int, float], None] | None = getattr(
            queue, "observe_iterations", None
        )
        self.kv = KvMemory(
            predictor.kv_capacity_tokens(endpoint.gpu_memory_utilization),
            endpoint.block_size_tokens,
            prefix_block_tokens,
            is_prefix_caching=is_prefix_caching,
        )
        self._is_kvp = predictor.kvp_degree > 1
        self.is_fast_forward = is_fast_forward and not self._is_kvp
        self.max_num_seqs = endpoint.max_num_seqs
        self.prefilling: list[Sequence] = []
        self.decoding = DecodeGroup(self.kv)
        self.draining: list[Sequence] = []  # SPP: first token still in the pipeline
        self.num_iterations = 0
        self.num_preemptions = 0
        self._version = 0
        self._plan: list[tuple[Sequence, int]] = []
        self._plan_num_decodes = 0
        self._stretch: tuple[float, int, int, int] | None = None  # t0, steps, B, C0
        self._is_stretch_held = False  # a front end delayed it: it ends with its step then
        self._iteration_s = 0.0  # predicted time of the iteration in flight
        self._iteration_end_s = 0.0  # when it ends
        self._is_busy = False
        self._frontend_s = predictor.shared_frontend_s()
        self._ingesting: list[Sequence] = []  # front end still at work (module doc)

    # ---- public --------------------------------------------------------
    def submit(
        self,
        request: Request,
        now_s: float,
        tag: object = None,
        num_output_tokens: int | None = None,
    ) -> Sequence:
        """A request reached the engine at ``now_s``; it will generate ``num_output_tokens``
        (None: ``request.num_output_tokens``; see :class:`Sequence`)."""
        cache_block_tokens = self.kv.cache.block_size_tokens
        if request.block_hashes and request.block_size_tokens != cache_block_tokens:
            raise ValueError(
                f"request {request.request_id!r} hashes {request.block_size_tokens}-token "
                f"blocks but engine {self.endpoint.name!r} caches "
                f"{cache_block_tokens}-token blocks"
            )
        seq = Sequence(request, now_s, tag, num_output_tokens)
        if self._frontend_s > 0.0 and self._is_busy:
            self._hold(now_s, self._frontend_s)
            self._ingesting.append(seq)
            self.loop.at(now_s + self._frontend_s, self._on_ingested, seq)
            return seq
        self._enqueue(seq, now_s)
        return seq

    def _on_ingested(self, seq: Sequence, _: object) -> None:
        if seq in self._ingesting:  # else aborted meanwhile
            self._ingesting.remove(seq)
            self._enqueue(seq, self.loop.now_s)

    def _hold(self, now_s: float, hold_s: float) -> None:
        """The work in flight ends ``hold_s`` later: a front end took the core (module doc)."""
        self._version += 1
        if self._stretch is not None:
            self._cut_stretch(now_s)  # the steps after the one in progress start afresh
            self._version += 1
            t0, num_steps, batch, ctx = self._stretch
            self._stretch = (t0 + hold_s, num_steps, batch, ctx)
            self._is_stretch_held = True
            t_end = t0 + hold_s + self.predictor.decode_stretch_time_s(batch, ctx, num_steps)
            self.loop.at(t_end, self._on_stretch_end, self._version)
            return
        self._iteration_end_s += hold_s
        self.loop.at(self._iteration_end_s, self._on_iteration_end, self._version)

    def _enqueue(self, seq: Sequence, now_s: float) -> None:
        if self._observe_iterations is not None and self._stretch is not None:
            self._observe_mid_stretch(now_s)
        self.queue.push(seq, now_s)
        if not self._is_busy:
            self._step(now_s)
        elif (
            self._stretch is not None
            and len(self.prefilling) + len(self.decoding.members) + len(self.draining)
            < self.max_num_seqs
        ):
            self._cut_stretch(now_s)

    def abort(self, seq: Sequence, now_s: float) -> bool:
        """Drop a request whose client went away, freeing its seat and KV memory now.

        Returns False if it already finished (or was aborted). An iteration in
        flight keeps its predicted time; its share for ``seq`` is discarded.
        """
        if seq.is_aborted:
            return False
        if self._stretch is not None:
            self._cut_stretch(now_s)  # the rest of the stretch runs without it
        if seq in self.decoding.members:
            self.decoding.remove(seq)
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
        elif seq in self.draining:
            self.draining.remove(seq)
        elif seq in self._ingesting:
            self._ingesting.remove(seq)
        elif not self.queue.remove(seq):
            return False
        self.kv.release(seq)
        seq.is_aborted = True
        if not self._is_busy:
            self._step(now_s)
        return True

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding.members) + len(self.draining)

    def stats(self) -> tuple[int, int, float]:
        """(waiting, running, KV usage in [0, 1]) as an engine's /metrics would show."""
        return len(self.queue), self.num_running, self.kv.usage()

    # ---- scheduling ----------------------------------------------------
    def _preempt_newest(self) -> Sequence:
        victim = self.prefilling[-1] if self.prefilling else self.decoding.newest()
        return self._preempt(victim)

    def _preempt(self, victim: Sequence) -> Sequence:
        """Evict ``victim`` for KV memory: it is recomputed later (vLLM's default)."""
        if victim in self.decoding.members:
            self.decoding.remove(victim)
        else:
            self.prefilling.remove(victim)
        self.kv.release(victim)
        victim.target_tokens = victim.num_prompt_tokens + victim.num_generated
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.queue.push_front(victim, self.loop.now_s)
        return victim

    def _schedule_running(self) -> tuple[list[tuple[Sequence, int]], bool]:
        is_preempted = False
        decoding = self.decoding
        members = decoding.members  # (its truth value, not DecodeGroup.__len__: hot path)
        while members and not decoding.grow(decoding.step + 1):
            self._preempt_newest()
            is_preempted = True
        if members:
            self.packer.grant_decodes(len(members), decoding.context_tokens)
        plan: list[tuple[Sequence, int]] = []
        grant = self.packer.grant
        prefilling = self.prefilling
        i = 0
        while i < len(prefilling):
            seq = prefilling[i]
            n = grant(seq, seq.target_tokens - seq.num_computed_tokens)
            if n == 0:
                break
            while not self.kv.reserve(seq, n):
                is_preempted = True
                if self._preempt_newest() is seq:
                    n = 0
                    break
            if n == 0:
                break
            plan.append((seq, n))
            i += 1
        return plan, is_preempted

    def _admit(self, seq: Sequence, relative_slack: float | None = None) -> int:
        """Try to start ``seq``: prefix match, grant, reserve. Returns tokens (0 = no)."""
        kv = self.kv
        num_hit = kv.match_and_pin(seq)
        seq.num_computed_tokens = num_hit * kv.cache.block_size_tokens
        wanted = seq.target_tokens - seq.num_computed_tokens
        n = self.packer.grant(seq, wanted, relative_slack=relative_slack)
        if n and kv.reserve(seq, n):
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = seq.num_computed_tokens
                seq.queue_s = self.loop.now_s - seq.arrival_s
            return n
        kv.release(seq)
        seq.num_computed_tokens = 0
        return 0

    def _step(self, now_s: float) -> None:
        """Form and launch the next iteration (or go idle)."""
        if self._observe_iterations is not None:
            self._observe_iterations(self.num_iterations, now_s)
        if self.draining:
            start_decoding_drained(self, now_s)
        self.packer.begin(now_s)
        if self._is_preemptive:
            plan, is_preempted = schedule_preemptive(self, now_s)
        else:
            plan, is_preempted = self._schedule_running()
        queue = self.queue
        num_decodes = len(self.decoding.members)
        if not is_preempted and not self._is_preemptive:
            prefilling = self.prefilling
            # seats: no sequence leaves decoding or draining while admitting
            seats = self.max_num_seqs - num_decodes - len(self.draining)
            while len(prefilling) < seats:
                head = queue.peek(now_s)
                if head is None:
                    break
                n = self._admit(head)
                if n == 0:
                    break
                queue.pop(now_s)
                prefilling.append(head)
                plan.append((head, n))
        if not plan and not num_decodes:
            self._is_busy = False
            if self.draining:  # wake when the first of them may decode
                self._version += 1
                self.loop.at(next_drained_s(self), self._on_wake, self._version)
            return
        self._is_busy = True
        self._version += 1
        can_stretch = self.is_fast_forward and not plan and not is_preempted and not self.draining
        if can_stretch and self._try_stretch(now_s):
            return
        self._plan = plan
        self._plan_num_decodes = num_decodes
        self._stretch = None
        self._iteration_s = self._plan_time_s(plan, num_decodes)
        self._iteration_end_s = now_s + self._iteration_s
        self.loop.at(self._iteration_end_s, self._on_iteration_end, self._version)

    def _plan_time_s(self, plan: list[tuple[Sequence, int]], num_decodes: int) -> float:
        if self._is_kvp:
            return kvp_plan_time_s(self.predictor, plan, self.decoding)
        num_prefill = 0
        pairs = 0.0
        prefill_ctx = 0
        for seq, n in plan:
            c = seq.num_computed_tokens
            num_prefill += n
            pairs += n * c + n * (n + 1) / 2
            prefill_ctx += c
        return self.predictor.iteration_time_s(
            num_prefill, pairs, prefill_ctx, num_decodes, self.decoding.context_tokens
        )

    def _on_wake(self, version: int, _: object) -> None:
        if version == self._version and not self._is_busy:
            self._step(self.loop.now_s)

    # ---- decode stretches ---------------------------------------------
    def _try_stretch(self, now_s: float) -> bool:
        batch = len(self.decoding.members)
        num_steps = self.decoding.steps_to_next_finish()
        # each later step needs at most one new KV block per sequence per kvb steps
        kvb = self.kv.kv_block_tokens
        room = self.kv.reclaimable_tokens()
        num_steps = min(num_steps, 1 + kvb * (room // (kvb * batch)))
        if num_steps < 2:
            return False
        ctx = self.decoding.context_tokens
        self._stretch = (now_s, num_steps, batch, ctx)
        self._is_stretch_held = False
        t_end = now_s + self.predictor.decode_stretch_time_s(batch, ctx, num_steps)
        self.loop.at(t_end, self._on_stretch_end, self._version)
        return True

    def _cut_stretch(self, now_s: float) -> None:
        """Work arrived mid-stretch: end it after the iteration in progress."""
        assert self._stretch is not None
        t0, num_steps, batch, ctx = self._stretch
        num_done = self._steps_done(now_s)
        num_new = num_done + 1
        if num_new >= num_steps:
            return
        self._version += 1
        self._stretch = (t0, num_new, batch, ctx)
        t_end = t0 + self.predictor.decode_stretch_time_s(batch, ctx, num_new)
        self.loop.at(t_end, self._on_stretch_end, self._version)

    def _observe_mid_stretch(self, now_s: float) -> None:
        """Tell an aging queue the iterations done so far, as stepping would have: a
        request that arrives mid-stretch is passed over only by the iterations after it."""
        assert self._stretch is not None and self._observe_iterations is not None
        self._observe_iterations(self.num_iterations + self._steps_done(now_s), now_s)

    def _steps_done(self, now_s: float) -> int:
        """Steps of the stretch in flight done by ``now_s``; once held (``_hold``), it ends
        with the step that was in progress, so all but its last."""
        assert self._stretch is not None
        t0, num_steps, batch, ctx = self._stretch
        if self._is_stretch_held:
            return num_steps - 1
        return self.predictor.decode_steps_within(batch, ctx, now_s - t0, num_steps)[0]

    def _on_stretch_end(self, version: int, _: object) -> None:
        if version != self._version or self._stretch is None:
            return
        num_steps = self._stretch[1]
        self._stretch = None
        self.num_iterations += num_steps
        # blocks for the skipped steps; the stretch's memory bound guarantees room
        is_ok = self.decoding.grow(self.decoding.step + num_steps)
        assert is_ok, "decode stretch ran out of KV memory"
        self.decoding.advance(num_steps)
        now_s = self.loop.now_s
        self._finish(self.decoding.pop_finished(), now_s)
        self._step(now_s)

    # ---- iteration end -------------------------------------------------
    def _on_iteration_end(self, version: int, _: object) -> None:
        if version != self._version:
            return
        now_s = self.loop.now_s
        self.num_iterations += 1
        finished: list[Sequence] = []
        if self._plan_num_decodes:
            self.decoding.advance(1)
            finished = self.decoding.pop_finished()
        listener = self.listener
        is_done_prefilling = False
        for seq, n in self._plan:
            if seq.is_aborted:
                continue
            seq.num_computed_tokens += n
            self.kv.settle(seq)
            if seq.num_computed_tokens < seq.target_tokens:
                continue
            is_done_prefilling = True
            seq.num_generated += 1
            first_s = seq.first_token_s
            if first_s is None:
                first_s = now_s + self.predictor.first_token_delay_s(self._iteration_s)
                seq.first_token_s = first_s
                listener.on_first_token(seq, first_s)
            if seq.num_generated >= seq.num_output_tokens:
                finished.append(seq)
            elif first_s > now_s:  # SPP: decodes once its first token is out
                self.draining.append(seq)
            else:
                self.decoding.add(seq)
        if is_done_prefilling:
            self.prefilling = [
                s for s in self.prefilling if s.num_computed_tokens < s.target_tokens
            ]
        self._plan = []
        self._finish(finished, now_s)
        self._step(now_s)

    def _finish(self, finished: list[Sequence], now_s: float) -> None:
        for seq in finished:
            self.kv.release(seq)
            first_s = seq.first_token_s  # later than now_s only under SPP (module doc)
            t_s = first_s if first_s is not None and first_s > now_s else now_s
            self.listener.on_finish(seq, t_s)
