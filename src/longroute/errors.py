"""Errors the command line reports as one message (exit 2), in a module that imports nothing.

``longroute.config`` re-exports :class:`ConfigError`; the command-line modules
import it from here so that ``longroute --help`` does not load pydantic.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says where."""


__all__ = ["ConfigError"]
