"""longroute.context: reordering, scheduling, de-duplication, annotations and the pilot facade."""

from __future__ import annotations

import doctest
import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

import longroute.context
from longroute.context import (
    BatchPlan,
    ContextIndex,
    ContextPilot,
    ContextPlan,
    ContextRequest,
)
from longroute.context.annotations import (
    default_label,
    location_annotation,
    order_annotation,
)
from longroute.context.dedup import ConversationDedup, DedupResult, Reference
from longroute.context.ordering import reorder, schedule

blocks_st = st.lists(st.integers(min_value=0, max_value=30), max_size=20)
distinct_blocks_st = st.lists(st.integers(min_value=0, max_value=30), max_size=20, unique=True)
paths_st = st.lists(st.lists(st.integers(min_value=0, max_value=3), max_size=5), max_size=40)


# ---------------------------------------------------------------- reorder


def test_reorder_paper_example() -> None:
    # Figure 6: C6 {2, 1, 4} matches C4 with prefix {1, 2} -> {1, 2, 4}.
    assert reorder([2, 1, 4], [1, 2]) == (1, 2, 4)
    # C8 {1, 2, 9} -> {1, 2, 9}; C7 {5, 7, 8} matches nothing and stays.
    assert reorder([1, 2, 9], [1, 2]) == (1, 2, 9)
    assert reorder([5, 7, 8], []) == (5, 7, 8)


def test_reorder_skips_prefix_blocks_not_in_context() -> None:
    assert reorder([4, 3, 2, 1], [9, 2, 8, 4]) == (2, 4, 3, 1)
    assert reorder([4, 3], [9, 8]) == (4, 3)


def test_reorder_drops_repeats_keeping_first_occurrence() -> None:
    assert reorder([3, 1, 3, 2, 1], [2]) == (2, 3, 1)
    assert reorder([3, 3], []) == (3,)


@given(blocks_st, blocks_st)
def test_reorder_is_permutation_prefix_first_then_original_order(
    context: list[int], prefix: list[int]
) -> None:
    out = reorder(context, prefix)
    distinct = list(dict.fromkeys(context))
    assert sorted(out) == sorted(distinct)  # a permutation of the (de-duplicated) input
    shared = [b for b in dict.fromkeys(prefix) if b in set(context)]
    assert list(out[: len(shared)]) == shared  # prefix blocks first, in prefix order
    rest = [b for b in distinct if b not in set(shared)]
    assert list(out[len(shared) :]) == rest  # the rest in original order


# ---------------------------------------------------------------- schedule


def test_schedule_paper_figure_7() -> None:
    # C6 [0,0,2], C3 [0,1], C7 [1], C8 [0,0,3]  ->  C6, C8, C3, C7
    assert schedule([(0, 0, 2), (0, 1), (1,), (0, 0, 3)]) == [0, 3, 1, 2]


def test_schedule_larger_groups_first_and_ties_stable() -> None:
    paths = [(2, 1), (1,), (2,), (1, 5, 5), (3,), (1, 4)]
    # groups: 2 -> [0, 2]; 1 -> [1, 3, 5]; 3 -> [4]; depth-first inside a group
    assert schedule(paths) == [5, 3, 1, 0, 2, 4]
    # equal-size groups keep the order of first appearance
    assert schedule([(4,), (7,), (4, 1), (7, 1)]) == [2, 0, 3, 1]


def test_schedule_empty_paths_form_one_group() -> None:
    assert schedule([(), (5,), (), ()]) == [0, 2, 3, 1]
    assert schedule([]) == []
    assert schedule([(), ()]) == [0, 1]


def _check_schedule(paths: Sequence[Sequence[int]], order: list[int]) -> None:
    """The properties that determine the schedule uniquely (Algorithm 5, depth-first groups)."""
    assert sorted(order) == list(range(len(paths)))  # every request exactly once

    def key(i: int) -> int | None:
        return paths[i][0] if paths[i] else None

    size: dict[int | None, int] = {}
    first: dict[int | None, int] = {}
    for i in range(len(paths)):
        size[key(i)] = size.get(key(i), 0) + 1
        first.setdefault(key(i), i)
    runs: list[int | None] = []
    for i in order:
        if not runs or runs[-1] != key(i):
            runs.append(key(i))
    assert len(runs) == len(size)  # each group is contiguous
    assert runs == sorted(runs, key=lambda g: (-size[g], first[g]))  # larger groups first
    position = {i: n for n, i in enumerate(order)}
    for a, b in itertools.pairwise(order):
        if key(a) == key(b):  # within a group: depth-first, ties by input order
            pa, pb = tuple(paths[a]), tuple(paths[b])
            if pa == pb:
                assert a < b
            elif pb[: len(pa)] != pa:  # b does not extend a: a sorts first step by step
                assert pa[: len(pb)] == pb or pa < pb
    for i in range(len(paths)):
        for j in range(len(paths)):
            pi, pj = tuple(paths[i]), tuple(paths[j])
            extends = len(pj) > len(pi) > 0 and pj[: len(pi)] == pi
            if extends:  # j extends i (same group): the longer match runs first
                assert position[j] < position[i]


@given(paths_st)
def test_schedule_follows_algorithm_5(paths: list[list[int]]) -> None:
    _check_schedule(paths, schedule(paths))


# ---------------------------------------------------------------- dedup


def test_dedup_first_turn_keeps_everything() -> None:
    d = ConversationDedup()
    r = d.dedup("c1", [1, 2, 4])
    assert r == DedupResult(kept=(1, 2, 4), removed=(), items=(1, 2, 4))
    assert d.seen_blocks("c1") == {1, 2, 4}


def test_dedup_paper_example_second_turn() -> None:
    # §6: turn 1 {1, 2, 4}; turn 2 {1, 5, 2} -> only 5 is new.
    d = ConversationDedup()
    d.dedup("c6", [1, 2, 4])
    r = d.dedup("c6", [1, 5, 2])
    assert r.kept == (5,)
    assert r.removed == (1, 2)
    assert r.items == (Reference(1), 5, Reference(2))
    assert d.seen_blocks("c6") == {1, 2, 4, 5}
    # turn 3: 5 is now seen too
    assert d.dedup("c6", [5, 7]).items == (Reference(5), 7)


@given(st.lists(blocks_st, min_size=1, max_size=6))
def test_dedup_keeps_only_unseen_blocks(turns: list[list[int]]) -> None:
    d = ConversationDedup()
    seen: set[int] = set()
    for turn in turns:
        r = d.dedup("c", turn)
        distinct = list(dict.fromkeys(turn))
        assert r.kept == tuple(b for b in distinct if b not in seen)
        assert r.removed == tuple(b for b in distinct if b in seen)
        assert len(r.items) == len(distinct)
        assert [x.block if isinstance(x, Reference) else x for x in r.items] == distinct
        assert tuple(x for x in r.items if not isinstance(x, Reference)) == r.kept
        assert tuple(x.block for x in r.items if isinstance(x, Reference)) == r.removed
        seen.update(turn)
        assert d.seen_blocks("c") == seen


def test_dedup_conversations_are_independent() -> None:
    d = ConversationDedup()
    d.dedup("a", [1, 2])
    r = d.dedup("b", [2, 3])
    assert r.removed == ()
    assert d.dedup("a", [2, 3]).removed == (2,)
    assert d.seen_blocks("b") == {2, 3}
    assert d.seen_blocks("unknown") == frozenset()


def test_dedup_lru_bound_forgets_least_recently_used() -> None:
    d = ConversationDedup(max_conversations=2)
    d.dedup("a", [1])
    d.dedup("b", [2])
    d.dedup("a", [3])  # touches "a": "b" is now least recently used
    d.dedup("c", [4])
    assert len(d) == 2
    assert "b" not in d
    assert "a" in d and "c" in d
    assert d.dedup("b", [2]).removed == ()  # forgotten: starts afresh
    assert "a" not in d  # "a" was least recently used when "b" came back


def test_dedup_forget_and_bad_bound() -> None:
    d = ConversationDedup()
    d.dedup("a", [1])
    assert d.forget("a") is True
    assert d.forget("a") is False
    assert d.dedup("a", [1]).removed == ()
    with pytest.raises(ValueError, match="max_conversations"):
        ConversationDedup(max_conversations=0)


# ---------------------------------------------------------------- annotations


def test_order_annotation_none_when_unchanged() -> None:
    assert order_annotation([2, 1, 4], (2, 1, 4)) is None
    assert order_annotation([], []) is None


def test_order_annotation_lists_original_relevance_order() -> None:
    text = order_annotation([2, 1, 4], [1, 2, 4])
    assert text == (
        "Please read the context in the following priority order: "
        "[Doc 2] > [Doc 1] > [Doc 4] and answer the question."
    )
    custom = order_annotation([7, 3], [3, 7], label=lambda b: f"<d{b}>")
    assert custom is not None and "<d7> > <d3>" in custom


def test_order_annotation_rejects_non_permutation() -> None:
    with pytest.raises(ValueError, match="permutation"):
        order_annotation([1, 2, 3], [1, 2, 4])
    with pytest.raises(ValueError, match="permutation"):
        order_annotation([1, 2, 2], [2, 1, 2])


def test_location_annotation() -> None:
    assert location_annotation(1) == "Please refer to [Doc 1] in the previous conversation."
    assert location_annotation(5, label=lambda b: f"(#{b})") == (
        "Please refer to (#5) in the previous conversation."
    )
    assert default_label(12) == "[Doc 12]"


# ---------------------------------------------------------------- pilot: online


def test_plan_cold_start_then_shared_prefix_in_first_order() -> None:
    pilot = ContextPilot()
    first = pilot.plan(ContextRequest("r1", (2, 1, 3)))
    assert first == ContextPlan(
        request_id="r1",
        blocks=(2, 1, 3),
        removed=(),
        order_annotation=None,
        location_annotations=(),
        path=(0,),
        items=(2, 1, 3),
    )
    assert "r1" in pilot.index
    second = pilot.plan(ContextRequest("r2", (4, 1, 2)))
    assert second.blocks == (2, 1, 4)  # shared blocks first, in r1's order
    assert second.order_annotation == order_annotation((4, 1, 2), (2, 1, 4))
    assert second.path == pilot.index.path_of("r2")
    assert pilot.index.context_of("r2") == (2, 1, 4)
    # siblings under the node holding the shared prefix
    assert pilot.index.path_of("r1")[:-1] == pilot.index.path_of("r2")[:-1]
    third = pilot.plan(ContextRequest("r3", (7, 8)))  # shares nothing: unchanged
    assert third.blocks == (7, 8) and third.order_annotation is None
    pilot.index.check_tree()


def test_plan_paper_figure_6_after_batch() -> None:
    pilot = ContextPilot()
    pilot.plan_batch(
        [
            ContextRequest("c1", (2, 1, 3)),
            ContextRequest("c2", (2, 6, 1)),
            ContextRequest("c3", (4, 1, 0)),
        ]
    )
    assert pilot.plan(ContextRequest("c6", (2, 1, 4))).blocks == (1, 2, 4)
    assert pilot.plan(ContextRequest("c7", (5, 7, 8))).blocks == (5, 7, 8)
    assert pilot.plan(ContextRequest("c8", (1, 2, 9))).blocks == (1, 2, 9)
    assert len(pilot.index) == 6
    pilot.index.check_tree()


def test_plan_dedups_within_conversation_with_annotations() -> None:
    pilot = ContextPilot()
    t1 = pilot.plan(ContextRequest("t1", (1, 2, 4), conversation_id="c"))
    assert t1.removed == () and t1.blocks == (1, 2, 4)
    other = pilot.plan(ContextRequest("o1", (1, 2), conversation_id="other"))
    assert other.removed == ()  # another conversation: nothing removed
    t2 = pilot.plan(ContextRequest("t2", (1, 5, 2), conversation_id="c"))
    assert t2.items == (Reference(1), Reference(2), 5)
    assert t2.blocks == (5,)
    assert t2.removed == (1, 2)
    assert t2.location_annotations == (location_annotation(1), location_annotation(2))
    # the order annotation restates the full relevance order, removed blocks included
    assert t2.order_annotation == order_annotation((1, 5, 2), (1, 2, 5))
    assert pilot.index.context_of("t2") == (1, 2, 5)  # the index keeps the full context
    assert pilot.forget_conversation("c") is True
    assert pilot.forget_conversation("c") is False
    assert pilot.plan(ContextRequest("t3", (1, 2), conversation_id="c")).removed == ()


def test_plan_without_dedup_or_reordering() -> None:
    no_dedup = ContextPilot(is_dedup=False)
    no_dedup.plan(ContextRequest("a", (1, 2), conversation_id="c"))
    plan = no_dedup.plan(ContextRequest("b", (2, 1, 3), conversation_id="c"))
    assert plan.removed == () and plan.blocks == (1, 2, 3) and plan.location_annotations == ()

    no_reorder = ContextPilot(is_reordering=False)
    no_reorder.plan(ContextRequest("a", (1, 2), conversation_id="c"))
    plan = no_reorder.plan(ContextRequest("b", (3, 2, 1), conversation_id="c"))
    assert plan.items == (3, Reference(2), Reference(1))
    assert plan.order_annotation is None and plan.path == ()
    assert len(no_reorder.index) == 0


def test_plan_custom_label_and_repeated_or_no_blocks() -> None:
    pilot = ContextPilot(label=lambda b: f"<doc-{b}>")
    pilot.plan(ContextRequest("a", (1, 2), conversation_id="c"))
    plan = pilot.plan(ContextRequest("b", (3, 2, 3, 1), conversation_id="c"))
    assert plan.items == (Reference(1), Reference(2), 3)  # repeat of 3 dropped
    assert plan.location_annotations[0] == "Please refer to <doc-1> in the previous conversation."
    assert (
        plan.order_annotation is not None and "<doc-3> > <doc-2> > <doc-1>" in plan.order_annotation
    )
    empty = pilot.plan(ContextRequest("e", ()))
    assert empty.blocks == () and empty.path == () and "e" not in pilot.index


def test_plan_duplicate_request_id_raises_and_changes_nothing() -> None:
    pilot = ContextPilot()
    pilot.plan(ContextRequest("a", (1, 2), conversation_id="c"))
    with pytest.raises(ValueError, match="'a'"):
        pilot.plan(ContextRequest("a", (5, 6), conversation_id="c"))
    # block 5 was not registered for the conversation by the failed call
    assert pilot.plan(ContextRequest("b", (5,), conversation_id="c")).removed == ()


def test_context_request_rejects_empty_ids() -> None:
    with pytest.raises(ValueError, match="request_id"):
        ContextRequest("", (1,))
    with pytest.raises(ValueError, match="conversation_id"):
        ContextRequest("a", (1,), conversation_id="")


def test_evict_forwards_to_index() -> None:
    pilot = ContextPilot()
    pilot.plan(ContextRequest("a", (1, 2, 3)))
    assert pilot.evict("a") is True
    assert "a" not in pilot.index and len(pilot.index) == 0
    assert pilot.evict("a") is False
    assert pilot.evict("never") is False
    # with "a" gone there is nothing to align to: the next context keeps its order
    assert pilot.plan(ContextRequest("b", (3, 2, 1))).blocks == (3, 2, 1)
    pilot.index.check_tree()


# ---------------------------------------------------------------- pilot: offline


def _random_requests(rng: random.Random, n: int, num_docs: int) -> list[ContextRequest]:
    return [
        ContextRequest(f"r{i}", tuple(rng.sample(range(num_docs), rng.randint(0, 8))))
        for i in range(n)
    ]


def test_plan_batch_paper_figure_5() -> None:
    pilot = ContextPilot()
    batch = pilot.plan_batch(
        [
            ContextRequest("c1", (2, 1, 3)),
            ContextRequest("c2", (2, 6, 1)),
            ContextRequest("c3", (4, 1, 0)),
        ]
    )
    assert [p.request_id for p in batch.plans] == ["c1", "c2", "c3"]
    assert [p.blocks for p in batch.plans] == [(1, 2, 3), (1, 2, 6), (1, 4, 0)]
    assert batch.order == (2, 0, 1)  # c3's branch, then the {1, 2} branch
    assert batch.plans[0].order_annotation == order_annotation((2, 1, 3), (1, 2, 3))
    assert batch.scheduled_plans() == (batch.plans[2], batch.plans[0], batch.plans[1])


@pytest.mark.parametrize("seed", range(5))
def test_plan_batch_input_order_permutations_and_valid_schedule(seed: int) -> None:
    rng = random.Random(seed)
    requests = _random_requests(rng, 60, 25)
    pilot = ContextPilot()
    batch = pilot.plan_batch(requests)
    assert isinstance(batch, BatchPlan)
    assert [p.request_id for p in batch.plans] == [r.request_id for r in requests]
    for request, plan in zip(requests, batch.plans, strict=True):
        assert sorted(plan.blocks) == sorted(request.blocks)
        if plan.blocks == request.blocks:
            assert plan.order_annotation is None
        else:
            assert plan.order_annotation == order_annotation(request.blocks, plan.blocks)
        if request.blocks:
            assert plan.path == pilot.index.path_of(request.request_id)
    _check_schedule([p.path for p in batch.plans], list(batch.order))
    assert [batch.plans[i] for i in batch.order] == list(batch.scheduled_plans())
    assert len(pilot.index) == sum(1 for r in requests if r.blocks)
    pilot.index.check_tree()


def test_plan_batch_replaces_index_and_without_reordering_keeps_input_order() -> None:
    pilot = ContextPilot()
    pilot.plan(ContextRequest("old", (1, 2)))
    pilot.plan_batch([ContextRequest("x", (3, 4)), ContextRequest("y", (4, 3))])
    assert "old" not in pilot.index and len(pilot.index) == 2
    plain = ContextPilot(is_reordering=False)
    requests = _random_requests(random.Random(9), 20, 10)
    batch = plain.plan_batch(requests)
    assert batch.order == tuple(range(20))
    assert [p.blocks for p in batch.plans] == [r.blocks for r in requests]


def test_plan_batch_dedups_conversations_and_rejects_repeats() -> None:
    pilot = ContextPilot()
    pilot.plan(ContextRequest("t1", (1, 2), conversation_id="c"))
    batch = pilot.plan_batch(
        [ContextRequest("t2", (2, 3), conversation_id="c"), ContextRequest("u1", (2, 3))]
    )
    assert batch.plans[0].removed == (2,) and batch.plans[1].removed == ()
    before = pilot.index
    with pytest.raises(ValueError, match="conversation 'd'"):
        pilot.plan_batch(
            [
                ContextRequest("a", (1,), conversation_id="d"),
                ContextRequest("b", (2,), conversation_id="d"),
            ]
        )
    with pytest.raises(ValueError, match="request id 'a'"):
        pilot.plan_batch([ContextRequest("a", (1,)), ContextRequest("a", (2,))])
    assert pilot.index is before
    assert pilot.plan(ContextRequest("d1", (1,), conversation_id="d")).removed == ()


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(longroute.context, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10
    assert result.failed == 0


def test_public_api_exports() -> None:
    for name in longroute.context.__all__:
        assert hasattr(longroute.context, name), name
    assert longroute.context.ContextIndex is ContextIndex
