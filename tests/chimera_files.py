"""Real fitted Chimera predictor files for gateway tests, from a small hand-made outcome set.

Two models and two kinds of workflow, three stages each:

* ``quiz/short``: "Answer in one word ..." prompts; a few tokens remain at every stage;
* ``report/long``: "Write a detailed report ..." prompts; thousands of tokens remain.

Confidence: model A answers arithmetic right and code wrong, model B the reverse, so
the router sends an arithmetic workflow to A and a code workflow to B. The files are
fitted with the library's own fits (``fit_confidence``, ``fit_length``) and written with
``save_model``, as ``longroute fit`` writes them; fitting takes about a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from longroute.workloads.agent_outcomes import OutcomeRow

MODEL_A = "model-a"
MODEL_B = "model-b"
SHORT_WORKFLOW = "quiz/short"
LONG_WORKFLOW = "report/long"
SYSTEM = "You are one agent in a team of agents. Be precise."
NUM_PROGRAMS = 24  # per (workflow kind, topic)
SHORT_REMAINING = (12, 8, 4)  # tokens left at stages 1, 2, 3
LONG_REMAINING = (3_000, 2_000, 1_000)
TOPICS = ("arithmetic", "code")


def short_prompt(topic: str, i: int) -> str:
    return f"Answer in one word: is {topic} question number {i} true or false? Reply yes or no."


def long_prompt(topic: str, i: int) -> str:
    return (
        f"Write a detailed report on {topic} problem {i}: explain every step at length, "
        "with many sections, examples, proofs and a long discussion of alternatives."
    )


def topic_text(topic: str) -> str:
    """Words that tell the confidence model which model answers right."""
    if topic == "arithmetic":
        return "Compute the sum and the product of these numbers and add them."
    return "Implement this function in Python with a loop and a dictionary."


def outcome_rows() -> list[OutcomeRow]:
    rows: list[OutcomeRow] = []
    for model in (MODEL_A, MODEL_B):
        for topic in TOPICS:
            good = (model == MODEL_A) == (topic == "arithmetic")
            for workflow, remaining, prompt in (
                (SHORT_WORKFLOW, SHORT_REMAINING, short_prompt),
                (LONG_WORKFLOW, LONG_REMAINING, long_prompt),
            ):
                for i in range(NUM_PROGRAMS):
                    is_correct = good if i % 6 else not good  # mostly, not always
                    for stage, left in enumerate(remaining, start=1):
                        output = left - (remaining[stage] if stage < len(remaining) else 0)
                        user = f"{topic_text(topic)} {prompt(topic, i)}"
                        rows.append(
                            OutcomeRow(
                                program_id=f"{workflow}-{topic}-{i}",
                                workflow=workflow,
                                dataset="test",
                                stage=stage,
                                num_stages=len(remaining),
                                model=model,
                                system=SYSTEM,
                                user=user,
                                num_prompt_tokens=(len(SYSTEM) + len(user)) // 4,
                                output_tokens=output,
                                remaining_output_tokens=left,
                                is_correct=is_correct,
                            )
                        )
    return rows


@dataclass(frozen=True, slots=True)
class PredictorFiles:
    confidence: Path
    length: Path


def fit_files(directory: Path) -> PredictorFiles:
    """Fit both predictors on :func:`outcome_rows` and save them under ``directory``."""
    from longroute.estimators.confidence import fit_confidence
    from longroute.estimators.workflow_length import fit_length
    from longroute.estimators.workflow_models import save_model

    rows = outcome_rows()
    files = PredictorFiles(directory / "confidence.joblib", directory / "length.joblib")
    save_model(fit_confidence(rows, seed=0), files.confidence)
    save_model(fit_length(rows, seed=0, num_trees=16, svd_components=8), files.length)
    return files
