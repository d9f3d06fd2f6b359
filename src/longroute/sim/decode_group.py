"""The decoding sequences of one engine, advanced in lock-step.

Every decode iteration gives each decoding sequence one token, so their
progress is implicit: a sequence that joined at decode step ``base_step``
has computed ``base_computed + step - base_step`` tokens. Two heaps keyed by
step give the next finish and the next KV-block crossing, so an iteration
costs O(log n) per event instead of O(batch). Heap entries carry the
sequence's ``epoch``; leaving the group bumps it, which invalidates them
(lazy deletion).
"""

from __future__ import annotations

import heapq

from longroute.sim.kv_memory import KvMemory
from longroute.sim.sequence import Sequence

_StepHeap = list[tuple[int, int, int, Sequence]]  # (step, order, epoch, seq)


class DecodeGroup:
    __slots__ = ("_alloc_heap", "_finish_heap", "_order", "context_tokens", "kv", "members",
                 "step")  # fmt: skip

    def __init__(self, kv: KvMemory) -> None:
        self.kv = kv
        self.members: dict[Sequence, None] = {}  # admission order
        self.step = 0  # decode iterations run so far
        self.context_tokens = 0  # sum of computed tokens over members
        self._finish_heap: _StepHeap = []
        self._alloc_heap: _StepHeap = []
        self._order = 0

    def __len__(self) -> int:
        return len(self.members)

    def newest(self) -> Sequence:
        return next(reversed(self.members))

    def steps_to_next_finish(self) -> int:
        """Decode steps until the next member finishes (group must be non-empty)."""
        heap = self._finish_heap
        while heap[0][2] != heap[0][3].epoch:  # drop entries of departed sequences
            heapq.heappop(heap)
        return heap[0][0] - self.step

    def advance(self, num_steps: int) -> None:
        """``num_steps`` decode iterations ran (their KV blocks were grown already)."""
        self.step += num_steps
        self.context_tokens += len(self.members) * num_steps

    def add(self, seq: Sequence) -> None:
        step = self.step
        seq.epoch += 1
        seq.base_step = step
        seq.base_computed = seq.num_computed_tokens
        seq.base_generated = seq.num_generated
        seq.finish_step = step + seq.num_output_tokens - seq.num_generated
        self.members[seq] = None
        self.context_tokens += seq.num_computed_tokens
        self._order += 1
        heapq.heappush(self._finish_heap, (seq.finish_step, self._order, seq.epoch, seq))
        alloc_step = step + self.kv.room_tokens(seq) - seq.num_computed_tokens
        heapq.heappush(self._alloc_heap, (alloc_step, self._order, seq.epoch, seq))

    def remove(self, seq: Sequence) -> None:
        """Bring the sequence's counters up to date and take it out of the group."""
        done = self.step - seq.base_step
        seq.num_computed_tokens = seq.base_computed + done
        seq.num_generated = seq.base_generated + done
        del self.members[seq]
        self.context_tokens -= seq.num_computed_tokens
        seq.epoch += 1  # invalidates its heap entries

    def grow(self, upto_step: int) -> bool:
        """Give each decoding sequence the KV blocks it needs for steps < ``upto_step``.

        Returns False if memory ran out (the caller preempts and retries).
        """
        heap = self._alloc_heap
        kv = self.kv
        kvb = kv.kv_block_tokens
        free = kv.free_tokens()
        while heap and heap[0][0] < upto_step:
            alloc_step, order, epoch, seq = heap[0]
            if epoch != seq.epoch:
                heapq.heappop(heap)
                continue
            need = -(-(upto_step - alloc_step) // kvb) * kvb
            if need > free:
                if not kv.ensure_free(need):
                    return False
                free = kv.free_tokens()
            free -= need
            kv.grow(seq, need)
            heapq.heapreplace(heap, (alloc_step + need, order, epoch, seq))
        return True

    def pop_finished(self) -> list[Sequence]:
        heap = self._finish_heap
        step = self.step
        finished = []
        while heap and heap[0][0] <= step:
            _, _, epoch, seq = heapq.heappop(heap)
            if epoch == seq.epoch:
                self.remove(seq)
                finished.append(seq)
        return finished
