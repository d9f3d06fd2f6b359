"""Context annotations: short instructions that keep answer quality under reuse (§5.3, §6).

* The *order annotation* restores the retriever's relevance ranking after the
  blocks were reordered for prefix sharing; it goes right before the question.
* A *location annotation* replaces a block that was de-duplicated because the
  conversation already showed it in an earlier turn.

Blocks are named by a ``label`` callable (block id -> text); the default is
``[Doc <id>]``. Callers building prompts with their own document markers pass
their own ``label`` so that the annotation names blocks the way the prompt does.
Pure functions; called once per planned request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

ORDER_ANNOTATION_TEMPLATE = (
    "Please read the context in the following priority order: {order} and answer the question."
)
LOCATION_ANNOTATION_TEMPLATE = "Please refer to {label} in the previous conversation."


def default_label(block: int) -> str:
    """``[Doc <block>]``: the label used when no ``label`` callable is given."""
    return f"[Doc {block}]"


def order_annotation(
    original: Sequence[int],
    reordered: Sequence[int],
    label: Callable[[int], str] = default_label,
) -> str | None:
    """The priority-order instruction, or None when ``reordered`` equals ``original``.

    ``original`` is the context in relevance (retrieval) order and ``reordered``
    the order the prompt shows; they must hold the same blocks (a ValueError
    names the difference otherwise). The annotation lists ``original``, e.g.
    ``Please read the context in the following priority order: [Doc 2] > [Doc 1]
    > [Doc 4] and answer the question.`` Cost: O(k) for k blocks.
    """
    if tuple(original) == tuple(reordered):
        return None
    original_set = set(original)
    reordered_set = set(reordered)
    if (
        original_set != reordered_set
        or len(original_set) != len(original)
        or len(reordered_set) != len(reordered)
    ):
        raise ValueError(
            "reordered must be a permutation of original (distinct blocks); "
            f"only in original: {sorted(original_set - reordered_set)}, "
            f"only in reordered: {sorted(reordered_set - original_set)}, "
            f"lengths {len(original)} and {len(reordered)}"
        )
    return ORDER_ANNOTATION_TEMPLATE.format(order=" > ".join(label(b) for b in original))


def location_annotation(block: int, label: Callable[[int], str] = default_label) -> str:
    """The reference that stands in for a de-duplicated ``block``.

    E.g. ``Please refer to [Doc 1] in the previous conversation.``
    """
    return LOCATION_ANNOTATION_TEMPLATE.format(label=label(block))
