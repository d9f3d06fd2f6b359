"""Proxy stack: the same minimal pass-through proxy on different Python server/client stacks.

Why the gateway runs its own HTTP/1.1 layer, in numbers. One run, each piece in its
own process: the fixed fast backend of ``gateway_overhead.py`` (16-token replies,
streamed as 16 SSE chunks or as one JSON body), that script's closed-loop load
client (32 clients), and in front of the backend one minimal proxy per stack:

* ``longroute-http``: the gateway's stack, :class:`longroute.gateway.http.server.HttpServer`
  (asyncio protocols + httptools) + :class:`longroute.gateway.http.upstream.UpstreamPool`
  (keep-alive HTTP/1.1 connections), on uvloop; the baseline;
* ``aiohttp``: aiohttp server + aiohttp ``ClientSession``, on uvloop (the gateway's stack
  before its own layer);
* ``starlette-httpx``: starlette on uvicorn (uvloop, httptools, no access log) + a
  pooled HTTP/1.1 ``httpx.AsyncClient``;
* ``starlette-aiohttp``: starlette on uvicorn + aiohttp ``ClientSession``;
* ``asgi-aiohttp``: a bare ASGI app on uvicorn (no framework) + aiohttp ``ClientSession``.

Every proxy does the same work: ``POST /v1/chat/completions`` reads the body, posts
it to the backend and relays the reply with its status and content type, whole for
JSON and chunk by chunk as it arrives for SSE; ``GET /health`` answers ok. Before
measuring, each proxy's replies are checked byte for byte against the backend's.

The gateway first ran aiohttp on both sides, chosen with this script over the ASGI
stacks; it moved its data path to its own layer because that layer does the same work
for less. One full run (defaults, 3 rounds, a shared 2-core machine), throughput
relative to ``longroute-http``, non-stream / stream: ``aiohttp`` 0.66x / 0.84x,
``asgi-aiohttp`` 0.79x / 0.99x, ``starlette-aiohttp`` 0.60x / 0.68x,
``starlette-httpx`` 0.09x / 0.12x; p50 added over direct 1.4 ms non-stream
(``aiohttp`` 4.5 ms) and 5.2 ms stream (``aiohttp`` 7.6 ms). Streamed, a bare ASGI app
on uvicorn with the aiohttp client is within noise of it; non-streamed, nothing is close.

The ``longroute-http`` and ``aiohttp`` stacks run on this interpreter; the others run
from their own venv under ``$LONGROUTE_ENGINE_CACHE/proxy-stack-venv`` (default
``~/.cache/longroute``), built on first use with pinned starlette, uvicorn[standard]
and httpx, and the same aiohttp and uvloop versions as this interpreter's, so the
stacks share their client.

httpx's pool is known to fall far behind aiohttp's under concurrent requests
(encode/httpx#3215); the ``starlette-aiohttp`` and ``asgi-aiohttp`` stacks separate
the server side's cost from the client's.

It prints req/s, p50/p99 latency and the p50 added over direct per stack, streamed
and not (medians of ``--repeat`` interleaved rounds), then each stack's ratios to
``longroute-http``; the last line is one JSON object.

    python benchmarks/proxy_stack.py [--seconds 5] [--repeat 3] [--concurrency 32]
                                     [--stacks longroute-http,aiohttp,...]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _harness import (
    LOAD_SCRIPT,
    MODES,
    free_port,
    measure,
    median_runs,
    scratch_dir,
    start,
    stop,
    wait_ready,
)

if TYPE_CHECKING:
    import aiohttp

CACHE = Path(os.environ.get("LONGROUTE_ENGINE_CACHE", Path.home() / ".cache" / "longroute"))
STACK_VENV = CACHE / "proxy-stack-venv"
PINNED = ("starlette==1.10.0", "uvicorn[standard]==0.54.0", "httpx==0.28.1", "httptools==0.9.0")
STACK_PACKAGES = ("starlette", "uvicorn", "httpx", "httptools")
SHARED = ("aiohttp", "uvloop")  # pinned to this interpreter's versions
STACKS = ("longroute-http", "aiohttp", "starlette-httpx", "starlette-aiohttp", "asgi-aiohttp")
LOCAL_STACKS = frozenset({"longroute-http", "aiohttp"})  # run on this interpreter
BASELINE = "longroute-http"  # the gateway's stack: the ratios are against it
CHAT_PATH = "/v1/chat/completions"
JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream"
HEALTH_BODY = b'{"status":"ok"}'


# ---- the proxies (run with --serve-proxy STACK PORT BACKEND_URL) -----------------------
def _aiohttp_session() -> aiohttp.ClientSession:
    """One pooled keep-alive session per proxy; the load client bounds concurrency."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75.0),
        timeout=aiohttp.ClientTimeout(),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def _serve_aiohttp(port: int, backend: str) -> None:
    import uvloop
    from aiohttp import web

    url = backend + CHAT_PATH
    state: dict[str, aiohttp.ClientSession] = {}

    async def session_ctx(_: web.Application) -> AsyncIterator[None]:
        state["session"] = _aiohttp_session()
        yield
        await state["session"].close()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with state["session"].post(url, data=body, headers={"Content-Type": JSON_TYPE}) as up:
            ctype = up.headers.get("Content-Type", JSON_TYPE)
            if not ctype.startswith(SSE_TYPE):
                data = await up.read()
                return web.Response(body=data, status=up.status, headers={"Content-Type": ctype})
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
            await resp.prepare(request)
            while chunk := await up.content.readany():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response(body=HEALTH_BODY, content_type=JSON_TYPE)

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post(CHAT_PATH, chat)
    app.router.add_get("/health", health)
    web.run_app(
        app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop()
    )


def _serve_longroute(port: int, backend: str) -> None:
    """HttpServer + UpstreamPool on uvloop; SIGTERM closes both."""
    import asyncio
    import signal

    import uvloop

    from longroute.gateway.http.server import HttpServer, ResponseStream
    from longroute.gateway.http.types import HttpRequest, HttpResponse
    from longroute.gateway.http.upstream import UpstreamPool

    # Content-Type is rendered once into every request's head, like the gateway's fixed headers
    pool_headers = {"Content-Type": JSON_TYPE}

    async def chat(pool: UpstreamPool, body: bytes, stream: ResponseStream) -> HttpResponse | None:
        up = await pool.request("POST", CHAT_PATH, body)
        try:
            ctype = up.headers.get("content-type", JSON_TYPE)
            if not ctype.startswith(SSE_TYPE):
                return HttpResponse(up.status, await up.read(), ctype)
            stream.start(up.status, {}, ctype)
            while chunk := await up.next_chunk():
                await stream.write(chunk)
            return None  # the server ends the stream
        finally:
            up.release()

    async def serve() -> None:
        pool = UpstreamPool(
            backend, connect_timeout_s=10.0, keepalive_s=75.0, default_headers=pool_headers
        )

        async def handle(request: HttpRequest, stream: ResponseStream) -> HttpResponse | None:
            if request.method == "POST" and request.path == CHAT_PATH:
                return await chat(pool, request.body, stream)
            if request.method == "GET" and request.path == "/health":
                return HttpResponse(200, HEALTH_BODY, JSON_TYPE)
            return HttpResponse(404, b'{"error":"not found"}', JSON_TYPE)

        server = HttpServer(handle, max_body_bytes=1 << 20, keepalive_timeout_s=75.0)
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        await server.start("127.0.0.1", port)
        await stopped.wait()
        await server.close(grace_s=1.0)
        await pool.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve())


def _starlette_httpx_app(backend: str) -> Any:
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    state: dict[str, httpx.AsyncClient] = {}
    unbounded = httpx.Limits(
        max_connections=None, max_keepalive_connections=None, keepalive_expiry=75.0
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(
            base_url=backend, http1=True, http2=False, limits=unbounded, timeout=None
        ) as client:
            state["client"] = client
            yield

    async def chat(request: Request) -> Response:
        client = state["client"]
        body = await request.body()
        req = client.build_request(
            "POST", CHAT_PATH, content=body, headers={"Content-Type": JSON_TYPE}
        )
        up = await client.send(req, stream=True)
        headers = {"Content-Type": up.headers.get("Content-Type", JSON_TYPE)}
        if headers["Content-Type"].startswith(SSE_TYPE):
            return StreamingResponse(
                up.aiter_raw(),
                status_code=up.status_code,
                headers=headers,
                background=BackgroundTask(up.aclose),
            )
        try:
            data = await up.aread()
        finally:
            await up.aclose()
        return Response(data, status_code=up.status_code, headers=headers)

    async def health(_: Request) -> Response:
        return Response(HEALTH_BODY, media_type=JSON_TYPE)

    routes = [Route(CHAT_PATH, chat, methods=["POST"]), Route("/health", health)]
    return Starlette(routes=routes, lifespan=lifespan)


def _starlette_aiohttp_app(backend: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    url = backend + CHAT_PATH
    state: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state["session"] = _aiohttp_session()
        yield
        await state["session"].close()

    async def chat(request: Request) -> Response:
        body = await request.body()
        up = await state["session"].post(url, data=body, headers={"Content-Type": JSON_TYPE})
        headers = {"Content-Type": up.headers.get("Content-Type", JSON_TYPE)}
        if not headers["Content-Type"].startswith(SSE_TYPE):
            try:
                data = await up.read()
            finally:
                up.release()
            return Response(data, status_code=up.status, headers=headers)

        async def relay() -> AsyncIterator[bytes]:
            try:
                while chunk := await up.content.readany():
                    yield chunk
            finally:
                up.release()

        return StreamingResponse(relay(), status_code=up.status, headers=headers)

    async def health(_: Request) -> Response:
        return Response(HEALTH_BODY, media_type=JSON_TYPE)

    routes = [Route(CHAT_PATH, chat, methods=["POST"]), Route("/health", health)]
    return Starlette(routes=routes, lifespan=lifespan)


def _asgi_aiohttp_app(backend: str) -> Any:
    """A bare ASGI callable: no routing framework, no middleware."""
    url = backend + CHAT_PATH
    state: dict[str, aiohttp.ClientSession] = {}
    Send = Callable[[dict[str, Any]], Any]

    async def lifespan(receive: Callable[[], Any], send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                state["session"] = _aiohttp_session()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["session"].close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def respond(send: Send, status: int, ctype: str, body: bytes) -> None:
        headers = [(b"content-type", ctype.encode()), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def chat(receive: Callable[[], Any], send: Send) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        async with state["session"].post(url, data=body, headers={"Content-Type": JSON_TYPE}) as up:
            ctype = up.headers.get("Content-Type", JSON_TYPE)
            if not ctype.startswith(SSE_TYPE):
                await respond(send, up.status, ctype, await up.read())
                return
            headers = [(b"content-type", ctype.encode())]
            await send({"type": "http.response.start", "status": up.status, "headers": headers})
            while chunk := await up.content.readany():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["method"] == "POST" and scope["path"] == CHAT_PATH:
            await chat(receive, send)
        elif scope["method"] == "GET" and scope["path"] == "/health":
            await respond(send, 200, JSON_TYPE, HEALTH_BODY)
        else:
            await respond(send, 404, JSON_TYPE, b'{"error":"not found"}')

    return app


def _serve_uvicorn(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


def _serve_proxy(stack: str, port: int, backend: str) -> None:
    if stack == "longroute-http":
        _serve_longroute(port, backend)
        return
    if stack == "aiohttp":
        _serve_aiohttp(port, backend)
        return
    apps = {
        "starlette-httpx": _starlette_httpx_app,
        "starlette-aiohttp": _starlette_aiohttp_app,
        "asgi-aiohttp": _asgi_aiohttp_app,
    }
    _serve_uvicorn(apps[stack](backend), port)


# ---- the stacks' venv ------------------------------------------------------------------
def _stack_requirements() -> list[str]:
    shared = [f"{name}=={importlib.metadata.version(name)}" for name in SHARED]
    return [*PINNED, *shared]


def _stack_python() -> Path:
    """The venv's interpreter, built or brought to the pins once (marker: ``.installed``)."""
    python = STACK_VENV / "bin" / "python"
    marker = STACK_VENV / ".installed"
    wanted = "\n".join(_stack_requirements())
    if marker.exists() and marker.read_text() == wanted and python.exists():
        return python
    print(f"installing {', '.join(_stack_requirements())} into {STACK_VENV} ...", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(STACK_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *_stack_requirements()], check=True)
    marker.write_text(wanted)
    return python


def _versions(python: Path | str, names: list[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    res = subprocess.run(
        [str(python), "-c", code, *names], check=True, capture_output=True, text=True
    )
    return dict(json.loads(res.stdout))


# ---- processes ---------------------------------------------------------------------------


def _post(url: str, is_stream: bool) -> tuple[int, str, bytes]:
    payload = json.dumps(
        {
            "model": "fast-16",
            "stream": is_stream,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "check"}],
        }
    ).encode()
    req = urllib.request.Request(url, data=payload, headers={"Content-Type": JSON_TYPE})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read()


def _check_relay(stack: str, url: str, direct_url: str) -> None:
    """Each proxy must hand back the backend's status, content type and bytes exactly."""
    for is_stream in (False, True):
        got, want = _post(url, is_stream), _post(direct_url, is_stream)
        if got != want:
            raise RuntimeError(
                f"stack {stack!r} (stream={is_stream}) relayed {got!r}, "
                f"the backend answers {want!r}"
            )


# ---- measurement ---------------------------------------------------------------------------


def _parse_stacks(text: str) -> list[str]:
    stacks = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stacks if s not in STACKS]
    if unknown or not stacks:
        raise SystemExit(f"--stacks: unknown {unknown or text!r}; valid: {', '.join(STACKS)}")
    if BASELINE not in stacks:
        stacks.insert(0, BASELINE)  # the ratios need it
    return stacks


def _run_all(args: argparse.Namespace) -> None:
    stacks = _parse_stacks(args.stacks)
    needs_venv = any(s not in LOCAL_STACKS for s in stacks)
    stack_python = _stack_python() if needs_venv else Path(sys.executable)
    versions = {
        "project": _versions(sys.executable, [*SHARED, "httptools", "longroute"]),
        "stack_venv": _versions(stack_python, [*SHARED, *STACK_PACKAGES]) if needs_venv else {},
    }
    tmp = scratch_dir("lr-proxy-stack-")
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        port = free_port()
        backend = f"http://127.0.0.1:{port}"
        log = tmp / "backend.log"
        procs.append(start([sys.executable, str(LOAD_SCRIPT), "--serve-backend", str(port)], log))
        wait_ready(f"{backend}/health", procs[-1], log)
        targets = {"direct": backend}
        for stack in stacks:
            python = sys.executable if stack in LOCAL_STACKS else str(stack_python)
            port = free_port()
            log = tmp / f"{stack}.log"
            procs.append(start([python, __file__, "--serve-proxy", stack, str(port), backend], log))
            wait_ready(f"http://127.0.0.1:{port}/health", procs[-1], log)
            _check_relay(stack, f"http://127.0.0.1:{port}{CHAT_PATH}", backend + CHAT_PATH)
            targets[stack] = f"http://127.0.0.1:{port}"
        runs: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label in targets}
        for i in range(args.repeat):  # interleaved rounds: drift hits every target alike
            print(f"round {i + 1}/{args.repeat} ...", flush=True)
            for label, base in targets.items():
                runs[label].append(measure(base + CHAT_PATH, args.seconds, args.concurrency))
        for label in targets:
            results[label] = median_runs(runs[label])
    finally:
        for proc in reversed(procs):
            stop(proc)
    _print_table(results)
    winners = _print_ratios(results)
    config = {
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "baseline": BASELINE,
    }
    summary = {"config": config, "versions": versions, "results": results, "winners": winners}
    print(json.dumps(summary, sort_keys=True))


def _print_table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    direct = results["direct"]
    for mode in MODES:
        for label, res in results.items():
            r = res[mode]
            r["added_p50_ms"] = r["p50_ms"] - direct[mode]["p50_ms"]
            print(
                f"{label:>18} {mode:>10}: {r['req_per_s']:8.0f} req/s  "
                f"p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
                f"added p50 {r['added_p50_ms']:6.2f} ms  errors {r['num_errors']:.0f}"
            )


def _print_ratios(results: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, str]]:
    """Each stack against ``BASELINE``; returns per mode the stack with the most req/s and
    the one with the least added p50."""
    base = results[BASELINE]
    stacks = [label for label in results if label != "direct"]
    winners = {}
    for mode in MODES:
        for label in stacks:
            r, b = results[label][mode], base[mode]
            r["throughput_vs_baseline"] = r["req_per_s"] / b["req_per_s"]
            r["added_p50_vs_baseline_ms"] = r["added_p50_ms"] - b["added_p50_ms"]
            print(
                f"{label:>18} {mode:>10}: throughput {r['throughput_vs_baseline']:.2f}x "
                f"{BASELINE}, added p50 {r['added_p50_ms']:.2f} ms vs {b['added_p50_ms']:.2f} ms"
            )
        winners[mode] = {
            "req_per_s": max(stacks, key=lambda label: results[label][mode]["req_per_s"]),
            "added_p50_ms": min(stacks, key=lambda label: results[label][mode]["added_p50_ms"]),
        }
        print(
            f"{mode} winner: most req/s {winners[mode]['req_per_s']}, "
            f"least added p50 {winners[mode]['added_p50_ms']}"
        )
    print("(medians of interleaved rounds; the machine is shared, so compare ratios)")
    return winners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument(
        "--stacks", default=",".join(STACKS), help=f"comma-separated, from: {', '.join(STACKS)}"
    )
    parser.add_argument(
        "--serve-proxy", nargs=3, metavar=("STACK", "PORT", "BACKEND_URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_proxy:
        stack, port, backend = args.serve_proxy
        _serve_proxy(stack, int(port), backend)
        return
    _run_all(args)


if __name__ == "__main__":
    main()
