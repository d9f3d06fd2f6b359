"""``ContextPilot``: the facade the gateway and the simulator call to plan context reuse.

For each request it (1) reorders the blocks so that they share a prefix with
contexts already in the index (and hence, ideally, in the engine's prefix
cache), (2) replaces blocks its conversation has already seen with references,
and (3) writes the order and location annotations that keep answer quality.

Two modes (paper §7.1):

* offline, ``plan_batch``: the whole batch is known; the index is rebuilt from
  it by hierarchical clustering and an execution order is scheduled
  (Algorithm 5). The new index replaces the previous one.
* online, ``plan``: one request at a time, from a cold (possibly empty) index;
  each request is inserted into the index as it is planned.

The engine's cache evictions are forwarded with ``evict(request_id)``.
Deterministic, no I/O; state is the index and the per-conversation seen blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from longroute.context.annotations import default_label, location_annotation, order_annotation
from longroute.context.dedup import ConversationDedup, Reference
from longroute.context.distance import DEFAULT_ALPHA
from longroute.context.index import ContextIndex
from longroute.context.ordering import schedule


@dataclass(frozen=True, slots=True)
class ContextRequest:
    """A request's retrieved blocks, in relevance order (best first).

    ``conversation_id`` groups the turns of one conversation for
    de-duplication; None means a single-turn request (nothing is de-duplicated).
    A block repeated in ``blocks`` is planned once, at its first occurrence.
    """

    request_id: str
    blocks: tuple[int, ...]
    conversation_id: str | None = None

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        if self.conversation_id == "":
            raise ValueError(
                f"request {self.request_id!r}: conversation_id must be None or non-empty"
            )


@dataclass(frozen=True, slots=True)
class ContextPlan:
    """What to send for one request.

    ``items``: the prompt's context in final order, a ``Reference`` in place of
    each de-duplicated block (render it with ``location_annotation``);
    ``blocks``: the blocks sent in full (``items`` without the references);
    ``removed``: the de-duplicated blocks, in order; ``location_annotations``:
    one per removed block, same order; ``order_annotation``: the relevance-order
    instruction to put before the question, None when the order is unchanged;
    ``path``: the request's search path in the index (() when not indexed).
    """

    request_id: str
    blocks: tuple[int, ...]
    removed: tuple[int, ...]
    order_annotation: str | None
    location_annotations: tuple[str, ...]
    path: tuple[int, ...]
    items: tuple[int | Reference, ...]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """An offline batch: ``plans`` in input order, ``order`` the execution order.

    ``order`` is a permutation of ``range(len(plans))``: run ``plans[order[0]]`` first.
    """

    order: tuple[int, ...]
    plans: tuple[ContextPlan, ...]

    def scheduled_plans(self) -> tuple[ContextPlan, ...]:
        """The plans in execution order."""
        plans = self.plans
        return tuple(plans[i] for i in self.order)


class ContextPilot:
    """Plans context reuse for requests; one instance per engine prefix cache.

    ``is_reordering``: reorder blocks via the index (off: blocks keep their
    order, nothing is indexed, paths are () and ``plan_batch`` keeps input
    order). ``is_dedup``: de-duplicate blocks within conversations.
    ``max_conversations``: bound on tracked conversations (LRU).
    ``label``: names a block in annotations (default ``[Doc <id>]``).

    Cost per ``plan``: one index insert (O(k * h) for k blocks and index height
    h) plus O(k) for de-duplication and annotations.
    """

    __slots__ = ("_dedup", "_index", "alpha", "is_dedup", "is_reordering", "label")

    def __init__(
        self,
        *,
        alpha: float = DEFAULT_ALPHA,
        is_reordering: bool = True,
        is_dedup: bool = True,
        max_conversations: int = 100_000,
        label: Callable[[int], str] = default_label,
    ) -> None:
        self.alpha = alpha
        self.is_reordering = is_reordering
        self.is_dedup = is_dedup
        self.label = label
        self._index = ContextIndex(alpha=alpha)
        self._dedup = ConversationDedup(max_conversations=max_conversations)

    @property
    def index(self) -> ContextIndex:
        """The current context index (read it; change it only through this facade)."""
        return self._index

    def plan(self, request: ContextRequest) -> ContextPlan:
        """Online mode: plan one request and insert it into the index.

        Called when the request is about to be sent to the engine. A request id
        already in the index raises ValueError (nothing is changed then). A
        request without blocks is planned as is and not indexed.
        """
        original = tuple(dict.fromkeys(request.blocks))
        if self.is_reordering and original:
            inserted = self._index.insert(request.request_id, original)
            return self._finish(request, original, inserted.context, inserted.path)
        return self._finish(request, original, original, ())

    def plan_batch(self, requests: Sequence[ContextRequest]) -> BatchPlan:
        """Offline mode: rebuild the index from ``requests`` and schedule them.

        Called once per batch, before any of it is sent. Request ids must be
        distinct, and a conversation may appear at most once per batch (its
        turns depend on each other's answers: plan them one by one with
        ``plan``); otherwise ValueError, with nothing changed. Returns the plans
        in input order and the execution order (Algorithm 5).
        """
        _check_batch(requests)
        originals = [tuple(dict.fromkeys(r.blocks)) for r in requests]
        contexts: list[tuple[int, ...]] = list(originals)
        paths: list[tuple[int, ...]] = [() for _ in requests]
        if self.is_reordering:
            indexed = [i for i, blocks in enumerate(originals) if blocks]
            index, results = ContextIndex.build(
                [originals[i] for i in indexed],
                [requests[i].request_id for i in indexed],
                alpha=self.alpha,
            )
            for i, result in zip(indexed, results, strict=True):
                contexts[i] = result.context
                paths[i] = result.path
            self._index = index
        order = schedule(paths)
        plans = tuple(
            self._finish(r, originals[i], contexts[i], paths[i]) for i, r in enumerate(requests)
        )
        return BatchPlan(order=tuple(order), plans=plans)

    def evict(self, request_id: str) -> bool:
        """Forward an engine eviction of ``request_id``'s cache; False if not indexed."""
        return self._index.evict(request_id)

    def forget_conversation(self, conversation_id: str) -> bool:
        """Drop a finished conversation's seen blocks; False if it was not tracked."""
        return self._dedup.forget(conversation_id)

    def _finish(
        self,
        request: ContextRequest,
        original: tuple[int, ...],
        context: tuple[int, ...],
        path: tuple[int, ...],
    ) -> ContextPlan:
        label = self.label
        annotation = order_annotation(original, context, label) if context != original else None
        conversation_id = request.conversation_id
        if not self.is_dedup or conversation_id is None:
            return ContextPlan(request.request_id, context, (), annotation, (), path, context)
        deduped = self._dedup.dedup(conversation_id, context)
        locations = tuple(location_annotation(b, label) for b in deduped.removed)
        return ContextPlan(
            request.request_id,
            deduped.kept,
            deduped.removed,
            annotation,
            locations,
            path,
            deduped.items,
        )


def _check_batch(requests: Sequence[ContextRequest]) -> None:
    """Raise ValueError naming a repeated request id or conversation id."""
    request_ids: set[str] = set()
    conversation_ids: set[str] = set()
    for r in requests:
        if r.request_id in request_ids:
            raise ValueError(f"request id {r.request_id!r} appears twice in the batch")
        request_ids.add(r.request_id)
        cid = r.conversation_id
        if cid is not None:
            if cid in conversation_ids:
                raise ValueError(
                    f"conversation {cid!r} appears twice in the batch; plan its turns "
                    "one by one with ContextPilot.plan"
                )
            conversation_ids.add(cid)
