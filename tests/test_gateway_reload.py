"""Hot reload in process: each kind of change, what stays, and what is refused.

The gateway is started from a YAML file; each test rewrites the file and calls
``POST /admin/reload`` (with the admin key), then looks at routing, the fleet
view, the admission slots, the metrics and the log.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp.test_utils import TestServer

from longroute.gateway import Gateway, serve_gateway
from longroute.gateway.config import load_gateway_config
from longroute.gateway.secrets import resolve_secrets
from test_gateway import MODEL, TEST_TIMEOUT_S, FakeBackend, Knobs, eventually, sse_events

ADMIN_KEY = "admin-key-7c1e9a0b3d5f"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@contextmanager
def _admin_env() -> Iterator[None]:
    os.environ["LR_TEST_ADMIN"] = ADMIN_KEY
    try:
        yield
    finally:
        os.environ.pop("LR_TEST_ADMIN", None)


@dataclass
class Reloadable:
    """A gateway started from ``path``, its backends' URLs by name, and a client."""

    path: Path
    url: str
    gateway: Gateway
    http: aiohttp.ClientSession
    urls: dict[str, str]
    base: dict[str, Any]

    def write(self, backends: list[str], **changes: Any) -> None:
        config = {
            **self.base,
            "backends": [{"name": n, "url": self.urls[n], "model": MODEL} for n in backends],
            **changes,
        }
        self.path.write_text(yaml.safe_dump(config))

    async def reload(self, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        async with self.http.post(self.url + "/admin/reload", headers=headers or ADMIN) as r:
            return r.status, await r.json()

    async def chat(
        self, content: str = "hi", *, headers: dict[str, str] | None = None, **extra: Any
    ) -> tuple[int, dict[str, str], bytes]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            return response.status, dict(response.headers), await response.read()


@asynccontextmanager
async def reloadable(
    tmp_path: Path, backends: dict[str, FakeBackend], first: list[str], **base: Any
) -> AsyncIterator[Reloadable]:
    async with AsyncExitStack() as stack:
        urls = {}
        for name, backend in backends.items():
            server = TestServer(backend.app(), host="127.0.0.1")
            await server.start_server()
            stack.push_async_callback(server.close)
            urls[name] = str(server.make_url("")).rstrip("/")
        settings = {
            "health": {"interval_s": 30.0, "timeout_s": 1.0},
            "rtt_probe_interval_s": None,
            "scrape_interval_s": None,
            "admin_enabled": True,
            "admin_api_key_env": "LR_TEST_ADMIN",
            **base,
        }
        path = tmp_path / "gateway.yaml"
        state = Reloadable(path, "", None, None, urls, settings)  # type: ignore[arg-type]
        state.write(first)
        config = load_gateway_config(path)
        running = await stack.enter_async_context(
            serve_gateway(config, resolve_secrets(config), port=0, config_path=path)
        )
        state.url, state.gateway = running.url, running.gateway
        state.http = await stack.enter_async_context(aiohttp.ClientSession())
        yield state


def run(coro: Any) -> None:
    with _admin_env():
        asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))


# ---- backends ------------------------------------------------------------------------------------


def test_adding_a_backend_keeps_what_the_others_learned(tmp_path: Path) -> None:
    async def body() -> None:
        a, b = FakeBackend("a"), FakeBackend("b")
        async with reloadable(
            tmp_path, {"a": a, "b": b}, ["a"], router={"name": "prefix-cache"}
        ) as g:
            for i in range(4):
                assert (await g.chat("shared prefix " * 50 + str(i)))[0] == 200
            fleet = g.gateway.fleet
            blocks = fleet.prefix_index.num_blocks("a")
            fleet.set_rtt("a", 12.5)
            router = g.gateway.router
            g.write(["a", "b"], router={"name": "prefix-cache"})
            status, result = await g.reload()
            assert status == 200 and result["changes"] == ["backend b added (model tiny-llama)"]
            assert fleet.prefix_index.num_blocks("a") == blocks > 0
            assert fleet.state("a").rtt_ms == 12.5
            assert g.gateway.router is router  # its config did not change: the same object
            for i in range(6):  # a new prefix each: prefix-cache spreads them
                await g.chat(f"other {i} " * 60)
            assert b.bodies and fleet.prefix_index.num_blocks("b") > 0

    run(body())


def test_removing_a_backend_lets_its_stream_finish_then_forgets_it(tmp_path: Path) -> None:
    async def body() -> None:
        a = FakeBackend("a", Knobs(num_chunks=10, chunk_delay_s=0.1))
        b = FakeBackend("b")
        async with reloadable(tmp_path, {"a": a, "b": b}, ["a", "b"]) as g:
            stream = asyncio.create_task(g.chat("long", stream=True))
            await eventually(lambda: len(a.bodies) == 1)
            g.write(["b"])
            status, result = await g.reload()
            assert status == 200
            assert result["changes"] == ["backend a removed (its requests in flight finish there)"]
            after = [await g.chat(f"q{i}") for i in range(3)]
            code, _, streamed = await stream
            gateway = g.gateway
            await eventually(lambda: "a" not in gateway.admission._capacity, timeout_s=3.0)
            text = gateway.metrics.render().decode()
        assert code == 200 and sse_events(streamed)[-1] == "[DONE]"
        assert len(sse_events(streamed)) == 11  # every chunk, then [DONE]
        assert all(s == 200 for s, _, _ in after) and len(b.bodies) == 3 and len(a.bodies) == 1
        assert [e.name for e in gateway.fleet.endpoints] == ["b"]
        assert 'endpoint="a"' not in text.split("longroute_backend_inflight_requests", 1)[1][:400]

    run(body())


def test_changing_router_parameters_adopts_the_queued_work(tmp_path: Path) -> None:
    async def body() -> None:
        a = FakeBackend("a", Knobs(delay_s=0.5))
        b = FakeBackend("b", Knobs(delay_s=0.5))
        gorgo = {"name": "gorgo", "params": {"rtt_weight": 1.0, "queue_weight": 0.5}}
        async with reloadable(tmp_path, {"a": a, "b": b}, ["a", "b"], router=gorgo) as g:
            slow = asyncio.create_task(g.chat("x" * 800))
            await eventually(lambda: len(a.bodies) + len(b.bodies) == 1)
            old = g.gateway.router
            queued = dict(old.queued_tokens)  # type: ignore[attr-defined]
            g.write(
                ["a", "b"], router={**gorgo, "params": {"rtt_weight": 2.0, "queue_weight": 1.5}}
            )
            status, result = await g.reload()
            new = g.gateway.router
            assert status == 200 and "router.params.queue_weight changed" in result["changes"]
            assert new is not old and new.get_weights() == {  # type: ignore[attr-defined]
                "rtt_weight": 2.0,
                "queue_weight": 1.5,
            }
            assert new.queued_tokens == queued and sum(queued.values()) > 0  # type: ignore[attr-defined]
            assert g.gateway.admission.router is new and g.gateway.proxy.wiring.router is new
            assert (await slow)[0] == 200
            assert sum(new.queued_tokens.values()) == 0  # type: ignore[attr-defined]

    run(body())


# ---- keys ----------------------------------------------------------------------------------------


def test_client_keys_from_a_file_are_added_and_revoked(tmp_path: Path) -> None:
    async def body() -> None:
        keys = tmp_path / "keys.txt"
        keys.write_text("# clients\nk-one\nk-old\n")
        a = FakeBackend("a")
        async with reloadable(tmp_path, {"a": a}, ["a"], client_api_keys_file=str(keys)) as g:
            bearer = lambda key: {"Authorization": f"Bearer {key}"}  # noqa: E731
            before = [(await g.chat(headers=bearer(k)))[0] for k in ("k-one", "k-old", "k-new")]
            keys.write_text("k-one\nk-new\n")
            g.write(["a"], client_api_keys_file=str(keys))
            assert (await g.reload())[0] == 200
            after = [(await g.chat(headers=bearer(k)))[0] for k in ("k-one", "k-old", "k-new")]
        assert before == [200, 200, 401] and after == [200, 401, 200]

    run(body())


# ---- refusals ------------------------------------------------------------------------------------


def test_an_invalid_config_changes_nothing_and_says_why(tmp_path: Path) -> None:
    async def body() -> None:
        a = FakeBackend("a")
        async with reloadable(tmp_path, {"a": a}, ["a"]) as g:
            wiring = g.gateway.wiring
            cases = {}
            g.write(["a"], router={"name": "no-such-router"})
            cases["router"] = await g.reload()
            g.path.write_text("backends: [unclosed\n")
            cases["yaml"] = await g.reload()
            g.write(["a"], listen={"host": "0.0.0.0", "port": 9999})
            cases["restart"] = await g.reload()
            g.write(["a"], client_api_keys_env="LR_TEST_UNSET_VARIABLE")
            cases["secret"] = await g.reload()
            refused_without_key = await g.reload({"Authorization": "Bearer wrong"})
            served = await g.chat()
            errors = g.gateway.metrics.reloads.labels("error")._value.get()
            assert g.gateway.wiring is wiring
        for name, (status, answer) in cases.items():
            assert status == 400, name
            assert answer["error"]["code"] == "invalid_config"
        assert "no-such-router" in cases["router"][1]["error"]["message"]
        assert "listen cannot change on a reload" in cases["restart"][1]["error"]["message"]
        assert "LR_TEST_UNSET_VARIABLE" in cases["secret"][1]["error"]["message"]
        assert refused_without_key[0] == 401
        assert served[0] == 200 and errors == 4.0

    run(body())


def test_reload_needs_the_admin_key(tmp_path: Path) -> None:
    async def body() -> None:
        a = FakeBackend("a")
        async with reloadable(tmp_path, {"a": a}, ["a"], admin_api_key_env=None) as g:
            status, answer = await g.reload({})
        assert status == 403 and answer["error"]["code"] == "admin_key_not_configured"

    run(body())


def test_an_unchanged_reload_reopens_the_access_log(tmp_path: Path) -> None:
    async def body() -> None:
        log = tmp_path / "access.jsonl"
        a = FakeBackend("a")
        access = {"path": str(log), "flush_interval_s": 0.05}
        async with reloadable(tmp_path, {"a": a}, ["a"], access_log=access) as g:
            await g.chat()
            await eventually(lambda: log.exists() and log.read_text().count("\n") == 1)
            log.rename(tmp_path / "access.jsonl.1")  # logrotate
            status, result = await g.reload()
            await g.chat()
            await eventually(lambda: log.exists() and log.read_text().count("\n") == 1)
        assert status == 200 and result["changes"] == []
        assert json.loads(log.read_text())["status"] == 200

    run(body())


def test_what_a_reload_does_not_change_keeps_its_state(tmp_path: Path) -> None:
    async def body() -> None:
        a, b = FakeBackend("a"), FakeBackend("b")
        reuse = {"enabled": True}
        async with reloadable(tmp_path, {"a": a, "b": b}, ["a"], context_reuse=reuse) as g:
            context, router = g.gateway.wiring.context, g.gateway.router
            lengths = g.gateway.wiring.requests.lengths  # what answers taught of lengths
            g.write(["a", "b"], context_reuse=reuse)
            assert (await g.reload())[0] == 200
            assert g.gateway.wiring.context is context and g.gateway.router is router
            assert g.gateway.wiring.requests.lengths is lengths
            g.write(["a", "b"], context_reuse={**reuse, "max_documents": 8})
            assert (await g.reload())[0] == 200
            assert g.gateway.wiring.context is not context
            assert g.gateway.wiring.context is not None

    run(body())
