"""Shared by the tests of benchmark scripts: import one from benchmarks/ as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(filename: str, name: str | None = None) -> ModuleType:
    """``benchmarks/filename`` as module ``name`` (its stem by default), registered in
    ``sys.modules``; benchmarks/ goes on ``sys.path`` as running the script puts it, so
    its own imports of the shared ``_eval`` and ``_ttca_*`` helpers resolve."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    path = BENCHMARKS / filename
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
