"""Re-fit the correctness skills of ``agent-workflows`` (``agent_models.MODELS``).

Each (model, dataset) skill is found by bisection so that the share of workflows the
model answers right lands on ``SCORE_TARGETS``: 10^5 workflows (seed 0, default
knobs), the tasks drawn once and the outcomes re-drawn on them with the same random
stream for every trial skill, so the share is monotone in the skill. Run it after
changing a constant that moves the scores (difficulty, topic offsets or gains, the
correctness copula, runaways) and paste the printed skills into ``MODELS``.

    python scripts/fit_agent_models.py [--num-workflows 100000]

The output lengths do not depend on the skill and are not re-fitted here.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from types import MappingProxyType

import numpy as np

from longroute.workloads.agent_draws import draw_outcomes
from longroute.workloads.agent_models import DATASETS, MODELS, SCORE_TARGETS
from longroute.workloads.agent_workflows import (
    DEFAULT_MAX_TOTAL_OUTPUT_TOKENS,
    DEFAULT_STAGE_MIX,
    draw_tasks,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workflows", type=int, default=100_000)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="skill logits")
    args = parser.parse_args()
    if args.num_workflows < 1000:
        parser.error(f"--num-workflows must be >= 1000 to fit a share, got {args.num_workflows}")
    if not 0 < args.tolerance < 1:
        parser.error(f"--tolerance must be in (0, 1) logits, got {args.tolerance}")

    rng = np.random.default_rng(0)
    kinds, levels, tasks = draw_tasks(rng, args.num_workflows, DATASETS, DEFAULT_STAGE_MIX)
    state = rng.bit_generator.state
    cap = DEFAULT_MAX_TOTAL_OUTPUT_TOKENS

    def score(model: str, dataset: str, skill: float) -> float:
        params = MODELS[model]
        skills = dict(params.skill) | {dataset: skill}
        trial = dataclasses.replace(params, skill=MappingProxyType(skills))
        stream = np.random.default_rng()
        stream.bit_generator.state = state
        draws = draw_outcomes(stream, kinds, levels, tasks, [trial], cap)
        flags = [c[model] for c, k in zip(draws.is_correct_by_model, kinds, strict=True)
                 if k.dataset == dataset]  # fmt: skip
        return float(np.mean(flags))

    fitted: dict[str, dict[str, float]] = {}
    for model in MODELS:
        for dataset in DATASETS:
            target = SCORE_TARGETS[model][dataset]
            low, high = -8.0, 8.0
            while high - low > args.tolerance:
                mid = (low + high) / 2
                low, high = (mid, high) if score(model, dataset, mid) < target else (low, mid)
            skill = (low + high) / 2
            fitted.setdefault(model, {})[dataset] = skill
            print(f"{model:14s} {dataset:5s} skill {skill:+.3f} "
                  f"score {score(model, dataset, skill):.4f} (target {target})",
                  file=sys.stderr, flush=True)  # fmt: skip
    for model, skills in fitted.items():
        print(f"{model}: ({skills[DATASETS[0]]:.3f}, {skills[DATASETS[1]]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
