"""``longroute simulate --list``: every scenario, router, workload and profile, a line each.

Each name comes with one line on what it is: a scenario's ``description``
(first sentence), a registry's ``describe`` (routers, workloads), a profile's
shape (models) or datasheet figures (GPUs). Lines are cut to fit
:data:`MAX_WIDTH` columns (or a narrower terminal), so a long description
never wraps under the next name.

The listing imports no router, workload or simulator module: those bring numpy,
scipy and pydantic, several times the cost of the listing itself. Routers and
workloads are listed from :data:`ROUTER_DESCRIPTIONS` and :data:`WORKLOAD_DESCRIPTIONS`, and
tests/test_cli_imports.py checks them against ``ROUTERS`` and ``WORKLOADS``;
scenarios and profiles are read from their YAML files, as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from importlib import resources

from rich.console import Console
from rich.text import Text

#: widest line printed, whatever the terminal
MAX_WIDTH = 100
_INDENT = "  "
_GAP = 2
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_HF_ID = re.compile(r"[A-Za-z][\w.-]*/[\w.-]+")


#: name -> ``ROUTERS.describe(name)``, for every built-in router
ROUTER_DESCRIPTIONS: dict[str, str] = {
    "aibrix-prefix-cache": (
        "AIBrix's prefix-cache routing: cached prefix, unless the load is unbalanced"
    ),
    "chimera": "Chimera: the most confident model within a latency slack of the fastest",
    "gorgo": "GORGO: least cost over network distance, uncached prefill and queued work",
    "laar": "LAAR: least expected time to a correct answer, latency over accuracy (L/Q)",
    "least-load": "Picks the candidate with the fewest queued tokens.",
    "least-request": "Picks the candidate with the fewest router-dispatched requests in flight.",
    "load-aware": "Picks among the endpoints with the shortest engine queue, uniformly at random.",
    "ltr": "vLLM's load balancer plus learning-to-rank shortest job first",
    "mlfq": "vLLM's load balancer plus multi-level feedback queues by attained service",
    "oracle-sjf": "Simulator only: vllm-lb with the request's true output length as priority",
    "oracle-stjf": "Simulator only: vllm-lb with the true remaining workflow output as priority",
    "prefix-cache": (
        "Sends a prompt where its prefix is cached, unless the fleet is out of balance."
    ),
    "random": "Picks a healthy candidate uniformly at random from the injected RNG.",
    "round-robin": "Cycles over the candidates in fleet order, one cursor per requested model.",
    "session-affinity": "Keeps a session on one endpoint with a consistent-hash ring.",
    "ttca": "The least expected time to a correct answer, everything priced in seconds",
    "vllm-lb": "vLLM's load balancer: least weighted sum of waiting and running requests",
}
#: name -> ``WORKLOADS.describe(name)``, for every built-in workload generator
WORKLOAD_DESCRIPTIONS: dict[str, str] = {
    "agent-workflows": "Multi-agent workflows (code and math, 1-4 stages) shaped after Chimera's",
    "art-chat": "Long multi-turn chat whose prefix reuse is almost all in-session",
    "blend": "Several generators' sessions in one workload (its parts)",
    "kv-lookup": "KV-lookup questions with checkable answers over lengths and languages (TTCA)",
    "long-sessions": (
        "Multi-turn sessions over a long context (agentic work, chat over long documents)."
    ),
    "medha-mix": (
        "Single-turn requests, a long_fraction of them MEDHA-SWE-like, the rest ShareGPT4-like."
    ),
    "mixed-long-short": "Short chat requests mixed with a few very long ones",
    "rag": "Retrieval-augmented queries over a shared corpus of documents",
    "short-chat": (
        "Single-turn chat requests; a shared_prefix_fraction of them start with a system prompt."
    ),
}


def scenario_names() -> list[str]:
    """The built-in scenarios, as ``longroute.sim.scenario.builtin_scenario_names`` (which
    imports the simulator) gives them: the YAML files of ``longroute/data/scenarios``."""
    folder = resources.files("longroute") / "data" / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _first_sentence(text: str) -> str:
    return _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0]


def _scenario_description(name: str) -> str:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C parser when built
    path = resources.files("longroute") / "data" / "scenarios" / f"{name}.yaml"
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    description = data.get("description") if isinstance(data, dict) else None
    return _first_sentence(description) if isinstance(description, str) else ""


def _count(value: float) -> str:
    return f"{value / 1e9:.1f}B" if value >= 1e9 else f"{value / 1e6:.0f}M"


def _tokens(count: int) -> str:
    return f"{count / 2**20:g}M" if count >= 2**20 else f"{count // 1024}K"


def _model_description(name: str) -> str:
    from longroute.estimators.profiles import load_model_profile

    m = load_model_profile(name)
    text = f"{_count(m.num_params)} params"
    if m.is_moe:
        text += f" ({_count(m.num_active_params)} active, {m.num_experts} experts)"
    text += f", {m.num_layers} layers, {m.num_kv_heads} KV heads"
    if m.max_model_len_tokens is not None:
        text += f", {_tokens(m.max_model_len_tokens)} context"
    found = _HF_ID.search(m.source)  # the checkpoint it was read from, e.g. Qwen/Qwen3-32B
    return text + (f"; {found.group(0)}" if found else "")


def _hardware_description(name: str) -> str:
    from longroute.estimators.profiles import load_hardware_profile

    h = load_hardware_profile(name)
    gpu = re.split(r" datasheet|:", " ".join(h.source.split()), maxsplit=1)[0]
    return (
        f"{gpu}: {h.memory_bytes / 2**30:.0f} GiB, {h.peak_flops_per_s / 1e12:.0f} TFLOP/s "
        f"bf16, {h.memory_bandwidth_bytes_per_s / 1e12:.2f} TB/s"
    )


def list_sections() -> list[tuple[str, list[tuple[str, str]]]]:
    """(section title, [(name, one-line description)]) for everything ``--list`` shows."""
    from longroute.estimators.profiles import hardware_profile_names, model_profile_names

    def rows(names: Iterable[str], describe: Callable[[str], str]) -> list[tuple[str, str]]:
        return [(name, describe(name)) for name in names]

    return [
        ("scenarios", rows(scenario_names(), _scenario_description)),
        ("routers", list(ROUTER_DESCRIPTIONS.items())),
        ("workloads", list(WORKLOAD_DESCRIPTIONS.items())),
        ("model profiles", rows(model_profile_names(), _model_description)),
        ("hardware profiles", rows(hardware_profile_names(), _hardware_description)),
    ]


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)].rstrip() + "…"


def print_list(console: Console) -> None:
    """Every section: a bold title, then ``name  description`` lines at most MAX_WIDTH wide."""
    sections = list_sections()
    width = min(console.width, MAX_WIDTH) if console.is_terminal else MAX_WIDTH
    name_width = max(len(name) for _, rows in sections for name, _ in rows)
    room = width - len(_INDENT) - name_width - _GAP
    for i, (title, rows) in enumerate(sections):
        if i:
            console.print()
        console.print(Text(f"{title}:", style="bold"), soft_wrap=True)
        for name, description in rows:
            line = Text(_INDENT + name.ljust(name_width + _GAP), style="cyan")
            line.append(_fit(description, room))
            console.print(line, soft_wrap=True, highlight=False)


__all__ = [
    "MAX_WIDTH",
    "ROUTER_DESCRIPTIONS",
    "WORKLOAD_DESCRIPTIONS",
    "list_sections",
    "print_list",
    "scenario_names",
]
