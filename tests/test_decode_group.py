"""DecodeGroup grows KV blocks by cohort; it must match growing members one at a time.

The reference below is the per-member algorithm the cohorts replaced (a heap of
``(alloc_step, order)`` entries, one ``ensure_free`` test per member). Random adds,
decode steps, stretches, preemptions and finishes run on both, each with its own
memory, and every observable count must agree after every operation, including
when memory runs out part-way through a grow (the rare path).
"""

from __future__ import annotations

import heapq
import random

import pytest

from longroute.sim.decode_group import DecodeGroup
from longroute.sim.kv_memory import KvMemory
from longroute.sim.sequence import Sequence
from longroute.types import Request

KVB = 16


class _OneAtATime:
    """The per-member reference: members in admission order, a heap of due steps."""

    def __init__(self, kv: KvMemory) -> None:
        self.kv = kv
        self.members: dict[Sequence, None] = {}
        self.step = 0
        self._heap: list[tuple[int, int, Sequence]] = []
        self._order = 0

    def add(self, seq: Sequence) -> None:
        self.members[seq] = None
        self._order += 1
        due = self.step + self.kv.room_tokens(seq) - seq.num_computed_tokens
        heapq.heappush(self._heap, (due, self._order, seq))

    def remove(self, seq: Sequence) -> None:
        del self.members[seq]
        self._heap = [e for e in self._heap if e[2] is not seq]
        heapq.heapify(self._heap)

    def grow(self, upto_step: int) -> bool:
        kv, heap = self.kv, self._heap
        free = kv.free_tokens()
        while heap and heap[0][0] < upto_step:
            due, order, seq = heap[0]
            need = -(-(upto_step - due) // KVB) * KVB
            if need > free:
                if not kv.ensure_free(need):
                    return False
                free = kv.free_tokens()
            free -= need
            kv.grow(seq, need)
            heapq.heapreplace(heap, (due + need, order, seq))
        return True


def _world(capacity: int) -> KvMemory:
    kv = KvMemory(capacity, KVB, KVB)
    hashes = tuple(range(1, 41))  # 40 evictable cache blocks
    kv.cache.insert(hashes, 0, len(hashes))
    kv.cache.release(hashes, len(hashes))
    return kv


def _seq(i: int, computed: int) -> Sequence:
    seq = Sequence(Request(f"r{i}", 0.0, computed, 1000), 0.0)
    seq.num_computed_tokens = computed
    return seq


def _check(kv_a: KvMemory, kv_b: KvMemory) -> None:
    assert kv_a.num_private_tokens == kv_b.num_private_tokens
    assert kv_a.cache.num_blocks == kv_b.cache.num_blocks
    assert kv_a.free_tokens() == kv_b.free_tokens()


@pytest.mark.parametrize("seed", range(12))
def test_cohorts_grow_as_one_member_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice((1200, 2000, 4000))
    kv_a, kv_b = _world(capacity), _world(capacity)
    group, ref = DecodeGroup(kv_a), _OneAtATime(kv_b)
    pairs: dict[Sequence, Sequence] = {}  # group's sequence -> the reference's twin
    num_partial = 0
    for i in range(400):
        op = rng.random()
        if op < 0.3:  # a prefill finished: it joins with its prompt's memory
            computed = rng.randint(1, 200)
            a, b = _seq(i, computed), _seq(i, computed)
            if kv_a.reserve(a, 0):
                assert kv_b.reserve(b, 0)
                group.add(a)
                ref.add(b)
                pairs[a] = b
        elif op < 0.85 and group.members:  # one decode step, or a stretch
            upto = group.step + (1 if op < 0.6 else rng.randint(2, 40))
            while group.members:
                ok = group.grow(upto)
                assert ok == ref.grow(upto)
                _check(kv_a, kv_b)
                if ok:
                    break
                num_partial += 1
                victim = group.newest()  # preempt the newest, as the engine does
                assert pairs[victim] is next(reversed(ref.members))
                _leave(group, ref, kv_a, kv_b, pairs, victim)
            ref.step = upto
            group.advance(upto - group.step)
        elif group.members:  # a finish (or an abort) anywhere in the group
            _leave(group, ref, kv_a, kv_b, pairs, rng.choice(list(group.members)))
        _check(kv_a, kv_b)
    if capacity == 1200:
        assert num_partial > 0, "the rare path was not reached"


def _leave(
    group: DecodeGroup,
    ref: _OneAtATime,
    kv_a: KvMemory,
    kv_b: KvMemory,
    pairs: dict[Sequence, Sequence],
    seq: Sequence,
) -> None:
    twin = pairs.pop(seq)
    group.remove(seq)
    ref.remove(twin)
    assert seq.num_private_alloc_tokens == twin.num_private_alloc_tokens
    kv_a.release(seq)
    kv_b.release(twin)
