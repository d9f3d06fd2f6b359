"""Hand-made stand-ins for Chimera's predictors, for router and simulator tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from longroute.types import Request


class FixedConfidence:
    """q[m] from a table per model, optionally overridden per program id."""

    def __init__(
        self, q: Mapping[str, float], by_program: Mapping[str, Mapping[str, float]] | None = None
    ) -> None:
        self.q = dict(q)
        self.by_program = dict(by_program or {})
        self.num_calls = 0

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self.q))

    def scores(self, request: Request) -> dict[str, float]:
        self.num_calls += 1
        return dict(self.by_program.get(request.program_id or "", self.q))


class FixedLength:
    """ŷ = a function of the request and model (default: 100 tokens)."""

    def __init__(
        self, models: tuple[str, ...], fn: Callable[[Request, str], float] | None = None
    ) -> None:
        self._models = models
        self.fn = fn or (lambda request, model: 100.0)

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    def predict(self, request: Request, model: str) -> float:
        return self.fn(request, model)


class PromptRanker:
    """Scores a request by its prompt length (longer prompt = longer output)."""

    def score(self, request: Request) -> float:
        return float(request.num_prompt_tokens)
