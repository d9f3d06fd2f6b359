"""PrecisePrefixIndex: engine events keyed like chain_block_hashes, contiguous matching,
bounds, fallback, approximate endpoints as RouterPrefixIndex, and vLLM's cached-token rule."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longroute.features.block_hash import chain_block_hashes
from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from longroute.prefix.precise_index import PrecisePrefixIndex, lora_root_hash
from longroute.prefix.router_index import RouterPrefixIndex

BS = 4  # block size in tokens


class FakeEngine:
    """A vLLM-like prefix cache that publishes the events vLLM would.

    Engine hashes chain like vLLM's sha256 mode (bytes over the parent and the
    block's tokens), so they share nothing with longroute's keys. Blocks are a
    multiset: vLLM does not de-duplicate, so recomputing a block that is still
    cached (behind an evicted one) caches a second copy.
    """

    def __init__(self, lora_name: str | None = None) -> None:
        self.copies: Counter[bytes] = Counter()
        self.lora_name = lora_name

    def hashes(self, tokens: list[int]) -> list[bytes]:
        out: list[bytes] = []
        parent = (self.lora_name or "").encode()
        for start in range(0, len(tokens) - len(tokens) % BS, BS):
            block = tokens[start : start + BS]
            parent = hashlib.sha256(parent + repr(block).encode()).digest()
            out.append(parent)
        return out

    def hit_blocks(self, tokens: list[int]) -> int:
        hit = 0
        for engine_hash in self.hashes(tokens):
            if not self.copies[engine_hash]:
                break
            hit += 1
        return hit

    def serve(self, tokens: list[int]) -> list[KVEvent]:
        """Run a prompt: the leading cached run hits, every later full block is cached."""
        engine_hashes = self.hashes(tokens)
        hit = self.hit_blocks(tokens)
        new = engine_hashes[hit:]
        if not new:
            return []
        for engine_hash in new:
            self.copies[engine_hash] += 1
        return [
            BlockStored(
                block_hashes=tuple(new),
                parent_block_hash=engine_hashes[hit - 1] if hit else None,
                token_ids=tuple(tokens[hit * BS : len(engine_hashes) * BS]),
                block_size_tokens=BS,
                lora_name=self.lora_name,
            )
        ]

    def evict(self, engine_hash: bytes) -> list[KVEvent]:
        self.copies[engine_hash] -= 1
        if not self.copies[engine_hash]:
            del self.copies[engine_hash]
        return [BlockRemoved(block_hashes=(engine_hash,))]

    def clear(self) -> list[KVEvent]:
        self.copies.clear()
        return [AllBlocksCleared()]


def _precise(names: list[str], capacity: int = 1000) -> PrecisePrefixIndex:
    index = PrecisePrefixIndex(names, capacity_blocks_per_endpoint=capacity)
    for name in names:
        index.set_precise(name, BS)
    return index


PROMPT = list(range(100, 123))  # 5 full blocks and 3 tokens


def test_keys_agree_with_chain_block_hashes_across_events() -> None:
    index = _precise(["a"])
    engine = FakeEngine()
    index.apply("a", engine.serve(PROMPT[:8]))  # 2 blocks, parent None
    index.apply("a", engine.serve(PROMPT))  # 3 more blocks, parent = engine hash of block 1
    keys = chain_block_hashes(PROMPT, BS)
    assert index.match(keys) == {"a": 5}
    assert index.num_blocks("a") == 5
    # a longer next turn finds the 5 cached blocks; a prompt that differs in block 3 finds 3
    assert index.match(chain_block_hashes([*PROMPT, 7, 7, 7, 7, 7], BS)) == {"a": 5}
    changed = [*PROMPT[:13], -1, *PROMPT[14:]]
    assert index.match(chain_block_hashes(changed, BS)) == {"a": 3}
    assert index.match(chain_block_hashes([5, *PROMPT], BS)) == {}
    counters = index.counters("a")
    assert (counters.num_events_applied, counters.num_blocks_stored) == (2, 5)


def test_a_removed_middle_block_ends_the_match_there() -> None:
    index = _precise(["a", "b"])
    engine = FakeEngine()
    index.apply("a", engine.serve(PROMPT))
    index.apply("b", FakeEngine().serve(PROMPT[:8]))
    middle = engine.hashes(PROMPT)[2]
    index.apply("a", engine.evict(middle))
    keys = chain_block_hashes(PROMPT, BS)
    assert index.match(keys) == {"a": 2, "b": 2}
    assert index.num_blocks("a") == 4  # blocks 3 and 4 are still held, but unreachable
    assert index._precise["a"].num_orphans == 1  # block 3: the walk, not bisection
    # the engine recomputes block 2 and caches a second copy of blocks 3 and 4
    index.apply("a", engine.serve(PROMPT))
    assert index.match(keys) == {"a": 5, "b": 2}
    assert index._precise["a"].num_orphans == 0
    # evicting one copy of block 3 leaves the other: still a hit
    index.apply("a", engine.evict(engine.hashes(PROMPT)[3]))
    assert index.match(keys)["a"] == 5 == engine.hit_blocks(PROMPT)
    index.apply("a", engine.evict(engine.hashes(PROMPT)[3]))
    assert index.match(keys)["a"] == 3 == engine.hit_blocks(PROMPT)


def test_cleared_holds_nothing() -> None:
    index = _precise(["a"])
    engine = FakeEngine()
    index.apply("a", KVEventBatch(sequence=1, ts_s=0.0, events=tuple(engine.serve(PROMPT))))
    index.apply("a", KVEventBatch(sequence=2, ts_s=0.1, events=tuple(engine.clear())))
    assert index.match(chain_block_hashes(PROMPT, BS)) == {}
    assert index.num_blocks("a") == 0 and index.num_nodes() == 0
    assert index.counters("a").num_clears == 1
    # removals of blocks from before the clear are unknown now, and harmless
    index.apply("a", [BlockRemoved(block_hashes=tuple(engine.hashes(PROMPT)[:2]))])
    assert index.counters("a").num_removals_unknown == 2


def test_blocks_with_an_unknown_parent_are_skipped_and_counted() -> None:
    index = _precise(["a"])
    engine = FakeEngine()
    engine.serve(PROMPT[:8])  # stored before we subscribed
    index.apply("a", engine.serve(PROMPT))
    assert index.match(chain_block_hashes(PROMPT, BS)) == {}
    assert index.num_blocks("a") == 0
    assert index.counters("a").num_blocks_unknown_parent == 3


def test_lora_blocks_are_keyed_apart_from_the_base_model() -> None:
    index = _precise(["a"])
    index.apply("a", FakeEngine(lora_name="sql").serve(PROMPT))
    assert index.match(chain_block_hashes(PROMPT, BS)) == {}
    root = lora_root_hash("sql")
    assert index.match(chain_block_hashes(PROMPT, BS, parent_hash=root)) == {"a": 5}
    other = chain_block_hashes(PROMPT, BS, parent_hash=lora_root_hash("chat"))
    assert index.match(other) == {}
    # a digest, not hash(str): the same value in every process
    assert root == lora_root_hash("sql") and 0 <= root < 1 << 63
    assert lora_root_hash("sql") != lora_root_hash("sql ")


def test_offloaded_blocks_are_not_cache_hits() -> None:
    index = _precise(["a"])
    engine = FakeEngine()
    (stored,) = engine.serve(PROMPT)
    assert isinstance(stored, BlockStored)
    cpu_copy = BlockStored(
        stored.block_hashes, None, stored.token_ids, BS, medium="CPU", lora_name=None
    )
    index.apply("a", [cpu_copy])
    assert index.match(chain_block_hashes(PROMPT, BS)) == {}
    index.apply("a", [stored])  # medium None: the GPU cache (older engines)
    index.apply("a", [BlockRemoved(block_hashes=stored.block_hashes[:1], medium="CPU")])
    assert index.match(chain_block_hashes(PROMPT, BS)) == {"a": 5}
    index.apply("a", [BlockRemoved(block_hashes=stored.block_hashes[:1], medium="GPU")])
    assert index.match(chain_block_hashes(PROMPT, BS)) == {}
    assert index.counters("a").num_events_other_medium == 2


def test_another_block_size_sends_the_endpoint_back_to_approximate() -> None:
    index = _precise(["a"])
    engine = FakeEngine()
    index.apply("a", engine.serve(PROMPT[:8]))
    other = BlockStored((b"x",), None, tuple(range(8)), 8)
    reason = index.apply("a", [other, *engine.serve(PROMPT)])
    assert reason is not None and "block_size 8" in reason and "configured with 4" in reason
    assert not index.is_precise("a") and index.block_size_tokens("a") is None
    assert index.num_blocks("a") == 0
    assert index.counters("a").num_block_size_mismatches == 1
    # approximate now: dispatch feeds it, and events are counted and ignored
    keys = chain_block_hashes(PROMPT, BS)
    index.insert(keys, "a", 0.0)
    assert index.match(keys) == {"a": 5}
    assert index.apply("a", engine.clear()) is None
    assert index.match(keys) == {"a": 5}
    assert index.counters("a").num_events_while_approximate == 1


def test_malformed_stored_event_is_skipped() -> None:
    index = _precise(["a"])
    short = BlockStored((b"x", b"y"), None, tuple(range(7)), BS)  # 2 blocks need 8 tokens
    assert index.apply("a", [short]) is None
    assert index.num_blocks("a") == 0 and index.counters("a").num_events_malformed == 1


def test_a_switch_clears_holdings_and_precise_ignores_dispatch() -> None:
    index = PrecisePrefixIndex(["a", "b"], capacity_blocks_per_endpoint=100)
    keys = chain_block_hashes(PROMPT, BS)
    index.insert(keys, "a", 0.0)
    index.insert(keys, "b", 0.0)
    index.set_precise("a", BS)
    assert index.match(keys) == {"b": 5} and index.num_blocks("a") == 0
    index.insert(keys, "a", 1.0)  # a guess: precise endpoints learn only from events
    assert index.match(keys) == {"b": 5}
    index.apply("a", FakeEngine().serve(PROMPT))
    assert index.match(keys) == {"a": 5, "b": 5}
    index.remove_endpoint("a")  # engine restart: cleared, still precise
    assert index.is_precise("a") and index.match(keys) == {"b": 5}
    index.apply("a", FakeEngine().serve(PROMPT))
    index.set_approximate("a")
    assert index.match(keys) == {"b": 5} and index.num_nodes() == 5
    index.set_approximate("b")  # already approximate: keeps its guesses
    assert index.match(keys) == {"b": 5}


def test_holdings_and_the_hash_map_are_bounded() -> None:
    index = _precise(["a"], capacity=4)
    engine = FakeEngine()
    index.apply("a", engine.serve(PROMPT))  # 5 blocks > 4: the oldest stored goes
    assert index.num_blocks("a") == 4
    assert index.counters("a").num_hash_map_evictions == 1
    assert index.match(chain_block_hashes(PROMPT, BS)) == {}  # block 0 was dropped
    # an engine that never sends BlockRemoved: memory stays at the bound
    for i in range(200):
        index.apply("a", FakeEngine().serve([i, *range(1000, 1011)]))
    assert index.num_blocks("a") == 4 and index.num_nodes() == 4
    assert index.counters("a").num_hash_map_evictions == 1 + 200 * 3
    assert index.match(chain_block_hashes([199, *range(1000, 1011)], BS)) == {"a": 3}


def test_approximate_endpoints_match_router_prefix_index_exactly() -> None:
    rng = random.Random(5)
    names = ["a", "b", "c"]
    reference = RouterPrefixIndex(names, capacity_blocks_per_endpoint=25)
    index = PrecisePrefixIndex([*names, "p"], capacity_blocks_per_endpoint=25)
    index.set_precise("p", BS)
    for step in range(1500):
        name = rng.choice(names)
        if rng.random() < 0.01:
            reference.remove_endpoint(name)
            index.remove_endpoint(name)
            continue
        doc = rng.randrange(6)
        prompt = [doc * 1000 + i for i in range(rng.randrange(1, 40))]
        reference.insert(prompt, name, float(step))
        index.insert(prompt, name, float(step))
        assert index.match(prompt) == reference.match(prompt)
        assert [index.num_blocks(n) for n in names] == [reference.num_blocks(n) for n in names]
    assert index.num_nodes() == reference.num_nodes()
    # the expectations of test_router_index, through the new index
    index = PrecisePrefixIndex(["a", "b", "c", "d"], capacity_blocks_per_endpoint=100)
    for path, name in (([1, 2, 3], "a"), ([1, 2, 4], "b"), ([1, 5], "c"), ([9, 12, 13], "d")):
        index.insert(path, name, 0.0)
    assert index.match([1, 2, 3, 7]) == {"a": 3, "b": 2, "c": 1}
    assert index.match([1, 5, 6]) == {"a": 1, "b": 1, "c": 2}
    assert index.match([]) == {} and index.num_nodes() == 8


def test_predicted_cached_tokens_follows_vllms_last_token_rule() -> None:
    index = _precise(["a"])
    prompt = list(range(500, 512))  # exactly 3 blocks
    index.apply("a", FakeEngine().serve(prompt))
    keys = chain_block_hashes(prompt, BS)

    def predict(tokens: list[int]) -> int:
        return index.predicted_cached_tokens("a", chain_block_hashes(tokens, BS), len(tokens))

    assert predict(prompt) == 8  # k blocks exactly: the last one is recomputed
    assert predict([*prompt, 1]) == 12  # k blocks + 1 token: all k hit
    assert predict([*prompt, 1, 2, 3, 4, 5]) == 12
    assert predict(prompt[:5]) == 4  # 1 block + 1 token
    assert predict(prompt[:4]) == 0  # exactly one block
    assert predict(prompt[:3]) == 0 and predict(prompt[:1]) == 0 and predict([]) == 0
    assert predict([-1, *prompt]) == 0
    assert index.predicted_cached_tokens("a", keys, 13, block_size_tokens=BS) == 12
    with pytest.raises(ValueError, match="3 block hashes cannot come from a prompt of 11"):
        index.predicted_cached_tokens("a", keys, 11)
    with pytest.raises(ValueError, match="blocks of 4 tokens, got block_size_tokens=16"):
        index.predicted_cached_tokens("a", keys, 13, block_size_tokens=16)
    with pytest.raises(ValueError, match="num_prompt_tokens"):
        index.predicted_cached_tokens("a", keys, -1)


def test_predicted_cached_tokens_on_an_approximate_endpoint() -> None:
    index = PrecisePrefixIndex(["a"], capacity_blocks_per_endpoint=100)
    keys = chain_block_hashes(PROMPT, BS)
    index.insert(keys[:2], "a", 0.0)
    assert index.predicted_cached_tokens("a", keys, len(PROMPT), block_size_tokens=BS) == 8
    with pytest.raises(ValueError, match="approximate: pass the block_size_tokens"):
        index.predicted_cached_tokens("a", keys, len(PROMPT))


def test_endpoints_come_and_go_and_errors_name_the_bad_value() -> None:
    index = _precise(["a"])
    index.add_endpoint("b")
    assert index.endpoint_names == ("a", "b") and not index.is_precise("b")
    index.apply("a", FakeEngine().serve(PROMPT))
    index.forget_endpoint("a")
    assert list(index.endpoint_names) == ["b"] and index.num_nodes() == 0
    with pytest.raises(KeyError, match=r"'a'.*valid: b"):
        index.apply("a", [])
    with pytest.raises(KeyError, match="zz"):
        index.num_blocks("zz")
    with pytest.raises(KeyError, match="zz"):
        index.set_precise("zz", BS)
    with pytest.raises(ValueError, match="block_size_tokens must be >= 1, got 0"):
        index.set_precise("b", 0)
    with pytest.raises(ValueError, match="already known"):
        index.add_endpoint("b")


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["serve", "serve", "serve", "evict", "clear"]),
        st.integers(0, 1),  # endpoint
        st.integers(0, 5),  # document
        st.integers(0, 30),  # prompt length
        st.integers(0, 10**6),  # which block to evict
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(_OPS)
def test_match_equals_each_engines_own_hit(ops: list[tuple[str, int, int, int, int]]) -> None:
    """The reference is the engine itself: its leading run of cached blocks."""
    engines = [FakeEngine(), FakeEngine()]
    names = ["e0", "e1"]
    index = _precise(names)
    docs = [[doc * 100 + (i % (3 + doc)) for i in range(40)] for doc in range(6)]
    for op, which, doc, length, pick in ops:
        engine = engines[which]
        events: list[KVEvent]
        if op == "serve":
            events = engine.serve(docs[doc][:length])
        elif op == "evict" and engine.copies:
            held = sorted(engine.copies)
            events = engine.evict(held[pick % len(held)])  # any block, middle ones too
        else:
            events = engine.clear()
        assert index.apply(names[which], events) is None
        holdings = index._precise[names[which]]
        orphans = [
            k for k, p in holdings._parent_of.items() if p is not None and p not in holdings.held
        ]
        assert holdings.num_orphans == len(orphans)  # 0 exactly when bisection is allowed
        assert holdings._parent_of.keys() == holdings.held.keys()
        for tokens in (docs[doc][:length], docs[doc]):
            keys = chain_block_hashes(tokens, BS)
            truth = {n: e.hit_blocks(tokens) for n, e in zip(names, engines, strict=True)}
            assert index.match(keys) == {n: hit for n, hit in truth.items() if hit}
            for n, e in zip(names, engines, strict=True):
                expected = min(e.hit_blocks(tokens), max(len(tokens) - 1, 0) // BS) * BS
                assert index.predicted_cached_tokens(n, keys, len(tokens)) == expected
