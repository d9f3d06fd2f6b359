"""Finished cells on disk, so an interrupted or extended sweep recomputes only what is missing.

A cell's key is the SHA-256 of what determines its result: the resolved
scenario (every field, as JSON), the router, the seed the simulation uses,
the bytes of any trace or capability file the scenario reads, the longroute
version, and a digest of longroute's own source and data files (so results
computed by other code are never reused, even at the same version number).
Labels (the spec's names for the cell) are not in the key: two specs that
resolve to the same simulation share its result.

One JSON file per finished cell (``<folder>/<key[:2]>/<key>.json``), written
to a temporary name and renamed, so a cell is either wholly there or absent
(an interrupt never leaves half a file). Failed cells are not stored: a
resumed sweep tries them again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from longroute import __version__
from longroute.sweep.cell import Cell, CellResult

CACHE_FORMAT = 1
_HASHED_SUFFIXES = (".py", ".yaml", ".json", ".csv", ".jsonl")


@functools.cache
def code_digest() -> str:
    """SHA-256 over longroute's source and data files (path and bytes), computed once."""
    root = Path(str(resources.files("longroute")))
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _HASHED_SUFFIXES):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _file_digest(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None  # the run itself reports the unreadable file, with its name


def cell_key(cell: Cell) -> str:
    """The cache key of ``cell`` (64 hex characters)."""
    config = cell.config
    capability = config.capability
    material: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "version": __version__,
        "code": code_digest(),
        "scenario": config.model_dump(mode="json"),
        "router": cell.router,
        "run_seed": cell.run_seed,
        "trace": _file_digest(config.workload.trace),
        "capability_file": _file_digest(capability.file if capability is not None else None),
    }
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


class CellCache:
    """Finished cells under ``folder``; ``get`` misses quietly on a damaged file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> CellResult | None:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        metrics = data.get("metrics")
        elapsed = data.get("elapsed_s")
        if not isinstance(metrics, dict) or not isinstance(elapsed, int | float):
            return None
        return CellResult("ok", metrics, None, float(elapsed), is_cached=True)

    def put(self, key: str, cell: Cell, result: CellResult) -> None:
        """Store a successful result atomically; failed ones are not stored."""
        if not result.is_ok:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "key": key,
            "version": __version__,
            "cell": cell.labels(),
            "metrics": result.metrics,
            "elapsed_s": result.elapsed_s,
        }
        text = json.dumps(payload, sort_keys=True, allow_nan=False)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


__all__ = ["CACHE_FORMAT", "CellCache", "cell_key", "code_digest"]
