"""benchmarks/ttca_moves.py: the forced stay it runs ttca with, and its bands, on stubs."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

from bench_modules import load_benchmark
from longroute.types import RouteDecision


def _module() -> ModuleType:
    return load_benchmark("ttca_moves.py")


class _Router:
    """What the benchmark's hook reads of ttca: route(), its weights and _last."""

    ttft_weight = 4.0
    externality_weight = 1.0

    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores
        p = SimpleNamespace(ttft_engine_s=0.1, tpot_s=0.01, externality_s=0.0)
        self._last = {e: (0, 0, p, 0.0) for e in scores}

    def route(self, request: Any, fleet: Any, now_s: float) -> RouteDecision:
        return RouteDecision(endpoint=min(self.scores, key=self.scores.__getitem__),
                             scores=dict(self.scores))  # fmt: skip


def _fleet(matched: dict[str, int]) -> Any:
    candidates = [SimpleNamespace(endpoint=SimpleNamespace(name=e)) for e in ("home", "away")]
    return SimpleNamespace(
        prefix_index=SimpleNamespace(match=lambda hashes: matched),
        candidates=lambda request: candidates,
    )


def _request(task: str | None = None, attempt: int = 1) -> Any:
    return SimpleNamespace(request_id="r", attempt=attempt, session_id="s", task=task,
                           block_hashes=(1, 2), num_output_tokens=11)  # fmt: skip


def _routed(margin: float | None, request: Any, matched: dict[str, int]) -> tuple[str, dict]:
    store: dict = {}
    router = _Router({"home": 3.0, "away": 2.0})
    _module()._prepare(store, margin)("ttca", router)
    return router.route(request, _fleet(matched), 0.0).endpoint, store


def test_a_move_gaining_less_than_the_margin_is_sent_home() -> None:
    assert _routed(1.5, _request(), {"home": 2, "away": 1})[0] == "home"
    assert _routed(0.5, _request(), {"home": 2, "away": 1})[0] == "away"  # gains 1 s


def test_only_a_chat_turns_first_attempt_with_one_home_is_forced() -> None:
    assert _routed(1.5, _request(task="kv-lookup"), {"home": 2})[0] == "away"
    assert _routed(1.5, _request(attempt=2), {"home": 2})[0] == "away"
    assert _routed(1.5, _request(), {"home": 2, "away": 2})[0] == "away"  # no single home
    assert _routed(None, _request(), {"home": 2})[0] == "away"  # plain ttca


def test_the_figures_kept_are_ttcas_own_terms() -> None:
    _, store = _routed(None, _request(), {"home": 2})
    out, chosen, figures = store[("r", 1)]
    assert (out, chosen) == (11, "away")
    ttft, tpot, t, terms = figures["home"]
    assert (ttft, tpot) == (0.1, 0.01)
    assert terms == (5.0 * 0.1, 10 * 0.01, 0.0)
    assert abs(t - sum(terms)) < 1e-12


def test_bands_of_predicted_tpot_over_typical() -> None:
    band = _module()._band
    assert [band(x) for x in (0.5, 0.8, 0.94, 1.0, 1.1, 1.2, 3.0)] == [0, 1, 1, 2, 3, 4, 4]
