"""The engine model of one replica: continuous batching with chunked prefill.

Per iteration (as vLLM v1 schedules): running sequences first, in admission
order (a decode takes one token, a prefill the chunk the packer grants), then
waiting sequences in queue-policy order while seats, budget and KV memory
last. KV memory is counted in tokens: shared prefix-cache blocks plus private
allocations rounded up to the KV block size. When a running sequence cannot
grow, the most recently admitted one is preempted (recompute, vLLM's default)
and returns to the queue front; its cached prefix blocks usually survive.

Speed: when an iteration is pure decode of every running sequence with no
admission or preemption, nothing changes until a sequence finishes, memory
runs short or work arrives, so the engine jumps over those iterations at once
(a *stretch*) using the predictor's closed-form sum of decode step times. An
arrival during a stretch cuts it at the end of the iteration in progress, so
results are those of stepping every iteration.
"""

from __future__ import annotations

from typing import Protocol

from longroute.estimators.runtime import RuntimePredictor
from longroute.prefix.engine_cache import EnginePrefixCache
from longroute.queueing.base import QueuePolicy
from longroute.sim.batching import BatchPacker
from longroute.sim.events import EventLoop
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
        self.endpoint = endpoint
        self.predictor = predictor
        self.loop = loop
        self.listener = listener
        self.queue = queue
        self.packer = packer
        self.cache = EnginePrefixCache(prefix_block_tokens)
        self.is_prefix_caching = is_prefix_caching
        self.is_fast_forward = is_fast_forward
        self.capacity_tokens = predictor.kv_capacity_tokens(endpoint.gpu_memory_utilization)
        self.kv_block_tokens = endpoint.block_size_tokens
        self.max_num_seqs = endpoint.max_num_seqs
        self.running: list[Sequence] = []
        self.num_private_tokens = 0
        self.num_iterations = 0
        self.num_preemptions = 0
        self._version = 0
        self._plan: list[tuple[Sequence, int]] = []
        self._stretch: tuple[float, int, int, int] | None = None  # t0, steps, B, C0
        self._is_busy = False

    # ---- public --------------------------------------------------------
    def submit(self, request: Request, now_s: float, tag: object = None) -> Sequence:
        """A request reached the engine at ``now_s``."""
        if request.block_hashes and request.block_size_tokens != self.cache.block_size_tokens:
            raise ValueError(
                f"request {request.request_id!r} hashes {request.block_size_tokens}-token "
                f"blocks but engine {self.endpoint.name!r} caches "
                f"{self.cache.block_size_tokens}-token blocks"
            )
        seq = Sequence(request, now_s, tag)
        self.queue.push(seq, now_s)
        if not self._is_busy:
            self._step(now_s)
        elif self._stretch is not None and len(self.running) < self.max_num_seqs:
            self._cut_stretch(now_s)
        return seq

    def stats(self) -> tuple[int, int, float]:
        """(waiting, running, KV usage in [0, 1]) as an engine's /metrics would show."""
        pinned = self.cache.num_blocks - self.cache.num_evictable_blocks
        used = pinned * self.cache.block_size_tokens + self.num_private_tokens
        return len(self.queue), len(self.running), used / self.capacity_tokens

    # ---- memory --------------------------------------------------------
    def _free_tokens(self) -> int:
        tree = self.cache.num_blocks * self.cache.block_size_tokens
        return self.capacity_tokens - tree - self.num_private_tokens

    def _ensure_free(self, num_tokens: int) -> bool:
        """Make ``num_tokens`` free, evicting unpinned cache blocks if needed."""
        free = self._free_tokens()
        if free >= num_tokens:
            return True
        bs = self.cache.block_size_tokens
        num_blocks = -(-(num_tokens - free) // bs)
        if num_blocks > self.cache.num_evictable_blocks:
            return False
        self.cache.evict(num_blocks)
        return True

    def _reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Allocate private KV for ``num_new_tokens`` more tokens of ``seq``."""
        kvb = self.kv_block_tokens
        private = seq.num_computed_tokens + num_new_tokens
        private -= seq.num_pinned_blocks * self.cache.block_size_tokens
        extra = -(-private // kvb) * kvb - seq.num_private_alloc_tokens
        if extra <= 0:
            return True
        if not self._ensure_free(extra):
            return False
        seq.num_private_alloc_tokens += extra
        self.num_private_tokens += extra
        return True

    def _release(self, seq: Sequence) -> None:
        if seq.num_pinned_blocks:
            self.cache.release(seq.hashes, seq.num_pinned_blocks)
            seq.num_pinned_blocks = 0
        self.num_private_tokens -= seq.num_private_alloc_tokens
        seq.num_private_alloc_tokens = 0

    def _settle_blocks(self, seq: Sequence) -> None:
        """After compute: full prompt blocks join the cache; shrink the private part."""
        bs = self.cache.block_size_tokens
        if self.is_prefix_caching and seq.hashes:
            num_full = min(len(seq.hashes), seq.num_computed_tokens // bs)
            if num_full > seq.num_pinned_blocks:
                self.cache.insert(seq.hashes, seq.num_pinned_blocks, num_full)
                seq.num_pinned_blocks = num_full
        kvb = self.kv_block_tokens
        private = seq.num_computed_tokens - seq.num_pinned_blocks * bs
        alloc = -(-private // kvb) * kvb
        self.num_private_tokens += alloc - seq.num_private_alloc_tokens
        seq.num_private_alloc_tokens = alloc

    # ---- scheduling ----------------------------------------------------
    def _preempt_last(self) -> Sequence:
        victim = self.running.pop()
        self._release(victim)
        victim.target_tokens = victim.num_prompt_tokens + victim.num_generated
        victim.num_computed_tokens = 0
        victim.is_matched = False
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.queue.push_front(victim, self.loop.now_s)
        return victim

    def _schedule_running(self, now_s: float) -> tuple[list[tuple[Sequence, int]], bool]:
        plan: list[tuple[Sequence, int]] = []
        grant = self.packer.grant
        running = self.running
        bs = self.cache.block_size_tokens
        is_preempted = False
        i = 0
        while i < len(running):
            seq = running[i]
            wanted = seq.target_tokens - seq.num_computed_tokens
            n = grant(seq, wanted if wanted > 0 else 1)
            if n == 0:
                break
            # fast path: the tokens fit in the sequence's last private KV block
            room = seq.num_pinned_blocks * bs + seq.num_private_alloc_tokens
            if seq.num_computed_tokens + n > room:
                while not self._reserve(seq, n):
                    is_preempted = True
                    if self._preempt_last() is seq:
                        n = 0
                        break
                if n == 0:
                    break
            plan.append((seq, n))
            i += 1
        return plan, is_preempted

    def _admit(self, seq: Sequence, now_s: float) -> int:
        """Try to start ``seq``: prefix match, grant, reserve. Returns tokens (0 = no)."""
        bs = self.cache.block_size_tokens
        num_hit = 0
        if self.is_prefix_caching and seq.hashes:
            num_hit = min(self.cache.match(seq.hashes), (seq.target_tokens - 1) // bs)
            if num_hit:
                self.cache.acquire(seq.hashes, num_hit)
        seq.num_pinned_blocks = num_hit
        seq.num_computed_tokens = num_hit * bs
        n = self.packer.grant(seq, seq.target_tokens - seq.num_computed_tokens)
        if n and self._reserve(seq, n):
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_hit * bs
            return n
        self._release(seq)
        seq.num_computed_tokens = 0
        return 0

    def _step(self, now_s: float) -> None:
        """Form and launch the next iteration (or go idle)."""
        self.packer.begin(now_s)
        plan, is_preempted = self._schedule_running(now_s)
        num_admitted = 0
        queue = self.queue
        if not is_preempted:
            while len(self.running) < self.max_num_seqs:
                head = queue.peek(now_s)
                if head is None:
                    break
                n = self._admit(head, now_s)
                if n == 0:
                    break
                queue.pop(now_s)
                self.running.append(head)
                plan.append((head, n))
                num_admitted += 1
        if not plan:
            self._is_busy = False
            return
        self._is_busy = True
        self._version += 1
        if (
            self.is_fast_forward
            and not is_preempted
            and not num_admitted
            and self._try_stretch(plan, now_s)
        ):
            return
        self._plan = plan
        self._stretch = None
        self.loop.at(now_s + self._plan_time_s(plan), self._on_iteration_end, self._version)

    def _plan_time_s(self, plan: list[tuple[Sequence, int]]) -> float:
        num_prefill = 0
        pairs = 0.0
        prefill_ctx = 0
        num_decodes = 0
        decode_ctx = 0
        for seq, n in plan:
            c = seq.num_computed_tokens
            if c < seq.target_tokens:
                num_prefill += n
                pairs += n * c + n * (n + 1) / 2
                prefill_ctx += c
            else:
                num_decodes += 1
                decode_ctx += c
        return self.predictor.iteration_time_s(
            num_prefill, pairs, prefill_ctx, num_decodes, decode_ctx
        )

    # ---- decode stretches ---------------------------------------------
    def _try_stretch(self, plan: list[tuple[Sequence, int]], now_s: float) -> bool:
        running = self.running
        if len(plan) != len(running):
            return False
        num_steps = 1 << 62
        ctx = 0
        for seq in running:
            if seq.num_computed_tokens < seq.target_tokens:
                return False
            left = seq.num_output_tokens - seq.num_generated
            if left < num_steps:
                num_steps = left
            ctx += seq.num_computed_tokens
        batch = len(running)
        # each later step needs at most one new KV block per sequence per kvb steps
        kvb = self.kv_block_tokens
        room = self._free_tokens() + self.cache.num_evictable_blocks * self.cache.block_size_tokens
        num_safe = kvb * (room // (kvb * batch))
        num_steps = min(num_steps, 1 + num_safe)
        if num_steps < 2:
            return False
        self._stretch = (now_s, num_steps, batch, ctx)
        t_end = now_s + self.predictor.decode_stretch_time_s(batch, ctx, num_steps)
        self.loop.at(t_end, self._on_stretch_end, self._version)
        return True

    def _cut_stretch(self, now_s: float) -> None:
        """Work arrived mid-stretch: end it after the iteration in progress."""
        assert self._stretch is not None
        t0, num_steps, batch, ctx = self._stretch
        num_done, _ = self.predictor.decode_steps_within(batch, ctx, now_s - t0, num_steps)
        num_new = num_done + 1
        if num_new >= num_steps:
            return
        self._version += 1
        self._stretch = (t0, num_new, batch, ctx)
        t_end = t0 + self.predictor.decode_stretch_time_s(batch, ctx, num_new)
        self.loop.at(t_end, self._on_stretch_end, self._version)

    def _on_stretch_end(self, version: int, _: object) -> None:
        if version != self._version or self._stretch is None:
            return
        now_s = self.loop.now_s
        num_steps = self._stretch[1]
        self._stretch = None
        self.num_iterations += num_steps
        kvb = self.kv_block_tokens
        bs = self.cache.block_size_tokens
        finished = []
        for seq in self.running:
            seq.num_computed_tokens += num_steps
            seq.num_generated += num_steps
            private = seq.num_computed_tokens - seq.num_pinned_blocks * bs
            extra = -(-private // kvb) * kvb - seq.num_private_alloc_tokens
            if extra > 0:
                self._ensure_free(extra)  # guaranteed by the stretch's memory bound
                seq.num_private_alloc_tokens += extra
                self.num_private_tokens += extra
            if seq.num_generated >= seq.num_output_tokens:
                finished.append(seq)
        self._finish(finished, now_s)
        self._step(now_s)

    # ---- iteration end -------------------------------------------------
    def _on_iteration_end(self, version: int, _: object) -> None:
        if version != self._version:
            return
        now_s = self.loop.now_s
        self.num_iterations += 1
        finished = []
        listener = self.listener
        for seq, n in self._plan:
            if seq.num_computed_tokens < seq.target_tokens:
                seq.num_computed_tokens += n
                self._settle_blocks(seq)
                if seq.num_computed_tokens < seq.target_tokens:
                    continue
                seq.num_generated += 1
                if seq.first_token_s is None:
                    seq.first_token_s = now_s
                    listener.on_first_token(seq, now_s)
            else:
                seq.num_computed_tokens += 1
                seq.num_generated += 1
            if seq.num_generated >= seq.num_output_tokens:
                finished.append(seq)
        self._plan = []
        self._finish(finished, now_s)
        self._step(now_s)

    def _finish(self, finished: list[Sequence], now_s: float) -> None:
        if not finished:
            return
        done = set(map(id, finished))
        self.running = [s for s in self.running if id(s) not in done]
        for seq in finished:
            self._release(seq)
            self.listener.on_finish(seq, now_s)
