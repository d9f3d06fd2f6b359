"""The emulated engine's KV-cache events, captured from its prefix cache as vLLM emits them.

:class:`KvEventCapture` is the :class:`~longroute.prefix.engine_cache.CacheObserver`
of the engine's :class:`~longroute.prefix.engine_cache.EnginePrefixCache`.
It turns what the cache reports into longroute's event types, as vLLM 0.32's
block pool does (``vllm/v1/core/block_pool.py``):

- blocks that enter the cache: one ``BlockStored`` per run of consecutive new
  blocks of one prompt, with their hashes, the hash of the block before
  (``None`` for a prompt's first block), their token ids, the block size,
  ``medium="GPU"`` and no LoRA;
- an evicted block: one ``BlockRemoved`` per block, as vLLM emits them;
- a reset of the whole cache: ``AllBlocksCleared``.

The engine hashes are the emulator's own chained 63-bit ints
(:func:`~longroute.features.block_hash.chain_block_hashes` over the
pseudo-token ids), as vLLM's builtin-hash mode publishes ints.

The cache knows hashes only. The driver registers each request's hashes
tuple with its token ids while the request is in the engine (keyed by the
tuple's identity, which the engine's sequence shares), and the capture reads
the stored blocks' token ids from there.

Events are batched per engine iteration, as vLLM publishes one batch per
scheduler step that had events: an event of a later iteration closes the
batch in progress, and the driver calls :meth:`KvEventCapture.flush` after
each advance, submission and abort. Sequence numbers start at 0; ``ts_s`` is
the wall time (seconds since the epoch) of the engine clock when the batch's
first event happened. Everything here runs on the engine's thread and does no
I/O: ``sink`` (the publisher's non-blocking ``publish``) gets each batch.

Complexity: O(1) per event plus the copied hashes and token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from longroute.prefix.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)

BatchSink = Callable[[KVEventBatch], None]


class KvEventCapture:
    """Cache observer that collects the engine's events into per-iteration batches."""

    __slots__ = ("_iteration_of", "_next_sequence", "_pending", "_pending_iteration",
                 "_pending_ts_s", "_sink", "_tokens", "_ts_of", "block_size_tokens")  # fmt: skip

    def __init__(
        self,
        block_size_tokens: int,
        sink: BatchSink,
        *,
        iteration_of: Callable[[], int],
        ts_of: Callable[[], float],
    ) -> None:
        """``iteration_of``: the engine's iteration count; ``ts_of``: its clock as epoch s."""
        self.block_size_tokens = block_size_tokens
        self._sink = sink
        self._iteration_of = iteration_of
        self._ts_of = ts_of
        self._tokens: dict[int, tuple[Sequence[int], Sequence[int]]] = {}
        self._pending: list[KVEvent] = []
        self._pending_iteration = 0
        self._pending_ts_s = 0.0
        self._next_sequence = 0

    @property
    def num_registered(self) -> int:
        """Requests whose token ids are held (those in the engine)."""
        return len(self._tokens)

    # ---- the driver ------------------------------------------------------
    def register(self, block_hashes: Sequence[int], token_ids: Sequence[int]) -> None:
        """A request enters the engine: its blocks' token ids, by its hashes tuple."""
        if block_hashes:
            self._tokens[id(block_hashes)] = (block_hashes, token_ids)

    def unregister(self, block_hashes: Sequence[int]) -> None:
        """The request left the engine (finished or aborted); a no-op if not registered."""
        entry = self._tokens.get(id(block_hashes))
        if entry is not None and entry[0] is block_hashes:
            del self._tokens[id(block_hashes)]

    def flush(self) -> None:
        """Hand the batch in progress, if any, to the sink."""
        if not self._pending:
            return
        events = tuple(self._pending)
        # rank 0, as vLLM's publisher stamps a batch of a single-rank engine
        batch = KVEventBatch(self._next_sequence, self._pending_ts_s, events, 0)
        self._next_sequence += 1
        self._pending = []
        self._sink(batch)

    # ---- CacheObserver ---------------------------------------------------
    def on_stored(self, block_hashes: Sequence[int], start: int, stop: int) -> None:
        entry = self._tokens.get(id(block_hashes))
        if entry is None or entry[0] is not block_hashes:
            raise LookupError(
                f"KV events: blocks {start}..{stop - 1} were stored for a prompt whose token "
                "ids were not registered (the driver registers every request it submits)"
            )
        bs = self.block_size_tokens
        event = BlockStored(
            block_hashes=tuple(block_hashes[start:stop]),
            parent_block_hash=block_hashes[start - 1] if start > 0 else None,
            token_ids=tuple(entry[1][start * bs : stop * bs]),
            block_size_tokens=bs,
            medium=MEDIUM_GPU,
            lora_name=None,
            kv_cache_spec_kind="full_attention",  # as vLLM 0.32 says of a dense model
        )
        self._add(event)

    def on_removed(self, block_hash: int) -> None:
        self._add(BlockRemoved((block_hash,), medium=MEDIUM_GPU))

    def on_cleared(self) -> None:
        self._add(AllBlocksCleared())

    def _add(self, event: KVEvent) -> None:
        iteration = self._iteration_of()
        if self._pending and iteration != self._pending_iteration:
            self.flush()
        if not self._pending:
            self._pending_iteration = iteration
            self._pending_ts_s = self._ts_of()
        self._pending.append(event)
