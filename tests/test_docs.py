"""The documentation keeps up with the code: every scenario key, workload and router is
documented, and the README stays a one-screen start (the site's links are checked by
``mkdocs build --strict`` in .ci/run)."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from longroute.config import ScenarioConfig
from longroute.routing.base import ROUTERS
from longroute.workloads.registry import WORKLOADS

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation holds: itself, or inside a list/optional/dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


def _field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(section, key) for every field of the scenario schema, nested ones included."""
    for name, field in model.model_fields.items():
        yield prefix or "top level", name
        for nested in _models_in(field.annotation):
            yield from _field_paths(nested, f"{prefix}.{name}" if prefix else name)


def _sections(markdown: str) -> dict[str, str]:
    """The text of each ``###`` section under the reference, by its heading."""
    parts = re.split(r"^### (.+)$", markdown, flags=re.MULTILINE)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {heading.strip("` []"): body for heading, body in pairs}


def test_every_scenario_key_is_documented_in_its_section() -> None:
    sections = _sections((DOCS / "scenarios.md").read_text(encoding="utf-8"))
    missing = []
    for section, key in _field_paths(ScenarioConfig):
        heading = {"top level": "Top level"}.get(section, section.split(".")[0])
        body = sections.get(heading, "")
        if f"| `{key}` |" not in body:
            missing.append(f"{section}: {key}")
    assert not missing, f"scenario keys missing from docs/scenarios.md: {missing}"


def test_every_workload_has_a_section_in_the_workloads_page() -> None:
    text = (DOCS / "workloads.md").read_text(encoding="utf-8")
    headings = re.findall(r"^### (.+)$", text, flags=re.MULTILINE)
    missing = [name for name in WORKLOADS.names() if not any(f"`{name}`" in h for h in headings)]
    assert not missing, f"workloads without a section in docs/workloads.md: {missing}"


def test_every_router_is_in_the_routers_table() -> None:
    text = (DOCS / "routers.md").read_text(encoding="utf-8")
    missing = [name for name in ROUTERS.names() if f"| `{name}` |" not in text]
    assert not missing, f"routers missing from docs/routers.md: {missing}"


def test_readme_is_a_one_screen_start() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    first_blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)[:2]
    assert "longroute simulate" in first_blocks[0]  # the main job on its default
    assert "pytest" in first_blocks[1]  # the tests, as CI runs them
    assert "../shared/data" not in readme.split("## Data")[0]  # examples run from a clone
