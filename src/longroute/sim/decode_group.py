"""The decoding sequences of one engine, advanced in lock-step.

Every decode iteration gives each decoding sequence one token, so their
progress is implicit: a sequence that joined at decode step ``base_step``
has computed ``base_computed + step - base_step`` tokens. A heap keyed by
step gives the next finish; its entries carry the sequence's ``epoch``, which
leaving the group bumps, invalidating them (lazy deletion).

KV blocks: a sequence needs a new block every ``kv_block_tokens`` steps, at
steps fixed by when it joined. Members whose next block is due at the same
step form a *cohort* and stay one for as long as they decode (they all gain
the same blocks at the same steps), so growing the group costs O(cohorts due)
instead of O(members due): a cohort counts what it gained (``grown``) and a
member's own allocation is brought up to date when it leaves. Cohorts are due
in step order and members in admission order, as one heap of sequences would
have them; when memory runs short part-way, the members before the one that
did not fit keep their blocks (the caller preempts and retries), exactly as
growing them one by one does.
"""

from __future__ import annotations

import heapq

from longroute.sim.kv_memory import KvMemory
from longroute.sim.sequence import Sequence

_StepHeap = list[tuple[int, int, int, Sequence]]  # (step, order, epoch, seq)


class Cohort:
    """Decoding sequences whose next KV block is due at ``alloc_step``."""

    __slots__ = ("alloc_step", "grown", "members")

    def __init__(self, alloc_step: int) -> None:
        self.alloc_step = alloc_step
        self.grown = 0  # tokens each member gained since the cohort formed
        self.members: dict[Sequence, None] = {}  # admission order


class DecodeGroup:
    __slots__ = ("_cohort_heap", "_cohorts", "_finish_heap", "_order", "context_tokens", "kv",
                 "members", "step")  # fmt: skip

    def __init__(self, kv: KvMemory) -> None:
        self.kv = kv
        self.members: dict[Sequence, None] = {}  # admission order
        self.step = 0  # decode iterations run so far
        self.context_tokens = 0  # sum of computed tokens over members
        self._finish_heap: _StepHeap = []
        self._cohorts: dict[int, Cohort] = {}  # by alloc_step
        self._cohort_heap: list[int] = []  # alloc steps (lazy: stale ones skipped)
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
        computed = seq.num_computed_tokens
        seq.epoch += 1
        seq.base_step = step
        seq.base_computed = computed
        seq.base_generated = seq.num_generated
        seq.finish_step = finish_step = step + seq.num_output_tokens - seq.num_generated
        self.members[seq] = None
        self.context_tokens += computed
        self._order += 1
        heapq.heappush(self._finish_heap, (finish_step, self._order, seq.epoch, seq))
        self._join(seq, step + self.kv.room_tokens(seq) - computed)

    def _join(self, seq: Sequence, alloc_step: int) -> None:
        """``seq`` (the newest member) joins the cohort due at ``alloc_step``."""
        cohort = self._cohorts.get(alloc_step)
        if cohort is None:
            cohort = self._cohorts[alloc_step] = Cohort(alloc_step)
            heapq.heappush(self._cohort_heap, alloc_step)
        cohort.members[seq] = None
        seq.cohort = cohort
        seq.cohort_base = cohort.grown

    def _rejoin(self, seqs: list[Sequence], alloc_step: int) -> None:
        """``seqs`` (allocations up to date, out of any cohort) join the cohort due at
        ``alloc_step``, in admission order (rare: only when cohorts split or meet)."""
        if not seqs:
            return
        for seq in seqs:
            self._join(seq, alloc_step)
        cohort = self._cohorts[alloc_step]
        if len(cohort.members) > len(seqs):
            cohort.members = {s: None for s in self.members if s.cohort is cohort}

    def remove(self, seq: Sequence) -> None:
        """Bring the sequence's counters up to date and take it out of the group."""
        done = self.step - seq.base_step
        seq.num_computed_tokens = seq.base_computed + done
        seq.num_generated = seq.base_generated + done
        del self.members[seq]
        self.context_tokens -= seq.num_computed_tokens
        seq.epoch += 1  # invalidates its finish-heap entry
        self._leave_cohort(seq)

    def _leave_cohort(self, seq: Sequence) -> None:
        """Take ``seq`` out of its cohort, its private allocation brought up to date."""
        cohort = seq.cohort
        assert cohort is not None
        seq.num_private_alloc_tokens += cohort.grown - seq.cohort_base
        seq.cohort = None
        members = cohort.members
        del members[seq]
        if not members and self._cohorts.get(cohort.alloc_step) is cohort:
            del self._cohorts[cohort.alloc_step]  # its heap entry goes stale

    def grow(self, upto_step: int) -> bool:
        """Give each decoding sequence the KV blocks it needs for steps < ``upto_step``.

        Returns False if memory ran out (the caller preempts and retries); the
        members before the one that did not fit keep what they got (module doc).
        """
        heap = self._cohort_heap
        if not heap or heap[0] >= upto_step:
            return True
        cohorts = self._cohorts
        kvb = self.kv.kv_block_tokens
        due: list[tuple[Cohort, int]] = []
        total = 0
        while heap and heap[0] < upto_step:
            alloc_step = heapq.heappop(heap)
            cohort = cohorts.pop(alloc_step, None)
            if cohort is None:
                continue  # stale entry
            need = -(-(upto_step - alloc_step) // kvb) * kvb
            due.append((cohort, need))
            total += need * len(cohort.members)
        kv = self.kv
        # growing one member at a time evicts, in all, the fewest blocks that cover the
        # running total, so one eviction for the total is the same when all fit
        if not kv.ensure_free(total):
            return self._grow_until_full(due)
        kv.num_private_tokens += total
        for cohort, need in due:
            self._move(cohort, cohort.alloc_step + need, need)
        return True

    def _move(self, cohort: Cohort, alloc_step: int, need: int) -> None:
        """Every member of ``cohort`` gained ``need`` tokens; its next block is due at
        ``alloc_step`` (``cohort`` is out of the index)."""
        cohort.grown += need
        cohort.alloc_step = alloc_step
        there = self._cohorts.get(alloc_step)
        if there is None:
            self._cohorts[alloc_step] = cohort
            heapq.heappush(self._cohort_heap, alloc_step)
            return
        seqs = list(cohort.members)  # two cohorts meet (rare): merge into the one there
        for seq in seqs:
            seq.num_private_alloc_tokens += cohort.grown - seq.cohort_base
        self._rejoin(seqs, alloc_step)

    def _grow_until_full(self, due: list[tuple[Cohort, int]]) -> bool:
        """Grow the due members one at a time until one does not fit (returns False).

        The rare path of :meth:`grow`: the same order, the same evictions, and the same
        partial state as growing each member with its own eviction test.
        """
        kv = self.kv
        cohorts = self._cohorts
        free = kv.free_tokens()
        for i, (cohort, need) in enumerate(due):
            members = list(cohort.members)
            for j in range(len(members)):
                if need > free:
                    if not kv.ensure_free(need):
                        self._split(cohort, members[:j], need)
                        for rest, _ in due[i + 1 :]:  # untouched: back in the index
                            cohorts[rest.alloc_step] = rest
                            heapq.heappush(self._cohort_heap, rest.alloc_step)
                        return False
                    free = kv.free_tokens()
                free -= need
                kv.num_private_tokens += need
            self._move(cohort, cohort.alloc_step + need, need)
        raise AssertionError("memory ran out for the total but for no member")

    def _split(self, cohort: Cohort, grown: list[Sequence], need: int) -> None:
        """``grown`` (the first members of ``cohort``) gained ``need`` tokens; the rest did
        not. ``cohort`` keeps the rest and goes back in the index."""
        self._cohorts[cohort.alloc_step] = cohort
        heapq.heappush(self._cohort_heap, cohort.alloc_step)
        for seq in grown:
            self._leave_cohort(seq)
            seq.num_private_alloc_tokens += need
        self._rejoin(grown, cohort.alloc_step + need)

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
