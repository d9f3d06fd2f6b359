"""Decoding one vLLM KV event, map or positional, with bounds. Pure: no I/O.

The message-level format is described in ``kv_wire.py``; this module turns one
already-unpacked msgpack value into a ``BlockStored``, ``BlockRemoved`` or
``AllBlocksCleared``, or says why it was skipped. Every value is checked for
type and range; errors name the event index and field, never echo payload
bytes. Complexity: O(size of the event).
"""

from __future__ import annotations

import enum
from typing import Any

from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KVEvent,
)

# One event describes at most one prompt's new blocks: a 1M-token prompt at
# block size 16 is 65,536 blocks; token ids allow a 2M-token prompt.
MAX_HASHES_PER_EVENT = 65_536
MAX_TOKEN_IDS_PER_EVENT = 1 << 21
MAX_BLOCK_SIZE_TOKENS = 65_536
MAX_HASH_BYTES = 64  # sha256 hashes are 32 bytes
MAX_TOKEN_ID = (1 << 32) - 1
MAX_NAME_CHARS = 256  # medium, lora_name
MAX_GROUP_IDX = 1023
_INT_HASH_MIN = -(1 << 63)
_INT_HASH_MAX = (1 << 64) - 1  # vLLM masks int hashes to 64 bits

# Field order of vLLM's structs: a positional (array_like) event lists them in
# this order after its tag, as msgspec does.
_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
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
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


class KVWireError(ValueError):
    """A KV-event message breaks the wire format or a bound; says where."""


class Skipped(enum.Enum):
    """Why a well-formed event was not decoded into a longroute event."""

    UNKNOWN_TYPE = "unknown_type"  # a tag this decoder does not know
    UNMAPPABLE = "unmappable"  # hashes that token ids alone cannot name


def _describe(value: object) -> str:
    if type(value) is int:
        return str(value)
    return f"a value of type {type(value).__name__}"


def int_in_range(value: object, low: int, high: int, what: str) -> int:
    """``value`` if it is an ``int`` (not ``bool``) in ``low..high``."""
    if type(value) is not int or not low <= value <= high:
        raise KVWireError(f"{what} must be an integer in {low}..{high}, got {_describe(value)}")
    return value


def _block_hash(value: object, what: str) -> EngineBlockHash:
    if type(value) is int:
        return int_in_range(value, _INT_HASH_MIN, _INT_HASH_MAX, what)
    if type(value) is bytes:
        if not 1 <= len(value) <= MAX_HASH_BYTES:
            raise KVWireError(f"{what} has {len(value)} bytes, expected 1..{MAX_HASH_BYTES}")
        return value
    raise KVWireError(f"{what} must be an int or bytes, got {_describe(value)}")


def _block_hashes(value: object, where: str) -> tuple[EngineBlockHash, ...]:
    if not isinstance(value, list):
        raise KVWireError(f"{where}: block_hashes must be an array, got {_describe(value)}")
    if len(value) > MAX_HASHES_PER_EVENT:
        raise KVWireError(
            f"{where}: block_hashes has {len(value)} entries, at most {MAX_HASHES_PER_EVENT}"
        )
    return tuple(_block_hash(item, f"{where}: block_hashes[{i}]") for i, item in enumerate(value))


def _token_ids(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KVWireError(f"{where}: token_ids must be an array, got {_describe(value)}")
    if len(value) > MAX_TOKEN_IDS_PER_EVENT:
        raise KVWireError(
            f"{where}: token_ids has {len(value)} entries, at most {MAX_TOKEN_IDS_PER_EVENT}"
        )
    ids = tuple(value)
    # Whole-array checks first (fast); find the culprit only on failure.
    if all(type(t) is int for t in ids) and (
        not ids or (min(ids) >= 0 and max(ids) <= MAX_TOKEN_ID)
    ):
        return ids
    for i, token in enumerate(ids):
        int_in_range(token, 0, MAX_TOKEN_ID, f"{where}: token_ids[{i}]")
    raise AssertionError("unreachable: a bad token id was found above")


def _optional_name(value: object, what: str) -> str | None:
    if value is None:
        return None
    if type(value) is not str or len(value) > MAX_NAME_CHARS:
        raise KVWireError(f"{what} must be nil or a string of at most {MAX_NAME_CHARS} characters")
    return value


def _group_idx(value: object, where: str) -> int:
    if value is None:  # engines before the field: one group
        return 0
    return int_in_range(value, 0, MAX_GROUP_IDX, f"{where}: group_idx")


def _require(fields: dict[str, Any], name: str, where: str) -> object:
    if name not in fields:
        raise KVWireError(f"{where}: missing field {name}")
    return fields[name]


def _is_keyed_by_tokens(
    extra_keys: object, lora_name: str | None, num_blocks: int, where: str
) -> bool:
    """Whether ``extra_keys`` leave the hashes a function of tokens and LoRA name."""
    if extra_keys is None:
        return True
    if not isinstance(extra_keys, list) or len(extra_keys) != num_blocks:
        raise KVWireError(
            f"{where}: extra_keys must be nil or one entry per block hash ({num_blocks})"
        )
    lora_only = None if lora_name is None else [lora_name]
    return all(entry is None or entry == lora_only for entry in extra_keys)


def _block_stored(fields: dict[str, Any], where: str) -> BlockStored | Skipped:
    hashes = _block_hashes(_require(fields, "block_hashes", where), where)
    parent = fields.get("parent_block_hash")
    if parent is not None:
        parent = _block_hash(parent, f"{where}: parent_block_hash")
    token_ids = _token_ids(_require(fields, "token_ids", where), where)
    block_size = int_in_range(
        _require(fields, "block_size", where), 1, MAX_BLOCK_SIZE_TOKENS, f"{where}: block_size"
    )
    lora_name = _optional_name(fields.get("lora_name"), f"{where}: lora_name")
    expected = len(hashes) * block_size
    if len(token_ids) != expected:
        if len(token_ids) > expected and len(token_ids) % block_size == 0:
            return Skipped.UNMAPPABLE  # null/masked blocks left out of block_hashes
        raise KVWireError(
            f"{where}: token_ids has {len(token_ids)} entries, expected {len(hashes)} "
            f"block hashes x block_size {block_size} = {expected}"
        )
    if not _is_keyed_by_tokens(fields.get("extra_keys"), lora_name, len(hashes), where):
        return Skipped.UNMAPPABLE
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=token_ids,
        block_size_tokens=block_size,
        medium=_optional_name(fields.get("medium"), f"{where}: medium"),
        lora_name=lora_name,
        group_idx=_group_idx(fields.get("group_idx"), where),
        kv_cache_spec_kind=_optional_name(
            fields.get("kv_cache_spec_kind"), f"{where}: kv_cache_spec_kind"
        ),
    )


def _tag_and_fields(raw: object, index: int) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names = _FIELDS.get(tag, ()) if isinstance(tag, str) else ()
        fields = dict(zip(names, raw[1:], strict=False))  # later fields: ignored
    else:
        raise KVWireError(
            f"event {index} must be a tagged map or a non-empty tagged array, got {_describe(raw)}"
        )
    if not isinstance(tag, str):
        raise KVWireError(f"event {index} has no string 'type' tag")
    return tag, fields


def decode_event(raw: object, index: int) -> KVEvent | Skipped:
    """Event ``index`` of a batch, from its unpacked msgpack value."""
    tag, fields = _tag_and_fields(raw, index)
    where = f"event {index} ({tag})" if tag in _FIELDS else ""
    if tag == "BlockStored":
        return _block_stored(fields, where)
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_block_hashes(_require(fields, "block_hashes", where), where),
            medium=_optional_name(fields.get("medium"), f"{where}: medium"),
            group_idx=_group_idx(fields.get("group_idx"), where),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return Skipped.UNKNOWN_TYPE
