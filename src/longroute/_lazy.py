"""Lazy package exports (PEP 562): a name is imported from its module on first use.

Packages whose modules pull in heavy libraries (aiohttp, scipy) export their
public names this way, so that importing the package, or a light submodule
of it such as a command-line module, costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``table`` maps each name to its module."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)  # later lookups are plain
        return value

    return __getattr__


__all__ = ["lazy_exports"]
