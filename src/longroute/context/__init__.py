"""Context reuse (ContextPilot): reorder, schedule and de-duplicate context blocks.

RAG, agent-memory and multi-agent requests carry *context blocks* (retrieved
documents, chunks, memories), named here by integer block ids and listed in
relevance order. Different requests often share blocks in different orders, so
an exact-prefix KV cache misses. This package raises prefix-cache hits without
changing what the model is told:

* **reordering**: blocks a request shares with contexts already in the
  *context index* go first, in the order those contexts use, then the rest in
  relevance order;
* **scheduling** (batches): requests that share prefixes run back to back;
* **de-duplication**: in a multi-turn conversation, blocks an earlier turn
  already showed are replaced by references;
* **annotations**: an *order annotation* restates the original relevance order
  and a *location annotation* stands in for each de-duplicated block.

The small API
-------------
``ContextPilot`` is the facade, one per engine prefix cache:

* ``plan(ContextRequest) -> ContextPlan``: online mode (cold start is fine);
  called for each request as it is sent; inserts it into the index.
* ``plan_batch(Sequence[ContextRequest]) -> BatchPlan``: offline mode; builds
  the index from the whole batch (hierarchical clustering) and returns the
  plans in input order plus ``order``, the execution order.
* ``evict(request_id) -> bool``: forward the engine's cache eviction.
* ``forget_conversation(conversation_id) -> bool``: a conversation ended.

A ``ContextPlan`` gives ``items`` (the context in final order, a ``Reference``
for each de-duplicated block), ``blocks`` (those sent in full), ``removed``,
``order_annotation`` (None when the order is unchanged),
``location_annotations`` (one per removed block) and ``path`` (search path in
the index). Build the prompt as: items (render a ``Reference`` with
``location_annotation``), then the order annotation, then the question.

The parts are usable alone: ``ContextIndex`` (build/search/insert/evict),
``context_distance`` / ``pairwise_distances`` (the paper's distance),
``reorder`` and ``schedule``, ``ConversationDedup``, ``order_annotation`` and
``location_annotation``. Everything is deterministic and does no I/O.

Example
-------
>>> from longroute.context import ContextPilot, ContextRequest
>>> pilot = ContextPilot()
>>> first = pilot.plan(ContextRequest("r1", (2, 1, 3)))
>>> first.blocks, first.order_annotation  # cold start: nothing to share yet
((2, 1, 3), None)
>>> second = pilot.plan(ContextRequest("r2", (4, 1, 2)))
>>> second.blocks  # blocks shared with r1 first, in r1's order
(2, 1, 4)
>>> print(second.order_annotation)  # doctest: +NORMALIZE_WHITESPACE
Please read the context in the following priority order:
[Doc 4] > [Doc 1] > [Doc 2] and answer the question.
>>> pilot.evict("r1")  # the engine dropped r1's cache
True

Multi-turn de-duplication (the second turn's blocks 1 and 2 were shown in turn 1):

>>> chat = ContextPilot()
>>> _ = chat.plan(ContextRequest("t1", (1, 2, 4), conversation_id="c6"))
>>> turn2 = chat.plan(ContextRequest("t2", (1, 5, 2), conversation_id="c6"))
>>> turn2.items
(Reference(block=1), Reference(block=2), 5)
>>> turn2.location_annotations[0]
'Please refer to [Doc 1] in the previous conversation.'

Offline batch (the paper's Figure 5 contexts):

>>> batch = ContextPilot().plan_batch(
...     [ContextRequest("c1", (2, 1, 3)), ContextRequest("c2", (2, 6, 1)),
...      ContextRequest("c3", (4, 1, 0))])
>>> [plan.blocks for plan in batch.plans]
[(1, 2, 3), (1, 2, 6), (1, 4, 0)]
>>> [plan.path for plan in batch.plans]  # c3 hangs off the {1} node first, then {1, 2}
[(0, 1, 0), (0, 1, 1), (0, 0)]
>>> batch.order  # depth-first: each branch of the tree runs as one stretch
(2, 0, 1)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute._lazy import lazy_exports

if TYPE_CHECKING:
    from longroute.context.annotations import default_label, location_annotation, order_annotation
    from longroute.context.dedup import ConversationDedup, DedupResult, Reference
    from longroute.context.distance import DEFAULT_ALPHA, context_distance, pairwise_distances
    from longroute.context.index import ContextIndex, InsertResult, SearchResult
    from longroute.context.ordering import reorder, schedule
    from longroute.context.pilot import BatchPlan, ContextPilot, ContextPlan, ContextRequest

# imported on first use (PEP 562): the index pulls in scipy, which a workload
# that only needs references and annotations should not pay for
_LAZY = {
    "default_label": "longroute.context.annotations",
    "location_annotation": "longroute.context.annotations",
    "order_annotation": "longroute.context.annotations",
    "ConversationDedup": "longroute.context.dedup",
    "DedupResult": "longroute.context.dedup",
    "Reference": "longroute.context.dedup",
    "DEFAULT_ALPHA": "longroute.context.distance",
    "context_distance": "longroute.context.distance",
    "pairwise_distances": "longroute.context.distance",
    "ContextIndex": "longroute.context.index",
    "InsertResult": "longroute.context.index",
    "SearchResult": "longroute.context.index",
    "reorder": "longroute.context.ordering",
    "schedule": "longroute.context.ordering",
    "BatchPlan": "longroute.context.pilot",
    "ContextPilot": "longroute.context.pilot",
    "ContextPlan": "longroute.context.pilot",
    "ContextRequest": "longroute.context.pilot",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "DEFAULT_ALPHA",
    "BatchPlan",
    "ContextIndex",
    "ContextPilot",
    "ContextPlan",
    "ContextRequest",
    "ConversationDedup",
    "DedupResult",
    "InsertResult",
    "Reference",
    "SearchResult",
    "context_distance",
    "default_label",
    "location_annotation",
    "order_annotation",
    "pairwise_distances",
    "reorder",
    "schedule",
]
