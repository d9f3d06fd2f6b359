"""Task statements of ``agent-workflows``: APPS-like programming and MATH-like problems.

Called by :mod:`longroute.workloads.agent_workflows`, one statement per workflow, from a
:class:`~longroute.workloads.agent_text.Picker` (pre-drawn uniforms, so a seed fixes the
text). The difficulty level (1-5) shows in the text only partly, and noisily: the
source and difficulty words are missing or one class off now and then, the constraint
sizes and number sizes follow a level that is itself one off 30% of the time, and the
topic depends on the level only through soft weights. Each topic also carries a small
difficulty offset and output-length factor (ours), so the words say something about
both correctness and length, as in real data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from longroute.workloads.agent_text import Picker


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic: its name, the level it is typical of, its effects (difficulty logit,
    log-length), how much of a larger model's extra skill shows on it (``scale_gain``:
    correctness logits at full scale, 14B against 1.5B) and its statements, each with a
    format key (APPS: the input format)."""

    name: str
    typical_level: float
    difficulty_offset: float
    length_log_factor: float
    scale_gain: float
    setups: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class TaskText:
    """One generated task: the statement, its topic and how many optional details it has."""

    statement: str
    topic: Topic
    num_details: int


_NAMES = ("Alice", "Bob", "Vasya", "Petya", "Monocarp", "Polycarp", "Luba", "Ivan", "Tanya")
# APPS setups: (story and goal, input format key of _INPUTS)
_APPS_TOPICS = (
    Topic("strings", 1.8, -0.3, -0.15, 0.0, (
        ("{who} has a string s of length n consisting of lowercase Latin letters. In one move "
         "{who} may delete any character of s. Find the minimum number of moves needed to make "
         "s a palindrome.", "string"),
        ("You are given a string s of length n. A substring is called good if every letter "
         "occurs in it an even number of times. Count the good substrings of s.", "string"),
    )),
    Topic("sorting", 1.8, -0.3, -0.1, 0.0, (
        ("{who} has n books with thicknesses a_1, ..., a_n and wants to put them on a shelf in "
         "non-decreasing order of thickness. Find the minimum number of swaps of two books.",
         "array"),
        ("You are given an array a of n integers. Sort it, then print the number of distinct "
         "values and the median of the array.", "array"),
    )),
    Topic("simulation", 2.5, -0.1, 0.15, 0.25, (
        ("A robot stands in cell (0, 0) of an infinite grid and executes a command string s of "
         "length n made of the letters L, R, U and D. Find the number of distinct cells it "
         "visits.", "string"),
        ("There are n people in a queue at the ticket office; person i needs a_i tickets. Each "
         "second the first person buys one ticket and, if {who} still needs more, moves to the "
         "end of the queue. Report when each person leaves.", "array"),
    )),
    Topic("greedy", 3.0, 0.0, -0.05, 0.5, (
        ("{who} has n tasks; task i takes a_i minutes, and all tasks must be finished before "
         "the deadline T. Find the maximum number of tasks {who} can finish on time.", "array"),
        ("You are given n coins with values a_1, ..., a_n. Split them into two groups so that "
         "the difference of the sums is as small as possible.", "array"),
    )),
    Topic("binary search", 3.2, 0.1, 0.0, 0.75, (
        ("There are n machines; machine i makes one item every a_i seconds. Find the minimum "
         "time needed to make k items in total.", "array"),
        ("You are given an array of n integers and q queries; for each query x, find the number "
         "of elements not greater than x.", "queries"),
    )),
    Topic("number theory", 3.6, 0.25, -0.2, 1.0, (
        ("For every a_i, count the pairs (x, y) with 1 <= x, y <= a_i such that gcd(x, y) = 1 "
         "and x * y is a perfect square.", "array"),
        ("{who} writes all integers from 1 to a_i in a row, for every i. Find the sum of their "
         "digits modulo 10^9 + 7.", "array"),
    )),
    Topic("dynamic programming", 3.9, 0.35, 0.15, 1.5, (
        ("You are given an array a of n integers. Choose a subsequence with no two adjacent "
         "elements so that its sum is the largest possible and print that sum.", "array"),
        ("{who} walks on a grid of n rows and m columns from the top-left to the bottom-right "
         "cell, moving only right or down, and some cells are blocked. Count the paths modulo "
         "998244353.", "grid"),
    )),
    Topic("graphs", 4.1, 0.4, 0.25, 1.5, (
        ("The kingdom has n cities connected by m two-way roads of given lengths. For every "
         "city, find the length of the shortest route from the capital (city 1) to it.",
         "graph"),
        ("You are given a weighted undirected graph with n vertices and m edges. Find the "
         "weight of its minimum spanning tree and the number of such trees.", "graph"),
    )),
    Topic("data structures", 4.5, 0.5, 0.3, 1.25, (
        ("You are given an array of n integers and q queries of two kinds: add x to all "
         "elements on a segment, or report the minimum on a segment. Answer all queries of the "
         "second kind.", "queries"),
        ("{who} keeps an array of n integers under q operations: assign a value to one "
         "element, or count the inversions on a segment. Answer every count.", "queries"),
    )),
)  # fmt: skip
_INPUTS = {
    "array": ("The first line contains an integer n (1 <= n <= {n}).",
              "The second line contains n integers a_1, a_2, ..., a_n (1 <= a_i <= {v})."),
    "string": ("The first line contains an integer n (1 <= n <= {n}).",
               "The second line contains the string s of n characters."),
    "grid": ("The first line contains two integers n and m (1 <= n, m <= {g}).",
             "Each of the next n lines contains m characters: '.' is free and '#' is blocked."),
    "graph": ("The first line contains two integers n and m (2 <= n, m <= {n}).",
              "Each of the next m lines contains three integers u, v and w (1 <= u, v <= n, "
              "1 <= w <= {v}): an edge between u and v of weight w."),
    "queries": ("The first line contains two integers n and q (1 <= n, q <= {n}).",
                "The second line contains n integers a_1, ..., a_n (|a_i| <= {v}). Each of the "
                "next q lines describes one query as in the statement."),
}  # fmt: skip

_APPS_CLASS = ("introductory", "introductory", "interview", "interview", "competition")
_APPS_SOURCES = {
    "introductory": ("Codewars", "AtCoder Beginner Contest", "Kattis"),
    "interview": ("Codeforces Round (Div. 2)", "LeetCode", "CodeChef Starters"),
    "competition": ("Codeforces Round (Div. 1)", "AtCoder Grand Contest", "ICPC regional"),
}
_N_BOUNDS = ("100", "1000", "10^5", "2 * 10^5", "10^6")
_VALUE_BOUNDS = ("100", "1000", "10^9", "10^9", "10^18")
_GRID_BOUNDS = ("10", "50", "500", "1000", "2000")
_APPS_DETAILS = (
    "If there are several answers, print any of them.",
    "It is guaranteed that the answer always exists.",
    "Note that the answer can be large, so print it modulo 998244353.",
    "Pay attention to the time limit: a quadratic solution is too slow.",
    "Two answers are different if they differ in at least one position.",
    "The time limit is 2 seconds and the memory limit is 256 megabytes.",
    "Hacks are allowed only if both versions of the problem are solved.",
)


def _noisy_level(picker: Picker, level: int) -> int:
    """``level``, one off (either way, within 1..5) with probability 0.3."""
    if picker.chance(0.3):
        return min(max(level + (1 if picker.chance(0.5) else -1), 1), 5)
    return level


def _topic(picker: Picker, topics: Sequence[Topic], level: int) -> Topic:
    """A topic drawn with weights ``exp(-0.7 |level - typical|)``."""
    weights = [math.exp(-0.7 * abs(level - t.typical_level)) for t in topics]
    target, total = picker.uniform() * sum(weights), 0.0
    for topic, weight in zip(topics, weights, strict=True):
        total += weight
        if target < total:
            return topic
    return topics[-1]


def apps_task(picker: Picker, level: int) -> TaskText:
    """An APPS-like statement (story, goal, input and output format) for ``level`` 1-5."""
    topic = _topic(picker, _APPS_TOPICS, level)
    lines: list[str] = []
    if picker.chance(0.7):
        label = _APPS_CLASS[_noisy_level(picker, level) - 1]
        lines.append(f"Source: {picker.pick(_APPS_SOURCES[label])} ({label} problem).")
    story, inputs = picker.pick(topic.setups)
    lines.append(story.format(who=picker.pick(_NAMES)))
    size = _noisy_level(picker, level)
    num_details = min(picker.integer(0, 1) + (size - 1) // 2 + picker.integer(0, 1), 4)
    lines.extend(dict.fromkeys(picker.pick(_APPS_DETAILS) for _ in range(num_details)))
    lines.append("-----Input-----")
    has_tests = size >= 3 and picker.chance(0.5 + 0.15 * (size - 3))
    if has_tests:
        lines.append("The first line contains one integer t (1 <= t <= 10^4), the number of "
                     "test cases. Each test case is given as follows.")  # fmt: skip
    bounds = {"n": _N_BOUNDS[size - 1], "v": _VALUE_BOUNDS[size - 1], "g": _GRID_BOUNDS[size - 1]}
    lines.extend(line.format(**bounds) for line in _INPUTS[inputs])
    lines.append("-----Output-----")
    if has_tests:
        lines.append("For each test case, print the answer on a separate line.")
    else:
        lines.append(picker.pick(("Print one integer, the answer to the problem.",
                                  "Print the answer, or -1 if there is none.")))  # fmt: skip
    return TaskText("\n".join(lines), topic, num_details)


# MATH setups: (problem, answer format); {a} {b} {c} grow with the level, {s} stays small.
_MATH_TOPICS = (
    Topic("Prealgebra", 1.8, -0.4, -0.25, 0.0, (
        ("A rectangle has a perimeter of {b} units and a length of {a} units. What is its "
         "area, in square units?", ""),
        ("What is {a}% of {b}?", "Express your answer as a decimal."),
    )),
    Topic("Algebra", 2.3, -0.25, -0.15, 0.25, (
        ("If $3x + {a} = {b}$, what is the value of $6x - {c}$?", ""),
        ("What is the sum of all values of $y$ for which $y^2 - {a}y + {c} = 0$?", ""),
    )),
    Topic("Number Theory", 3.2, 0.1, 0.0, 0.75, (
        ("What is the remainder when ${a}^{{{big}}}$ is divided by {p}?", ""),
        ("Find the smallest positive integer $n$ such that ${a}n \\equiv {c} \\pmod{{{p}}}$.",
         ""),
    )),
    Topic("Counting & Probability", 3.3, 0.25, 0.1, 1.0, (
        ("How many ways are there to put {s} distinguishable balls into {t} indistinguishable "
         "boxes?", ""),
        ("Two fair {s}-sided dice are rolled. What is the probability that the sum of the "
         "numbers rolled is a multiple of {t}?", "Express your answer as a common fraction."),
    )),
    Topic("Geometry", 3.4, 0.25, 0.15, 1.5, (
        ("In triangle $ABC$, $AB = {a}$, $BC = {b}$ and $CA = {c}$. Point $D$ lies on $BC$ so "
         "that $AD$ bisects angle $BAC$. Find $BD$.", "Express your answer as a common fraction."),
        ("A right triangle has legs of length {a} and {b}. What is the radius of its inscribed "
         "circle?", "Express your answer in simplest radical form."),
    )),
    Topic("Intermediate Algebra", 3.8, 0.35, 0.2, 1.5, (
        ("Let $r$, $s$ and $t$ be the roots of $x^3 - {a}x^2 + {b}x - {c} = 0$. Compute "
         "$r^2 + s^2 + t^2$.", ""),
        ("Find the minimum value of $x^2 + \\frac{{{b}}}{{x}}$ for $x > 0$.", ""),
    )),
    Topic("Precalculus", 3.9, 0.35, 0.2, 1.25, (
        ("Find the number of solutions to $\\sin {s}x = \\cos x$ on the interval "
         "$[0, 2\\pi]$.", ""),
        ("Find the area of the triangle with vertices $(0, 0, 0)$, $({a}, {b}, 0)$ and "
         "$(0, {c}, {s})$.", "Express your answer in simplest radical form."),
    )),
)  # fmt: skip

_MATH_SOURCES = (("MATHCOUNTS", "AMC 8"), ("AMC 8", "AMC 10"), ("AMC 10", "AMC 12"),
                 ("AMC 12", "AIME"), ("AIME", "AIME"))  # fmt: skip
_AIME_ENDINGS = (
    "The answer can be written as $\\frac{m}{n}$, where $m$ and $n$ are relatively prime "
    "positive integers. Find $m + n$.",
    "Find the remainder when the answer is divided by 1000.",
)
_MATH_DETAILS = ("Assume that all the numbers involved are real.",
                 "Give an exact answer, not a decimal approximation.")  # fmt: skip
_NUMBER_RANGES = ((2, 9), (3, 20), (4, 40), (6, 90), (8, 240))
_PRIMES = (5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 97, 101)


def math_task(picker: Picker, level: int) -> TaskText:
    """A MATH-like problem statement for ``level`` 1-5 (numbers grow with the level)."""
    topic = _topic(picker, _MATH_TOPICS, level)
    lines: list[str] = []
    if picker.chance(0.65):
        lines.append(f"Source: {picker.pick(_MATH_SOURCES[_noisy_level(picker, level) - 1])}.")
    if picker.chance(0.5):
        lines.append(f"Subject: {topic.name}.")
    size = _noisy_level(picker, level)
    low, high = _NUMBER_RANGES[size - 1]
    a, b, c = (picker.integer(low, high) for _ in range(3))
    problem, answer_format = picker.pick(topic.setups)
    lines.append(problem.format(
        a=a, b=max(b, a + 1), c=c, s=picker.integer(3, 12), t=picker.integer(2, 7),
        big=picker.integer(10 * size, 400 * size), p=picker.pick(_PRIMES),
    ))  # fmt: skip
    num_details = 0
    if size >= 4 and picker.chance(0.5):
        lines.append(picker.pick(_AIME_ENDINGS))
        num_details += 1
    elif answer_format:
        lines.append(answer_format)
    if picker.chance(0.08 * size):
        lines.append(picker.pick(_MATH_DETAILS))
        num_details += 1
    return TaskText("\n".join(lines), topic, num_details)
