"""``longroute epp --demo``: Envoy in front of three emulated engines, longroute picking.

Starts (on loopback, ~10 s) three emulators, ``longroute epp`` with the
prefix-cache router, and a real Envoy (installed into the cache first if
missing, with its progress shown); sends one growing conversation through
Envoy, streamed and not, and a malformed request; prints which engine served
each turn and what the picker counted; stops everything. Exit 0 on success,
1 when something failed to start or a request failed, 130 on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from types import FrameType
from typing import Any, NoReturn

import aiohttp
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from longroute.headers import ENDPOINT_HEADER

EXIT_INTERRUPTED = 130
NUM_TURNS = 4
MODEL = "llama-3-8b"
_TIMEOUT = aiohttp.ClientTimeout(total=60)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def run_demo() -> int:
    from longroute.epp.envoy import EnvoyError
    from longroute.epp.envoy_binary import (
        EnvoyInstallError,
        EnvoyNotFoundError,
        find_envoy,
        install_envoy,
    )
    from longroute.epp.stack import start_epp_stack
    from longroute.launcher import Launcher, LaunchError

    out = Console(soft_wrap=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            binary = find_envoy()
        except EnvoyNotFoundError:
            out.print("[bold]Envoy is not installed yet: installing it (once)[/]")
            binary = install_envoy(lambda line: out.print(f"  {escape(line)}", highlight=False))
        out.print(f"[bold]1/3[/] starting 3 emulators, longroute epp and Envoy ({binary})...")
        started_s = time.monotonic()
        with (
            Launcher(ready_timeout_s=60.0) as launcher,
            # every answer read, so that its usage (the cached prompt tokens) is counted
            start_epp_stack(launcher, binary, speed=10.0, response_bodies="all") as stack,
        ):
            out.print(
                f"      ready in {time.monotonic() - started_s:.1f} s: Envoy {stack.url}, "
                f"picker grpc://127.0.0.1:{stack.epp_port}, metrics {stack.epp.base_url}"
            )
            out.print("[bold]2/3[/] a conversation through Envoy, the picker routing it")
            rows, refused = asyncio.run(_conversation(stack.url))
            out.print(_table(rows))
            out.print(f"      a body that is not JSON: Envoy answered {refused}")
            out.print("[bold]3/3[/] what the picker counted (its /metrics)")
            for line in asyncio.run(_metrics(stack.epp.base_url)):
                out.print(f"      {escape(line)}", highlight=False)
        ok = all(row[2] == 200 for row in rows) and len({row[3] for row in rows}) == 1
        out.print(
            "[green]every turn was answered by the same engine: its prefix cache kept the "
            "conversation[/]"
            if ok
            else "[red]the conversation was not kept on one engine, or a turn failed[/]"
        )
        out.print(
            "Run it yourself: `longroute epp --config FLEET.yaml` and "
            "`envoy -c examples/envoy-epp.yaml` (docs/envoy.md)."
        )
        return 0 if ok else 1
    except KeyboardInterrupt:
        out.print("[yellow]interrupted; everything started was stopped[/]")
        return EXIT_INTERRUPTED
    except (LaunchError, EnvoyError, EnvoyInstallError, aiohttp.ClientError, TimeoutError) as exc:
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]error:[/] {escape(str(exc) or type(exc).__name__)}", highlight=False
        )
        return 1


async def _conversation(url: str) -> tuple[list[tuple[Any, ...]], int]:
    """NUM_TURNS turns of one growing conversation (odd turns streamed); then a bad body."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a helpful assistant. " * 40},
    ]
    rows: list[tuple[Any, ...]] = []
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as http:
        for turn in range(1, NUM_TURNS + 1):
            messages.append({"role": "user", "content": f"Question {turn}: what is routing?"})
            is_stream = turn % 2 == 0
            body = {"model": MODEL, "messages": messages, "max_tokens": 16, "stream": is_stream}
            started_s = time.monotonic()
            async with http.post(url + "/v1/chat/completions", json=body) as response:
                first_s = None
                data = b""
                async for chunk in response.content.iter_any():
                    first_s = first_s or time.monotonic()
                    data += chunk
                elapsed_ms = (time.monotonic() - started_s) * 1000
                ttft_ms = ((first_s or time.monotonic()) - started_s) * 1000
                endpoint = response.headers.get(ENDPOINT_HEADER, "?")
                rows.append((turn, is_stream, response.status, endpoint, ttft_ms, elapsed_ms))
            messages.append({"role": "assistant", "content": _answer_text(data, is_stream)})
        async with http.post(
            url + "/v1/chat/completions", data=b"{not json", headers={"content-type": JSON}
        ) as response:
            refused = response.status
    return rows, refused


JSON = "application/json"


def _answer_text(data: bytes, is_stream: bool) -> str:
    """The assistant's text of a chat answer (SSE or JSON); "" when it cannot be read."""
    try:
        if not is_stream:
            return str(json.loads(data)["choices"][0]["message"]["content"])
        parts = []
        for line in data.decode().splitlines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                parts.append(delta.get("content") or "")
        return "".join(parts)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError):
        return ""


def _table(rows: list[tuple[Any, ...]]) -> Table:
    table = Table(title="one conversation through Envoy")
    for name in ("turn", "streamed", "status", "served by", "first byte ms", "total ms"):
        table.add_column(name, justify="right" if "ms" in name or name == "turn" else "left")
    for turn, is_stream, status, endpoint, ttft_ms, total_ms in rows:
        table.add_row(
            str(turn),
            "yes" if is_stream else "no",
            str(status),
            escape(endpoint),
            f"{ttft_ms:.0f}",
            f"{total_ms:.0f}",
        )
    return table


async def _metrics(metrics_url: str) -> list[str]:
    """The picker's request and prompt-token counters, one line each."""
    from prometheus_client.parser import text_string_to_metric_families

    async with (
        aiohttp.ClientSession(timeout=_TIMEOUT) as http,
        http.get(metrics_url + "/metrics") as response,
    ):
        text = await response.text()
    wanted = ("longroute_requests_total", "longroute_epp_prompt_tokens_total")
    lines = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                labels = ", ".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if v)
                lines.append(f"{sample.name}{{{labels}}} {sample.value:g}")
    return lines
