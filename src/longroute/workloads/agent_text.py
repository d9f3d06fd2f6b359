"""Prompt text of ``agent-workflows``: role instructions, stage prompts, token counts.

Used by :mod:`longroute.workloads.agent_workflows` while it builds a workload. The
system prompt of a role is one fixed text per (dataset, role), shared by every request
of that role (so its blocks are a shared prefix); the user part names the stage's job,
the workflow and the task statement (:mod:`.agent_tasks`), then one marker line per
earlier stage ("Plan from the planner: ..."): the earlier outputs themselves are not in
the text, the simulator adds their tokens. Token counts are ``ceil(chars / 4)``, the
English average the other generators use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

from longroute.workloads.agent_models import APPS, MATH, WorkflowKind

CHARS_PER_TOKEN = 4
T = TypeVar("T")


class Picker:
    """Choices driven by a row of uniforms drawn in advance (one numpy call per workload).

    A row that runs out wraps around: the text draws of one workflow stay a function of
    its row, whatever the templates ask for.
    """

    __slots__ = ("_index", "_uniforms")

    def __init__(self, uniforms: Sequence[float]) -> None:
        if not uniforms:
            raise ValueError("Picker needs at least one uniform")
        self._uniforms = uniforms
        self._index = 0

    def uniform(self) -> float:
        value = self._uniforms[self._index % len(self._uniforms)]
        self._index += 1
        return value

    def pick(self, options: Sequence[T]) -> T:
        return options[min(int(self.uniform() * len(options)), len(options) - 1)]

    def integer(self, low: int, high: int) -> int:
        """A uniform integer in [low, high]."""
        return low + min(int(self.uniform() * (high - low + 1)), high - low)

    def chance(self, probability: float) -> bool:
        return self.uniform() < probability


def count_tokens(text: str) -> int:
    """Tokens of ``text``: ``ceil(len(text) / CHARS_PER_TOKEN)``."""
    return -(-len(text) // CHARS_PER_TOKEN)


_COMMON = (
    "You are one agent in a team of language-model agents that solve a task together. "
    "Each agent sees the task statement and the messages of the agents before it. "
    "Be precise and do not repeat earlier messages. Think about edge cases before you "
    "answer, and keep your reply focused on your own role. "
)
_SYSTEM: Mapping[tuple[str, str], str] = MappingProxyType({
    (APPS, "planner"): _COMMON + (
        "Your role is the planner for programming problems. Read the problem statement, "
        "identify the input format, the output format and the constraints, and write a short "
        "numbered plan: the algorithm, the data structures, the time and memory complexity, "
        "and the corner cases the coder must handle (empty input, the largest n, equal "
        "values, overflow). Do not write code. Keep the plan under fifteen lines."
    ),
    (APPS, "coder"): _COMMON + (
        "Your role is the coder. Write a complete Python 3 program that reads from standard "
        "input and writes to standard output exactly in the required format. Follow the "
        "plan if there is one; if a QA report is given, fix every problem it lists. Use fast "
        "input reading (sys.stdin) for large inputs and avoid recursion deeper than a few "
        "thousand calls. Return only the program in one ```python code block."
    ),
    (APPS, "qa"): _COMMON + (
        "Your role is the QA agent. Check the coder's program against the statement: trace "
        "it on the examples, on the smallest and the largest inputs and on tricky cases, "
        "and estimate its running time under the constraints. List every bug, wrong output "
        "format and time-limit risk you find, each with a failing input when you can. End "
        "with PASS if you found nothing, else FAIL."
    ),
    (MATH, "planner"): _COMMON + (
        "Your role is the planner for competition mathematics. Read the problem, name the "
        "area (algebra, geometry, number theory, counting and probability, precalculus), "
        "recall the facts and theorems that apply and write a short numbered plan of the "
        "solution. Do not carry out long computations and do not state a final answer."
    ),
    (MATH, "solver"): _COMMON + (
        "Your role is the solver. Solve the problem step by step, showing the key "
        "computations, and follow the plan if there is one; if a verifier report is given, "
        "correct every error it points out. Simplify the result completely (common "
        "fractions, simplest radical form, exact values) and put the final answer in "
        "\\boxed{}."
    ),
    (MATH, "verifier"): _COMMON + (
        "Your role is the verifier. Check the solver's solution line by line: the setup, "
        "every algebraic step, the case analysis and the final simplification. Where you "
        "can, confirm the answer another way (substitution, a small case, an estimate). "
        "List each error with the corrected step. End with CORRECT or INCORRECT."
    ),
})  # fmt: skip

_ROLE_JOB: Mapping[tuple[str, str], str] = MappingProxyType({
    ("planner", "first"): "Write a plan for the following problem.",
    ("coder", "first"): "Solve the following problem in Python 3.",
    ("coder", "after-plan"): "Implement the plan below for the following problem.",
    ("coder", "after-review"): "Revise your program using the QA report below.",
    ("qa", "review"): "Review the program below for the following problem.",
    ("solver", "first"): "Solve the following problem.",
    ("solver", "after-plan"): "Solve the following problem following the plan below.",
    ("solver", "after-review"): "Revise your solution using the verifier's report.",
    ("verifier", "review"): "Verify the solution below to the following problem.",
})  # fmt: skip
_PRODUCED = MappingProxyType({
    "planner": "Plan from the planner",
    "coder": "Program from the coder",
    "qa": "QA report",
    "solver": "Solution from the solver",
    "verifier": "Verifier's report",
})  # fmt: skip


def system_prompt(dataset: str, role: str) -> str:
    """The fixed instructions of ``role`` on ``dataset``; ``KeyError`` if there are none."""
    return _SYSTEM[dataset, role]


def _job(kind: WorkflowKind, stage_index: int) -> str:
    role = kind.roles[stage_index]
    if role in ("qa", "verifier"):
        situation = "review"
    elif stage_index == 0:
        situation = "first"
    elif kind.roles[stage_index - 1] == "planner":
        situation = "after-plan"
    else:
        situation = "after-review"
    return _ROLE_JOB[role, situation]


def user_prompt(kind: WorkflowKind, stage_index: int, statement: str) -> str:
    """The user part of stage ``stage_index`` (0-based): job, workflow, task, markers."""
    lines = [
        _job(kind, stage_index),
        f"Workflow: {' -> '.join(kind.roles)} (stage {stage_index + 1} of {kind.num_stages}).",
        "",
        statement,
    ]
    for earlier, role in enumerate(kind.roles[:stage_index], start=1):
        lines.append(f"{_PRODUCED[role]} (stage {earlier}): [attached above]")
    return "\n".join(lines)
