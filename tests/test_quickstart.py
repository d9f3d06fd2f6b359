"""The README's quick start runs as pasted, from a copy of the repository without ``../shared``.

The commands are taken from the README itself (between its ``--8<-- [start:quickstart]``
and ``[end:quickstart]`` markers, which the docs site includes too), so the test and the
page cannot drift apart. The copy holds the files git tracks or would track (what a clone
has, plus work not yet committed) and a ``.venv`` that is the test's own environment. Only
the TCP ports change: the gateway's and the emulators' are swapped for free ones, in the
commands and in the example config, so that a busy port on the machine cannot fail it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from longroute.ports import reserved_ports

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
START, END = "--8<-- [start:quickstart]", "--8<-- [end:quickstart]"
PORTS = ("8001", "8002", "8080")
TIMEOUT_S = 600.0


def quickstart_script(readme: str) -> str:
    """The bash of the README's quick start: every fenced block between the markers."""
    start, end = readme.index(START), readme.index(END)
    blocks = re.findall(r"```bash\n(.*?)```", readme[start:end], flags=re.DOTALL)
    assert blocks, "no ```bash block between the quick-start markers"
    return "\n".join(blocks)


def _repository_files() -> list[Path]:
    """What a clone holds (tracked files) plus new files git would track."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("the quick-start test copies the repository's files with git")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [Path(name) for name in listed.split("\0") if name and (REPO / name).is_file()]


def _clone_like(root: Path) -> Path:
    clone = root / "longroute"
    for name in _repository_files():
        target = clone / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").is_file():
        (clone / ".venv").symlink_to(venv)
    else:  # not in a virtual environment: an activate script that puts this Python first
        (clone / ".venv" / "bin").mkdir(parents=True)
        bin_dir = Path(sys.executable).parent
        (clone / ".venv" / "bin" / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    return clone


def _swap_ports(text: str, ports: dict[str, str]) -> str:
    return re.sub(r"\b(" + "|".join(ports) + r")\b", lambda m: ports[m.group(1)], text)


def test_quickstart_is_between_markers_and_uses_only_the_repository() -> None:
    script = quickstart_script(README.read_text(encoding="utf-8"))
    assert "longroute simulate" in script and "longroute demo" in script
    assert "longroute serve" in script and "127.0.0.1" in script
    assert "../shared" not in script and "export " not in script  # nothing to set first


def test_readme_quickstart_runs_as_pasted_from_a_clone(tmp_path: Path) -> None:
    clone = _clone_like(tmp_path)
    assert not (tmp_path / "shared").exists()
    ports = dict(zip(PORTS, map(str, reserved_ports(len(PORTS))), strict=True))
    script = _swap_ports(quickstart_script(README.read_text(encoding="utf-8")), ports)
    config = clone / "examples" / "local-fleet.yaml"
    config.write_text(_swap_ports(config.read_text(encoding="utf-8"), ports), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGROUTE_")}
    env.update(COLUMNS="100", PYTHONUNBUFFERED="1")
    log = tmp_path / "quickstart.log"  # a file, not a pipe: the servers keep their stdout
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the background servers too, so that all can be stopped
        )
        try:
            process.wait(timeout=TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, f"the quick start failed ({process.returncode}):\n{text}"
    for expected in (
        "least-load",  # 1: the seeds table
        "mooncake",  # 2: the trace run's title
        '"status": "ready"',  # 4: the gateway's /ready
        '"object": "chat.completion"',  # 4: an answer through the gateway
    ):
        assert expected in text, f"{expected!r} not in the quick start's output:\n{text}"
    assert f"127.0.0.1:{ports['8080']}" in text, text  # 4: the bench table's target
    assert "Traceback" not in text, text
    assert any(line.startswith("report: ") for line in text.splitlines()), text
