"""An engine's mutable record of one request it is serving (engine-owned)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from longroute.types import Request

if TYPE_CHECKING:
    from longroute.sim.decode_group import Cohort


class Sequence:
    """Progress of one request inside one engine.

    ``target_tokens`` is what prefill must reach: the prompt, or after a
    recompute-preemption the prompt plus the tokens generated so far.
    While the sequence decodes, the engine advances all decoding sequences in
    lock-step and keeps their progress implicit (``base_*`` fields plus the
    engine's decode-step counter); ``num_computed_tokens`` and
    ``num_generated`` are brought up to date when it leaves decoding.
    ``num_computed_tokens`` are in the KV cache; ``num_pinned_blocks`` of them
    are shared prefix-cache blocks, the rest are private, allocated in KV
    blocks (``num_private_alloc_tokens``, a multiple of the KV block size); while
    decoding, the blocks its cohort gained since it joined are added when it leaves.
    """

    __slots__ = (
        "arrival_s",
        "base_computed",
        "base_generated",
        "base_step",
        "cohort",
        "cohort_base",
        "epoch",
        "finish_step",
        "first_token_s",
        "hashes",
        "is_aborted",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_generated",
        "num_output_tokens",
        "num_pinned_blocks",
        "num_preemptions",
        "num_private_alloc_tokens",
        "num_prompt_tokens",
        "queue_s",
        "request",
        "tag",
        "target_tokens",
    )

    def __init__(
        self,
        request: Request,
        arrival_s: float,
        tag: object = None,
        num_output_tokens: int | None = None,
    ) -> None:
        """``num_output_tokens``: the tokens this answer will have (the truth, which the
        simulator keeps off the request routers read); None: the request's own count (the
        emulator's requests carry their length)."""
        self.request = request
        self.arrival_s = arrival_s
        self.tag = tag
        self.hashes = request.block_hashes
        self.num_prompt_tokens = request.num_prompt_tokens
        if num_output_tokens is None:
            num_output_tokens = request.num_output_tokens
        elif num_output_tokens < 1:
            raise ValueError(
                f"request {request.request_id!r}: num_output_tokens must be >= 1, "
                f"got {num_output_tokens}"
            )
        self.num_output_tokens = num_output_tokens
        # an engine always computes at least one prompt token before sampling
        self.target_tokens = max(1, request.num_prompt_tokens)
        self.num_computed_tokens = 0
        self.num_generated = 0
        self.num_pinned_blocks = 0
        self.num_private_alloc_tokens = 0
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        self.first_token_s: float | None = None
        self.queue_s: float | None = None  # arrival to first scheduled chunk
        self.is_aborted = False
        # while decoding, progress is implicit: computed = base_computed + step - base_step
        self.base_step = 0
        self.base_computed = 0
        self.base_generated = 0
        self.finish_step = 0
        self.epoch = 0
        # while decoding, the KV-block cohort (sim.decode_group) and its ``grown`` at joining
        self.cohort: Cohort | None = None
        self.cohort_base = 0
