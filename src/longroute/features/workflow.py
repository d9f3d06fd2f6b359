"""Features of one agent-workflow request, the same at fit time and at routing time.

Chimera's predictors (``estimators.confidence``, ``estimators.workflow_length``,
``estimators.length_rank``) read a request through :class:`WorkflowFeatures`,
built either from an offline :class:`~longroute.workloads.agent_outcomes.OutcomeRow`
(:meth:`WorkflowFeatures.from_row`, fitting) or from a live
:class:`~longroute.types.Request` (:meth:`WorkflowFeatures.from_request`,
routing). Both paths cut the text the same way (``PromptText``'s
``MAX_PROMPT_TEXT_CHARS`` per part) and count tokens the same way, so a
predictor sees at routing time exactly what it was fitted on.

A request without ``prompt`` gets empty texts: the predictors still answer,
from token counts, workflow and stage only (weaker). Pure Python, no numpy:
O(len(text)) for the token estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from longroute.types import PromptText, Request
from longroute.workloads.agent_outcomes import OutcomeRow

CHARS_PER_TOKEN = 4
"""Characters per token of :func:`approx_tokens` (English text under BPE vocabularies)."""


def approx_tokens(text: str) -> int:
    """A cheap token estimate: ``ceil(len(text) / 4)`` characters, 0 for ``""``.

    Four characters per token is the usual rule of thumb for English text under
    GPT/Llama/Qwen BPE vocabularies; it is used only for the *split* of a
    prompt's exact token count into system and user parts, so its error moves
    tokens between two features, not in or out of the total.
    """
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class WorkflowFeatures:
    """What Chimera's predictors know about one request.

    ``num_prompt_tokens`` is exact (the request's, or the row's); the system part
    is estimated by :func:`approx_tokens` and the user part is the rest
    (``max(0, num_prompt_tokens - num_system_tokens)``). ``workflow`` and
    ``stage`` are ``None`` when a request does not say them.
    """

    system_text: str
    user_text: str
    num_system_tokens: int
    num_user_tokens: int
    num_prompt_tokens: int
    workflow: str | None
    stage: int | None

    @classmethod
    def from_parts(
        cls,
        system_text: str,
        user_text: str,
        num_prompt_tokens: int,
        workflow: str | None,
        stage: int | None,
    ) -> WorkflowFeatures:
        """Features of a prompt given as its parts; texts are cut as ``PromptText`` cuts them."""
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
        prompt = PromptText(system=system_text, user=user_text)
        num_system_tokens = approx_tokens(prompt.system)
        return cls(
            system_text=prompt.system,
            user_text=prompt.user,
            num_system_tokens=num_system_tokens,
            num_user_tokens=max(0, num_prompt_tokens - num_system_tokens),
            num_prompt_tokens=num_prompt_tokens,
            workflow=workflow,
            stage=stage,
        )

    @classmethod
    def from_request(cls, request: Request) -> WorkflowFeatures:
        """Features of a live request (routing time); no ``prompt`` gives empty texts."""
        prompt = request.prompt if request.prompt is not None else PromptText()
        return cls.from_parts(
            prompt.system, prompt.user, request.num_prompt_tokens, request.workflow, request.stage
        )

    @classmethod
    def from_row(cls, row: OutcomeRow) -> WorkflowFeatures:
        """Features of an offline outcome row (fit time)."""
        return cls.from_parts(row.system, row.user, row.num_prompt_tokens, row.workflow, row.stage)

    @property
    def full_text(self) -> str:
        """System and user text, one newline apart (what the semantic router reads)."""
        return f"{self.system_text}\n{self.user_text}"
