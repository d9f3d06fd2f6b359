"""The engine's side of Medha's parallelism (:mod:`longroute.estimators.parallel`).

**SPP.** An iteration is a pipeline round. When a prefill's last round ends, its
first token still has to leave the last stage: the engine reports it
``predictor.first_token_delay_s(round)`` later, without holding the next round
(other work goes on), and parks the sequence in ``engine.draining`` until then;
it joins the decoding group at the first iteration that starts at or after its
first token (:func:`start_decoding_drained`), so its later tokens follow its first
at the round rate. An engine with nothing else to do wakes at that time. No decode
stretch starts while a sequence drains. A prefill recomputed after a preemption
does not drain again (its first token was long reported).

**KVP.** Each sequence's KV is sharded over the KVP groups its context has reached
(:meth:`~longroute.estimators.parallel.ParallelPredictor.kvp_groups`), so an
iteration's attention work is not a function of summed contexts:
:func:`kvp_plan_time_s` adds up each sequence's pairs and context divided by its
group count, and the partial outputs to merge, and asks the predictor for the
round's time. O(prefills + decodes) per iteration, so an engine with
``kvp_degree > 1`` steps every iteration instead of skipping decode stretches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute.estimators.parallel import ParallelPredictor
from longroute.estimators.runtime import RuntimePredictor
from longroute.sim.decode_group import DecodeGroup
from longroute.sim.sequence import Sequence

if TYPE_CHECKING:
    from longroute.sim.engine import EngineModel


def kvp_plan_time_s(
    predictor: RuntimePredictor, plan: list[tuple[Sequence, int]], decoding: DecodeGroup
) -> float:
    """Seconds for one iteration of ``plan``'s prefill chunks plus one token for every
    member of ``decoding``, each sequence's attention split over its KVP groups."""
    if not isinstance(predictor, ParallelPredictor):
        raise TypeError(f"KVP round times need a ParallelPredictor, got {type(predictor)}")
    groups = predictor.kvp_groups
    num_prefill, pairs, prefill_ctx, merged = 0, 0.0, 0.0, 0
    for seq, n in plan:
        c = seq.num_computed_tokens
        g = groups(c + n)
        num_prefill += n
        pairs += (n * c + n * (n + 1) / 2) / g
        prefill_ctx += c / g
        merged += n * (g - 1)
    step = decoding.step
    decode_ctx = 0.0
    for seq in decoding.members:
        c = seq.base_computed + step - seq.base_step
        g = groups(c + 1)
        decode_ctx += c / g
        merged += g - 1
    return predictor.sharded_iteration_time_s(
        num_prefill, pairs, prefill_ctx, len(decoding), decode_ctx, float(merged)
    )


def start_decoding_drained(engine: EngineModel, now_s: float) -> None:
    """Move the sequences whose first token has left the pipeline by ``now_s`` from
    ``engine.draining`` into its decoding group (in the order they drained)."""
    still: list[Sequence] = []
    for seq in engine.draining:
        first_s = seq.first_token_s
        if first_s is None or first_s <= now_s:
            engine.decoding.add(seq)
        else:
            still.append(seq)
    engine.draining = still


def next_drained_s(engine: EngineModel) -> float:
    """When the first sequence of ``engine.draining`` (non-empty) may decode."""
    return min(s.first_token_s or 0.0 for s in engine.draining)
