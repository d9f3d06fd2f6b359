"""KV-cache events: what an engine says it stored, removed or cleared.

These are longroute's own types for the facts vLLM publishes (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared`` in ``vllm/distributed/kv_events.py``)
and SGLang mirrors. They cross every boundary that carries engine truth: the
wire decoder (``prefix/kv_wire.py``) makes them, the gateway's subscriber
hands them to the precise prefix index, the emulator's publisher encodes
them, and the simulator's replica model delays them. Pure data: no I/O.

An engine block hash is opaque: an ``int`` (vLLM's builtin/xxhash modes) or
``bytes`` (sha256 modes). Consumers never recompute it; they map it to their
own key through the block's ``token_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass

EngineBlockHash = int | bytes

# vLLM's ``medium`` values; ``None`` (older engines) means the GPU cache.
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive full blocks of one prompt entered the engine's cache.

    ``block_hashes[i]`` covers ``token_ids[i * block_size_tokens:(i + 1) *
    block_size_tokens]``; ``parent_block_hash`` is the engine hash of the
    block before the first one (``None`` at the start of a prompt).
    """

    block_hashes: tuple[EngineBlockHash, ...]
    parent_block_hash: EngineBlockHash | None
    token_ids: tuple[int, ...]
    block_size_tokens: int
    medium: str | None = None
    lora_name: str | None = None
    # vLLM's KV-cache group (hybrid models have several; engines before the
    # field existed had one, group 0). The same hash may live in several groups.
    group_idx: int = 0
    # vLLM 0.32's cache-spec metadata of the group ("full_attention", "sliding_window",
    # ...); None where the engine does not say
    kv_cache_spec_kind: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the engine's cache (evicted or freed)."""

    block_hashes: tuple[EngineBlockHash, ...]
    medium: str | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole cache (reset, restart, weight reload)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published message: its sequence number, engine timestamp and events."""

    sequence: int
    ts_s: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


def is_gpu_medium(medium: str | None) -> bool:
    """Whether a block on ``medium`` is in the cache that serves prefix hits."""
    return medium is None or medium == MEDIUM_GPU
