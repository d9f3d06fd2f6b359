"""vLLM's KV-event wire format: decode and encode, bounded. Pure: no I/O.

A published message is three ZeroMQ frames: ``[topic (UTF-8), sequence (8 bytes,
big-endian, signed), payload (msgpack)]``. The payload is vLLM's ``EventBatch``
(msgspec ``array_like``): ``[ts, [events...], data_parallel_rank]``, the rank
possibly missing or nil. Each event is a msgspec tagged struct, tag field
``type``, tag value the class name, encoded in one of two ways (both accepted,
per event):

- **map** (vLLM 0.32): ``{"type": "BlockStored", "block_hashes": [...], ...}``
  with fields in declaration order and defaulted fields omitted; unknown keys
  are ignored;
- **positional** (older vLLM, ``array_like``): ``["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...]``,
  ``["BlockRemoved", block_hashes, medium, ...]``, ``["AllBlocksCleared"]``;
  trailing fields may be missing and later ones are read in declaration order.

Block hashes are ``int`` (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) or ``bytes``
(sha256). Event types this module does not know are skipped and counted. A
``BlockStored`` satisfies ``len(token_ids) == len(block_hashes) * block_size``
(vLLM 0.32's ``block_pool.py``; a partial-block entry is one hash with
``block_size`` equal to its token count, so the rule holds). vLLM skips null or
masked blocks (sliding window, Mamba) in ``block_hashes`` while ``token_ids``
still spans them: such an event cannot be mapped to tokens, so it is skipped and
counted as unmappable, as is one whose ``extra_keys`` (multimodal inputs, cache
salt, prompt embeddings) make its hashes depend on more than the tokens and the
LoRA name. Anything else malformed raises :class:`KVWireError`.

Replay (vLLM's ``_service_replay``): a client sends the 8-byte start sequence to
the ROUTER and receives ``(topic, sequence, payload)`` for every buffered batch
from there, then ``(b"", -1, b"")``.

Endpoints, data-parallel ranks and bind-or-connect (``offset_endpoint_port``,
``is_bind_endpoint``) live in ``kv_endpoints.py`` and are re-exported here;
per-event decoding lives in ``kv_decode.py``.

Complexity: decode and encode are O(payload bytes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]

from longroute.prefix.kv_decode import KVWireError, Skipped, decode_event, int_in_range
from longroute.prefix.kv_endpoints import is_bind_endpoint, offset_endpoint_port
from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)

__all__ = [
    "MAX_DP_RANK",
    "MAX_EVENTS_PER_BATCH",
    "MAX_PAYLOAD_BYTES",
    "MAX_TOPIC_BYTES",
    "REPLAY_END_SEQUENCE",
    "SEQUENCE_BYTES",
    "DecodedMessage",
    "KVWireError",
    "ReplayEnd",
    "decode_frames",
    "decode_message",
    "decode_payload",
    "decode_replay_reply",
    "decode_replay_request",
    "decode_sequence",
    "encode_batch",
    "encode_message",
    "encode_replay_end",
    "encode_replay_request",
    "encode_sequence",
    "is_bind_endpoint",
    "offset_endpoint_port",
]

# Bounds on what an engine may send (config-free: a sender past them is broken
# or hostile). A 1M-token prompt's events are ~5 MB; a vLLM step batches the
# events of all requests in the step.
MAX_PAYLOAD_BYTES = 32 * 1024 * 1024
MAX_TOPIC_BYTES = 256
MAX_EVENTS_PER_BATCH = 65_536
MAX_DP_RANK = 1023
SEQUENCE_BYTES = 8
REPLAY_END_SEQUENCE = -1
_MAX_BATCH_FIELDS = 8  # vLLM's EventBatch has 3; later versions may append some
_MAX_MAP_ENTRIES = 64
_MAX_STR_BYTES = 4096
_MAX_BIN_BYTES = 4096
_MAX_ARRAY_LEN = 1 << 21  # the longest list: token ids of one event
_ERROR_PREFIX_BYTES = 16


@dataclass(frozen=True, slots=True)
class DecodedMessage:
    """One decoded message and what was skipped in it (for counters)."""

    topic: str
    batch: KVEventBatch
    num_unknown_events: int
    num_unmappable_events: int


@dataclass(frozen=True, slots=True)
class ReplayEnd:
    """The replay stream's end marker (sequence -1, empty payload)."""


def _preview(data: bytes) -> str:
    head = data[:_ERROR_PREFIX_BYTES].hex()
    return head + ("..." if len(data) > _ERROR_PREFIX_BYTES else "")


def decode_sequence(frame: bytes) -> int:
    """An 8-byte big-endian signed sequence number."""
    if len(frame) != SEQUENCE_BYTES:
        raise KVWireError(
            f"sequence frame has {len(frame)} bytes, expected {SEQUENCE_BYTES} "
            f"(starts {_preview(frame)})"
        )
    return int.from_bytes(frame, "big", signed=True)


def encode_sequence(sequence: int) -> bytes:
    """The 8-byte big-endian signed form of ``sequence``."""
    return sequence.to_bytes(SEQUENCE_BYTES, "big", signed=True)


def _decode_topic(frame: bytes) -> str:
    if len(frame) > MAX_TOPIC_BYTES:
        raise KVWireError(f"topic frame has {len(frame)} bytes, at most {MAX_TOPIC_BYTES}")
    try:
        return frame.decode("utf-8")
    except UnicodeDecodeError:
        raise KVWireError(f"topic is not UTF-8 (starts {_preview(frame)})") from None


def _unpack(payload: bytes) -> Any:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise KVWireError(f"payload has {len(payload)} bytes, at most {MAX_PAYLOAD_BYTES}")
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=_MAX_STR_BYTES,
            max_bin_len=_MAX_BIN_BYTES,
            max_array_len=_MAX_ARRAY_LEN,
            max_map_len=_MAX_MAP_ENTRIES,
            max_ext_len=0,
        )
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        # msgpack's messages name offsets and limits, never the payload itself.
        raise KVWireError(
            f"payload is not valid msgpack: {type(exc).__name__}: {str(exc)[:120]} "
            f"(starts {_preview(payload)})"
        ) from None


def decode_payload(payload: bytes, *, sequence: int, topic: str = "") -> DecodedMessage:
    """Decode an ``EventBatch`` payload published under ``sequence``.

    Raises :class:`KVWireError` naming the field (and event index) at fault.
    """
    outer = _unpack(payload)
    if not isinstance(outer, list) or not 2 <= len(outer) <= _MAX_BATCH_FIELDS:
        raise KVWireError(
            "payload is not an EventBatch array [ts, events, data_parallel_rank] "
            f"(got {type(outer).__name__}{_len_note(outer)})"
        )
    ts, raw_events = outer[0], outer[1]
    if type(ts) not in (int, float) or not math.isfinite(ts):
        raise KVWireError(f"batch ts must be a finite number, got {type(ts).__name__}")
    rank = outer[2] if len(outer) > 2 else None
    if rank is not None:
        rank = int_in_range(rank, 0, MAX_DP_RANK, "batch data_parallel_rank")
    if not isinstance(raw_events, list):
        raise KVWireError(f"batch events must be an array, got {type(raw_events).__name__}")
    if len(raw_events) > MAX_EVENTS_PER_BATCH:
        raise KVWireError(f"batch has {len(raw_events)} events, at most {MAX_EVENTS_PER_BATCH}")
    events: list[KVEvent] = []
    num_unknown = num_unmappable = 0
    for index, raw in enumerate(raw_events):
        event = decode_event(raw, index)
        if event is Skipped.UNKNOWN_TYPE:
            num_unknown += 1
        elif event is Skipped.UNMAPPABLE:
            num_unmappable += 1
        else:
            events.append(event)
    batch = KVEventBatch(
        sequence=sequence, ts_s=float(ts), events=tuple(events), data_parallel_rank=rank
    )
    return DecodedMessage(topic, batch, num_unknown, num_unmappable)


def _len_note(value: object) -> str:
    return f" of length {len(value)}" if isinstance(value, list) else ""


def decode_frames(frames: Sequence[bytes]) -> DecodedMessage:
    """Decode a published message ``[topic, sequence, payload]``."""
    if len(frames) != 3:
        raise KVWireError(f"message has {len(frames)} frames, expected 3 (topic, seq, payload)")
    topic = _decode_topic(frames[0])
    sequence = decode_sequence(frames[1])
    if sequence < 0:
        raise KVWireError(f"published sequence must be >= 0, got {sequence}")
    return decode_payload(frames[2], sequence=sequence, topic=topic)


def decode_message(frames: Sequence[bytes]) -> tuple[str, KVEventBatch]:
    """``(topic, batch)`` of a published message; skipped events are dropped."""
    decoded = decode_frames(frames)
    return decoded.topic, decoded.batch


# --- encoding: exactly vLLM 0.32's structure ----------------------------------


def _encode_stored(event: BlockStored, positional: bool) -> dict[str, Any] | list[Any]:
    # vLLM 0.32 publishes one untagged extra-key entry per block: nil for a
    # plain text block, [lora_name] for a LoRA one; lora_id (deprecated) is an
    # adapter number longroute does not carry, so it is nil.
    per_block = None if event.lora_name is None else [event.lora_name]
    fields: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": list(event.block_hashes),
        "parent_block_hash": event.parent_block_hash,
        "token_ids": list(event.token_ids),
        "block_size": event.block_size_tokens,
        "lora_id": None,
        "medium": event.medium,
        "lora_name": event.lora_name,
    }
    if positional:  # the older array_like layout ends at lora_name
        return list(fields.values())
    fields["extra_keys"] = [per_block] * len(event.block_hashes)
    fields["group_idx"] = event.group_idx
    if event.kv_cache_spec_kind is not None:  # msgspec omits a None default
        fields["kv_cache_spec_kind"] = event.kv_cache_spec_kind
    return fields


def _encode_event(event: KVEvent, positional: bool) -> dict[str, Any] | list[Any]:
    if isinstance(event, BlockStored):
        return _encode_stored(event, positional)
    if isinstance(event, BlockRemoved):
        if positional:
            return ["BlockRemoved", list(event.block_hashes), event.medium]
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": event.medium,
            "group_idx": event.group_idx,
        }
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"] if positional else {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {type(event).__name__}")


def encode_batch(batch: KVEventBatch, *, positional: bool = False) -> bytes:
    """msgpack of ``batch`` as vLLM 0.32 publishes it (``positional``: older vLLM)."""
    events = [_encode_event(event, positional) for event in batch.events]
    packed: bytes = msgpack.packb(
        [float(batch.ts_s), events, batch.data_parallel_rank], use_bin_type=True
    )
    return packed


def encode_message(topic: str, batch: KVEventBatch, *, positional: bool = False) -> list[bytes]:
    """The three frames vLLM's publisher sends for ``batch``."""
    if batch.sequence < 0:
        raise ValueError(f"a published sequence is >= 0, got {batch.sequence}")
    return [
        topic.encode("utf-8"),
        encode_sequence(batch.sequence),
        encode_batch(batch, positional=positional),
    ]


# --- replay -------------------------------------------------------------------


def encode_replay_request(start_sequence: int) -> bytes:
    """What a client sends vLLM's replay ROUTER: the first sequence it wants."""
    if start_sequence < 0:
        raise ValueError(f"replay start sequence must be >= 0, got {start_sequence}")
    return encode_sequence(start_sequence)


def decode_replay_request(frame: bytes) -> int:
    """The start sequence of a replay request (publisher side)."""
    start = decode_sequence(frame)
    if start < 0:
        raise KVWireError(f"replay start sequence must be >= 0, got {start}")
    return start


def encode_replay_end() -> list[bytes]:
    """The end marker a publisher sends after the replayed batches."""
    return [b"", encode_sequence(REPLAY_END_SEQUENCE), b""]


def decode_replay_reply(frames: Sequence[bytes]) -> DecodedMessage | ReplayEnd:
    """One replay reply ``[topic, sequence, payload]`` (after ZeroMQ's delimiter)."""
    if len(frames) != 3:
        raise KVWireError(f"replay reply has {len(frames)} frames, expected 3")
    if decode_sequence(frames[1]) == REPLAY_END_SEQUENCE:
        return ReplayEnd()
    return decode_frames(frames)
