"""The gateway's secrets: backend, client and admin API keys, read from the environment
variables and key files the config names, at start-up and at each reload, never per
request. The key files' contents never reach a message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from longroute.config import ConfigError

if TYPE_CHECKING:
    from longroute.gateway.config import GatewayConfig


@dataclass(frozen=True, slots=True)
class GatewaySecrets:
    """Keys read from the environment and key files, at start-up and at each reload."""

    backend_api_keys: dict[str, str]
    client_api_keys: frozenset[str] | None
    admin_api_key: str | None = None


def resolve_secrets(config: GatewayConfig) -> GatewaySecrets:
    """Read the API keys named in ``config`` (variables and files); every named but unset
    (or empty) variable and every unreadable or empty file is reported at once, in one
    ConfigError, so a deployment is fixed in one pass."""
    wanted = [
        (b.api_key_env, f"backend {b.name!r} api_key_env")
        for b in config.backends
        if b.api_key_env is not None
    ]
    if config.client_api_keys_env is not None:
        wanted.append((config.client_api_keys_env, "client_api_keys_env"))
    if config.admin_api_key_env is not None:
        wanted.append((config.admin_api_key_env, "admin_api_key_env"))
    values = {name: os.environ.get(name, "").strip() for name, _ in wanted}
    missing = [f"{name} ({what})" for name, what in wanted if not values[name]]
    files: dict[str, list[str]] = {}
    bad_files = []
    for path in [b.api_key_file for b in config.backends] + [config.client_api_keys_file]:
        if path is not None and path not in files:
            keys = _read_key_file(path)
            files[path] = keys if isinstance(keys, list) else []
            if isinstance(keys, str):
                bad_files.append(keys)
    problems = []
    if missing:
        problems.append(
            f"environment variable(s) not set or empty: {', '.join(missing)}; "
            "export them before `longroute serve`"
        )
    if bad_files:
        problems.append(f"key file(s) unusable: {', '.join(bad_files)}")
    if problems:
        raise ConfigError("; ".join(problems))
    backend_keys = {
        b.name: values[b.api_key_env] for b in config.backends if b.api_key_env is not None
    }
    backend_keys |= {
        b.name: files[b.api_key_file][0] for b in config.backends if b.api_key_file is not None
    }
    client_keys: set[str] | None = None
    if config.client_api_keys_env is not None:
        raw = values[config.client_api_keys_env]
        client_keys = {k.strip() for k in raw.split(",") if k.strip()}
    if config.client_api_keys_file is not None:
        client_keys = (client_keys or set()) | set(files[config.client_api_keys_file])
    admin = values[config.admin_api_key_env] if config.admin_api_key_env is not None else None
    return GatewaySecrets(
        backend_keys, None if client_keys is None else frozenset(client_keys), admin
    )


MAX_KEY_FILE_BYTES = 1024 * 1024


def _read_key_file(path: str) -> list[str] | str:
    """The keys of a key file (one per line, blank lines and # comments skipped), or what
    is wrong with it (never its content)."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(MAX_KEY_FILE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} ({type(exc).__name__}: {getattr(exc, 'strerror', None) or 'unreadable'})"
    if len(text) > MAX_KEY_FILE_BYTES:
        return f"{path} (larger than {MAX_KEY_FILE_BYTES} bytes)"
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        return f"{path} (no key in it)"
    return keys
