"""Errors the command line reports as one message (exit 2), in a module that imports nothing.

``longroute.config`` re-exports :class:`ConfigError`; the command-line modules
import it from here so that ``longroute --help`` does not load pydantic.
"""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says where."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'default'?)`` for a close match among ``valid``, else ``""``."""
    import difflib

    hint = difflib.get_close_matches(name, list(valid), n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def yaml_error_message(source: object, exc: BaseException) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: <problem>`` for a PyYAML error (never the
    parser's ``"<unicode string>"``)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(source)
    detail = f"{problem} ({context})" if context else problem
    return f"{where}: not valid YAML: {detail}"


__all__ = ["ConfigError", "did_you_mean", "yaml_error_message"]
