"""Context distance, clustering and the context index (ContextPilot §4, Algorithms 1 and 4)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longroute.context import distance as distance_mod
from longroute.context.clustering import cluster_contexts
from longroute.context.distance import DEFAULT_ALPHA, context_distance, pairwise_distances
from longroute.context.index import ContextIndex

A = 0.001

# Figure 5 of the paper
C1, C2, C3 = (2, 1, 3), (2, 6, 1), (4, 1, 0)
C6, C7, C8 = (2, 1, 4), (5, 7, 8), (1, 2, 9)


def _dedup(context: Sequence[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(context))


def _is_permutation(stored: Sequence[int], original: Sequence[int]) -> bool:
    want = _dedup(original)
    return len(stored) == len(want) and set(stored) == set(want)


def _zipf_contexts(n: int, k: int, num_docs: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_docs + 1)
    weights /= weights.sum()
    return [
        [int(b) for b in rng.choice(num_docs, size=k, replace=False, p=weights)] for _ in range(n)
    ]


# ------------------------------------------------------------------ distance


def test_distance_paper_example_prefers_aligned_positions() -> None:
    a, b, c, d = (3, 5, 1, 7), (2, 6, 3, 5), (3, 5, 8, 9), (2, 6, 4, 0)
    # B-D share {2, 6} at the same positions; A-B and B-C share {3, 5} two places apart
    assert context_distance(b, d) == 0.5
    assert context_distance(a, b) == pytest.approx(0.5 + A * (2 + 2) / 2, abs=1e-15)
    assert context_distance(b, c) == pytest.approx(0.502, abs=1e-15)
    assert context_distance(b, d) < context_distance(a, b)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((1, 2, 3), (4, 5), 1.0),  # nothing shared
        ((), (1,), 1.0),
        ((), (), 1.0),
        ((1, 2, 3), (1, 2, 3), 0.0),
        ((1, 2), (2, 1), A * (1 + 1) / 2),
        ((1, 2, 3), (1,), 1.0 - 1 / 3),
        ((7, 1, 2, 3), (1, 9), 1.0 - 1 / 4 + A * 1 / 1),
        ((2, 1, 3), (2, 6, 1), 1.0 - 2 / 3 + A * (0 + 1) / 2),  # Fig. 5: C1-C2
        ((2, 1, 3), (4, 1, 0), 1.0 - 1 / 3),  # C1-C3: {1} at the same position
        ((2, 6, 1), (4, 1, 0), 1.0 - 1 / 3 + A),  # C2-C3
    ],
)
def test_distance_hand_computed(a: tuple[int, ...], b: tuple[int, ...], expected: float) -> None:
    assert context_distance(a, b) == pytest.approx(expected, abs=1e-15)
    assert context_distance(b, a) == context_distance(a, b)


def test_distance_counts_a_repeated_block_once_and_scales_with_alpha() -> None:
    assert context_distance((1, 1, 2), (2, 1)) == context_distance((1, 2), (2, 1))
    assert context_distance((1, 2), (2, 1), alpha=0.01) == pytest.approx(0.01)
    assert context_distance((1, 2), (2, 1), alpha=0.0) == 0.0


@pytest.mark.parametrize("alpha", [-0.001, math.nan, math.inf])
def test_distance_rejects_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        context_distance((1,), (1,), alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        ContextIndex(alpha=alpha)


def _random_contexts(rng: random.Random, n: int, vocab: int, max_len: int) -> list[list[int]]:
    out = []
    for _ in range(n):
        length = rng.randint(0, max_len)
        out.append([rng.randrange(vocab) for _ in range(length)])  # repeats included
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_equals_scalar_bit_for_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distance_mod, "_CHUNK_ROWS", 7)  # several row chunks
    rng = random.Random(seed)
    contexts = _random_contexts(rng, 60, vocab=25, max_len=12)
    alpha = [DEFAULT_ALPHA, 0.01, 0.0][seed]
    got = pairwise_distances(contexts, alpha)
    want = [
        context_distance(contexts[i], contexts[j], alpha)
        for i in range(len(contexts))
        for j in range(i + 1, len(contexts))
    ]
    assert got.shape == (len(want),)
    assert got.tolist() == want


def test_pairwise_small_inputs() -> None:
    assert pairwise_distances([]).shape == (0,)
    assert pairwise_distances([[1, 2]]).shape == (0,)
    assert pairwise_distances([[1, 2], [2, 1], [3]]).tolist() == [A, 1.0, 1.0]


# ---------------------------------------------------------------- clustering


def _leaves_below(num_leaves: int, children: tuple[tuple[int, ...], ...]) -> list[int]:
    found: list[int] = []
    stack = [num_leaves]
    while stack:
        c = stack.pop()
        if c < num_leaves:
            found.append(c)
        else:
            stack.extend(children[c - num_leaves])
    return found


@pytest.mark.parametrize("max_exact", [2, 5, 1000])
def test_cluster_tree_covers_every_context_once(max_exact: int) -> None:
    contexts = _zipf_contexts(120, 6, num_docs=40, seed=3)
    unique = list({frozenset(c): c for c in contexts}.values())
    tree = cluster_contexts(unique, max_exact_contexts=max_exact)
    assert sorted(_leaves_below(tree.num_leaves, tree.children)) == list(range(len(unique)))
    assert all(len(kids) >= 1 for kids in tree.children)


def test_cluster_rejects_unknown_method_and_tiny_groups() -> None:
    with pytest.raises(ValueError, match=r"unknown linkage method 'ward'.*complete"):
        cluster_contexts([[1], [2]], method="ward")
    with pytest.raises(ValueError, match="max_exact_contexts"):
        cluster_contexts([[1], [2]], max_exact_contexts=1)


# -------------------------------------------------------------- index: paper


def test_build_figure5_prefix_aligned() -> None:
    index, results = ContextIndex.build([C1, C2, C3], ["c1", "c2", "c3"])
    index.check_tree()
    by_id = {r.request_id: r for r in results}
    assert [r.request_id for r in results] == ["c1", "c2", "c3"]  # input order
    assert by_id["c1"].context == (1, 2, 3)
    assert by_id["c2"].context == (1, 2, 6)
    assert by_id["c3"].context == (1, 4, 0)
    # C1 and C2 hang under C4 {1, 2}, which with C3 hangs under C5 {1}, under the root
    assert by_id["c1"].path[:-1] == by_id["c2"].path[:-1]
    assert index.docs_at(by_id["c1"].path[:-1]) == (1, 2)
    assert index.docs_at(by_id["c1"].path[:1]) == (1,)
    assert by_id["c3"].path[:-1] == by_id["c1"].path[:1]
    assert index.num_nodes == 6  # root, C5, C4, three leaves
    assert index.height == 3
    for r in results:
        assert index.docs_at(r.path) == r.context == index.context_of(r.request_id)
        assert index.path_of(r.request_id) == r.path


def test_search_and_insert_figure5_and_6() -> None:
    index, results = ContextIndex.build([C1, C2, C3], ["c1", "c2", "c3"])
    c4_path = results[0].path[:-1]
    found = index.search(C6)  # ties C4 {1,2} with C3 {1,4,0} at C5: the shared node wins
    assert found.path == c4_path
    assert found.prefix == (1, 2)
    assert index.docs_at(found.path) == (1, 2)
    assert index.num_nodes == 6  # search is read-only
    inserted = index.insert("c6", C6)
    assert inserted.context == (1, 2, 4)
    assert inserted.path == (*c4_path, 2)  # third child of C4
    unmatched = index.insert("c7", C7)
    assert unmatched.context == C7
    assert len(unmatched.path) == 1
    assert index.search((5, 99)).prefix == (5,)
    assert index.insert("c8", C8).context == (1, 2, 9)
    assert index.search((42, 43)).path == ()
    assert index.search((42, 43)).prefix == ()
    index.check_tree()
    assert len(index) == 6


def test_search_takes_the_child_at_minimum_distance() -> None:
    index, _ = ContextIndex.build([(1, 2, 3, 4), (1, 5, 6)], ["long", "short"])
    assert index.docs_at(index.path_of("long")[:-1]) == (1,)
    # (1,2,3,4): 1 - 2/4 + tiny; (1,5,6): 1 - 2/3: the shorter context is closer
    assert context_distance((1, 5, 2), (1, 5, 6)) < context_distance((1, 5, 2), (1, 2, 3, 4))
    found = index.search((1, 5, 2))
    assert found.path == index.path_of("short") and found.prefix == (1, 5)
    # equal overlap: the positional term decides ((1,2,...) aligned, (1,5,...) off by one)
    index2, _ = ContextIndex.build([(1, 2, 9), (1, 5, 8)], ["a", "b"])
    assert index2.search((1, 2, 5)).path == index2.path_of("a")
    assert index2.search((1, 5, 2)).path == index2.path_of("b")


def test_insert_cold_start_and_leaf_split() -> None:
    index = ContextIndex()
    assert len(index) == 0 and index.num_nodes == 1 and index.height == 0
    assert index.search((1, 2)).path == ()
    first = index.insert("a", (3, 1, 2))
    assert first.path == (0,) and first.context == (3, 1, 2)
    second = index.insert("b", (1, 3, 5))  # best match is leaf a: split off {3, 1}
    assert second.context == (3, 1, 5)
    assert index.path_of("a") == (0, 0)  # the new node took a's position
    assert second.path == (0, 1)
    assert index.docs_at((0,)) == (3, 1)
    index.check_tree()
    # a superset of a stored leaf: new parent holding all of the leaf's blocks
    third = index.insert("c", (2, 3, 1, 8))
    assert third.context == (3, 1, 2, 8)
    assert index.docs_at(third.path[:-1]) == (3, 1, 2)
    index.check_tree()


def test_insert_partial_match_of_internal_node_splits_it() -> None:
    index, _ = ContextIndex.build([(1, 2, 3, 4), (1, 2, 3, 5)], ["x", "y"])
    assert index.docs_at(index.path_of("x")[:-1]) == (1, 2, 3)
    # shares 1 and 3 but not 2: the node (1,2,3) splits at (1,)
    result = index.insert("z", (3, 1, 9))
    assert result.context == (1, 3, 9)
    index.check_tree()
    assert index.docs_at(result.path[:-1]) == (1,)
    assert index.docs_at(index.path_of("x")[:-2]) == (1,)
    assert index.context_of("x") == (1, 2, 3, 4)  # stored contexts never change


def test_identical_block_sets_share_a_leaf() -> None:
    index, results = ContextIndex.build([(1, 2, 3), (3, 2, 1), (1, 2, 3, 3), (4,)])
    assert results[0].path == results[1].path == results[2].path
    assert results[0].context == results[1].context == results[2].context
    assert len(index) == 4 and index.num_nodes == 3  # root + two leaves
    again = index.insert("x", (2, 1, 3))
    assert again.path == results[0].path and again.context == results[0].context
    assert index.evict("0") and index.evict("1") and index.evict("2")
    assert index.path_of("x") == again.path  # still held by "x"
    assert index.evict("x")
    assert index.num_nodes == 2
    index.check_tree()


def test_duplicate_and_unknown_request_ids() -> None:
    index = ContextIndex()
    index.insert("a", (1, 2))
    with pytest.raises(ValueError, match="'a' is already"):
        index.insert("a", (3,))
    assert index.evict("nope") is False
    with pytest.raises(KeyError, match="nope"):
        index.path_of("nope")
    with pytest.raises(ValueError, match="distinct"):
        ContextIndex.build([(1,), (2,)], ["r", "r"])
    with pytest.raises(ValueError, match="2 request ids for 1 contexts"):
        ContextIndex.build([(1,)], ["r", "s"])
    with pytest.raises(IndexError, match="position 5 at depth 0"):
        index.docs_at((5,))
    assert "a" in index and "b" not in index


# ------------------------------------------------------------ index: eviction


def test_evict_prunes_and_splices() -> None:
    index = ContextIndex()
    index.insert("a", (1, 2, 3))
    index.insert("b", (1, 2, 4))  # node (1,2) with leaves a, b
    index.insert("c", (1, 5))  # node (1) above (1,2) and c
    index.check_tree()
    assert index.num_nodes == 6
    assert index.docs_at(index.path_of("a")[:-1]) == (1, 2)
    assert index.evict("a")  # (1,2) keeps one child: spliced, b moves up
    index.check_tree()
    assert index.num_nodes == 4
    assert index.docs_at(index.path_of("b")[:-1]) == (1,)
    assert len(index.path_of("b")) == 2
    assert index.evict("c")  # (1) left with b alone: spliced, b under the root
    assert index.path_of("b") == (0,)
    assert index.num_nodes == 2
    assert index.evict("b")
    assert index.num_nodes == 1 and index.height == 0 and len(index) == 0
    index.check_tree()
    assert index.insert("d", (1, 2)).path == (0,)  # usable again


def test_evict_moves_last_sibling_into_the_gap() -> None:
    index = ContextIndex()
    for i in range(4):
        index.insert(f"r{i}", (100 + i,))
    assert index.evict("r1")
    assert index.path_of("r3") == (1,)
    assert index.path_of("r0") == (0,) and index.path_of("r2") == (2,)
    index.check_tree()


# ------------------------------------------------------- index: random loads


def _check_stored(index: ContextIndex, live: dict[str, tuple[int, ...]]) -> None:
    index.check_tree()
    assert len(index) == len(live)
    for rid, original in live.items():
        stored = index.context_of(rid)
        assert _is_permutation(stored, original)
        assert index.docs_at(index.path_of(rid)) == stored


@pytest.mark.parametrize("seed", range(6))
def test_random_inserts_and_evicts_keep_a_tree(seed: int) -> None:
    rng = random.Random(seed)
    index = ContextIndex()
    live: dict[str, tuple[int, ...]] = {}
    vocab = [5, 12, 40][seed % 3]
    for step in range(600):
        if live and rng.random() < 0.4:
            rid = rng.choice(sorted(live))
            assert index.evict(rid)
            del live[rid]
        else:
            ctx = tuple(rng.randrange(vocab) for _ in range(rng.randint(0, 8)))
            rid = f"q{step}"
            found = index.search(ctx)
            result = index.insert(rid, ctx)
            live[rid] = ctx
            assert _is_permutation(result.context, ctx)
            assert set(found.prefix) <= set(ctx)
            assert index.context_of(rid) == result.context
            assert result.path == index.path_of(rid)
        if step % 25 == 0:
            _check_stored(index, live)
    _check_stored(index, live)
    for rid in list(live):
        assert index.evict(rid)
    assert index.num_nodes == 1
    index.check_tree()


def test_random_build_then_online_then_evict_all() -> None:
    contexts = _zipf_contexts(400, 8, num_docs=60, seed=11)
    index, results = ContextIndex.build(contexts, max_exact_contexts=50)
    live = {str(i): tuple(c) for i, c in enumerate(contexts)}
    for r, c in zip(results, contexts, strict=True):
        assert _is_permutation(r.context, c)
        assert index.docs_at(r.path) == r.context
    _check_stored(index, live)
    for i, c in enumerate(_zipf_contexts(200, 8, num_docs=60, seed=12)):
        index.insert(f"n{i}", c)
        live[f"n{i}"] = tuple(c)
    _check_stored(index, live)
    rng = random.Random(5)
    order = sorted(live)
    rng.shuffle(order)
    for n, rid in enumerate(order):
        assert index.evict(rid)
        del live[rid]
        if n % 50 == 0:
            _check_stored(index, live)
    assert index.num_nodes == 1


contexts_strategy = st.lists(
    st.lists(st.integers(min_value=0, max_value=9), max_size=6), min_size=1, max_size=30
)


@settings(max_examples=60, deadline=None)
@given(contexts=contexts_strategy, evict_mask=st.lists(st.booleans(), max_size=30))
def test_hypothesis_build_insert_evict(contexts: list[list[int]], evict_mask: list[bool]) -> None:
    half = len(contexts) // 2
    index, results = ContextIndex.build(contexts[:half], max_exact_contexts=3)
    live = {r.request_id: tuple(c) for r, c in zip(results, contexts[:half], strict=True)}
    for i, c in enumerate(contexts[half:]):
        index.insert(f"n{i}", c)
        live[f"n{i}"] = tuple(c)
    _check_stored(index, live)
    for rid, drop in zip(sorted(live), evict_mask, strict=False):
        if drop:
            assert index.evict(rid)
            del live[rid]
    _check_stored(index, live)


# --------------------------------------------------------- index: wide nodes


def test_node_with_thousands_of_children() -> None:
    index = ContextIndex()
    for i in range(1, 1501):
        index.insert(f"r{i}", (0, i))
    index.check_tree()
    hub = index.path_of("r1")[:-1]
    assert index.docs_at(hub) == (0,)
    positions = {index.path_of(f"r{i}")[-1] for i in range(1, 1501)}
    assert positions == set(range(1500))  # 1,500 children under one node
    found = index.search((5, 777, 0))
    assert found.prefix == (0, 777)
    assert index.docs_at(found.path) == (0, 777)
    result = index.insert("x", (5, 777, 0))
    assert result.context == (0, 777, 5)
    assert index.docs_at(result.path[:-1]) == (0, 777)
    assert index.search((0, 3000)).path == hub  # matches the hub, no child extends it
    # two children extend it; (0, 10) has 10 at the query's position, (0, 20) is one off
    assert index.search((0, 10, 20)).path == index.path_of("r10")
    assert index.search((0, 20, 10)).path == index.path_of("r20")
    for i in range(1, 1501, 2):
        assert index.evict(f"r{i}")
    index.check_tree()
    assert index.search((0, 1000)).prefix == (0, 1000)


def test_build_node_with_thousands_of_children() -> None:
    contexts = [(i, 0) for i in range(1, 1201)]
    index, results = ContextIndex.build(contexts)
    index.check_tree()
    assert {r.path[:-1] for r in results} == {results[0].path[:-1]}
    assert index.docs_at(results[0].path[:-1]) == (0,)
    assert all(r.context == (0, i) for r, i in zip(results, range(1, 1201), strict=True))
    assert sorted(r.path[-1] for r in results) == list(range(1200))
    assert index.insert("n", (7, 0, 1300)).context == (0, 7, 1300)
    index.check_tree()


def test_build_twelve_thousand_zipf_contexts() -> None:
    contexts = _zipf_contexts(12_000, 15, num_docs=5_000, seed=0)
    index, results = ContextIndex.build(contexts)
    index.check_tree()
    assert len(results) == 12_000 and len(index) == 12_000
    for r, c in zip(results, contexts, strict=True):
        assert _is_permutation(r.context, c)
    sample = results[::500]
    assert all(index.docs_at(r.path) == r.context for r in sample)
    # prefix sharing actually happened: most contexts sit below a non-root node
    assert sum(len(r.path) > 1 for r in results) > 6_000
