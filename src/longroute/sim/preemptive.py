"""Chunk-level preemption (Medha): every iteration, prefills go in the queue policy's order.

With a slack policy (EDF, LRS, LARS: ``queue.is_preemptive``) the engine does not
keep serving the prefills it admitted first. Each iteration:

1. Decodes come first (Medha's Algorithm 1): every decoding sequence gets its
   token, as in vLLM; a decode that cannot grow evicts a victim (below).
2. The prefills in progress and the waiting queue are merged in priority order
   (lower ``queue.priority`` first, re-evaluated at ``now_s``): the waiting head is
   admitted ahead of a prefill in progress when it is more urgent and a seat is
   free. So a short request that arrives behind a 500K-token prefill gets its
   chunk in the next iteration.
3. Each prefill asks the packer for a chunk (with its relative slack, for the
   time-budget packer's yield; only when another prefill is running or waiting,
   since budget yielded to nobody is lost: a refinement of Medha's Algorithm 2,
   where a lone 120K-token prefill yielding 40% of a 20 ms budget ran 1.8x
   slower). A prefill that gets none is *skipped* this
   iteration, not a stop: a later, smaller one may still fit (the time-budget
   packer takes at most one long prefill per batch). A skipped prefill is paused
   with its KV cache resident; it resumes where it stopped.
4. When KV memory runs short for a chunk, the victim is the least urgent prefill
   not yet planned this iteration (the highest ``priority``), and only if it is
   less urgent than the one asking; without such a prefill, the newest decode
   (vLLM's rule). A victim's KV is freed and it is recomputed later; a prefill
   that finds no victim is skipped.

Admission stops at the first waiting request that cannot start (no KV memory or
no budget), as in vLLM, with one exception: a waiting *long* prefill that the
packer refuses only because the batch already has one (``is_refused_kind``) is
passed over for this iteration, so the short requests behind it in LARS order
still fill the budget the running long one yields (Medha's Algorithm 1 requeues a
refused prefill and goes on with the next). Without it, LARS, which ranks waiting
long requests (relative slack ~1) ahead of new short ones (~20), would hold every
short request until its slack fell below theirs: measured on the ``medha``
scenario, short TTFT p50 ~1.05 s (their deadline) instead of tens of ms. No
admission follows a preemption in the same iteration.
Cost: O(P log P + W_peeked) per iteration for P prefills in progress, plus the
policy's own ``peek``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute.sim.sequence import Sequence

if TYPE_CHECKING:
    from longroute.sim.engine import EngineModel

Plan = list[tuple[Sequence, int]]


def schedule_preemptive(engine: EngineModel, now_s: float) -> tuple[Plan, bool]:
    """The iteration's prefill chunks in policy order, and whether anything was evicted."""
    queue, packer, decoding = engine.queue, engine.packer, engine.decoding
    priority, slack_of = queue.priority, queue.relative_slack
    is_preempted = False
    while decoding and not decoding.grow(decoding.step + 1):
        _evict(engine, _victim(engine, 0, None, now_s))
        is_preempted = True
    if decoding:
        packer.grant_decodes(len(decoding), decoding.context_tokens)
    running = sorted(engine.prefilling, key=lambda s: priority(s, now_s))
    engine.prefilling = running  # the engine's own list from here on, in policy order
    plan: Plan = []
    can_admit = not is_preempted
    is_refused_kind = getattr(packer, "is_refused_kind", None)
    deferred: list[Sequence] = []  # waiting longs passed over this iteration
    i = 0
    while True:
        seq = running[i] if i < len(running) else None
        head = None
        if can_admit and engine.num_running < engine.max_num_seqs:
            head = queue.peek(now_s)
        if head is not None and (seq is None or priority(head, now_s) < priority(seq, now_s)):
            n = engine._admit(head, slack_of(head, now_s))
            if n == 0:
                if is_refused_kind is not None and is_refused_kind(head):
                    # a second long prefill: skip it, shorter ones behind it may fit
                    queue.remove(head)
                    deferred.append(head)
                else:
                    can_admit = False
                continue
            queue.pop(now_s)
            running.insert(i, head)
            plan.append((head, n))
            i += 1
            continue
        if seq is None:
            break
        wanted = seq.target_tokens - seq.num_computed_tokens
        # yield budget by slack only when another prefill could use it (see module doc)
        is_shared = len(running) > 1 or len(queue) > 0 or bool(deferred)
        rho = slack_of(seq, now_s) if is_shared else None
        n = packer.grant(seq, wanted, relative_slack=rho)
        if n:
            is_ok, evicted = _reserve(engine, seq, n, i, now_s)
            is_preempted = is_preempted or evicted
            if is_ok:
                plan.append((seq, n))
            can_admit = can_admit and not evicted
        i += 1
    for item in deferred:  # back in the queue, keyed as before (no progress was made)
        queue.push(item, now_s)
    return plan, is_preempted


def _reserve(engine: EngineModel, seq: Sequence, n: int, i: int, now_s: float) -> tuple[bool, bool]:
    """KV memory for ``n`` more tokens of ``engine.prefilling[i]``, evicting less urgent
    work as needed. Returns (reserved, anything evicted)."""
    evicted = False
    while not engine.kv.reserve(seq, n):
        victim = _victim(engine, i + 1, seq, now_s)
        if victim is None:
            return False, evicted
        _evict(engine, victim)
        evicted = True
    return True, evicted


def _victim(
    engine: EngineModel, start: int, asking: Sequence | None, now_s: float
) -> Sequence | None:
    """The least urgent prefill at or after ``start`` in ``engine.prefilling`` (not yet
    planned), if it is less urgent than ``asking``; else the newest decode, if any."""
    priority = engine.queue.priority
    candidates = engine.prefilling[start:]
    if candidates:
        victim = max(candidates, key=lambda s: priority(s, now_s))
        if asking is None or priority(victim, now_s) > priority(asking, now_s):
            return victim
    if engine.decoding:
        return engine.decoding.newest()
    return None


def _evict(engine: EngineModel, victim: Sequence | None) -> None:
    if victim is None:  # only a decode that cannot grow with nothing else running
        raise RuntimeError(f"engine {engine.endpoint.name!r}: KV memory too small for one step")
    engine._preempt(victim)
