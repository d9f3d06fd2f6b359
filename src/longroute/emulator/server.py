"""The emulator's HTTP server: OpenAI-compatible endpoints over an EngineDriver.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed
as SSE or not), ``GET /v1/models``, ``GET /health``, ``GET /metrics``; with
``admin_enabled``, ``GET|POST /admin/network-delay`` (:mod:`.admin`). While
the network is down every other request loses its connection (:mod:`.outage`).

Per generation request the handler reads and validates the body, draws the
request's faults, waits half the network delay (the request travelling),
submits it to the engine, and starts the response half a delay after the
engine produced the first token (non-streamed: the last); later streamed
tokens keep that offset. Each half is the delay in force when it starts
(:class:`~longroute.emulator.network.NetworkDelay`: fixed, scheduled or set
by the admin call). Response headers are sent with the first token, so
a failure before it leaves no byte on the wire (a gateway may retry). With
an accuracy table, a KV-lookup prompt's reply starts with a right or wrong
answer (:mod:`longroute.emulator.correctness`), decided after the faults.
With ``kv_events`` the engine's prefix cache is published as vLLM's KV-cache
events (:mod:`.kv_capture`, :mod:`.kv_publisher`); with ``admin_enabled`` also
``POST /reset_prefix_cache`` (vLLM's path), which clears the cache.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from longroute.emulator.admin import (
    NETWORK_DELAY_PATH,
    RESET_PREFIX_CACHE_PATH,
    NetworkDelayAdmin,
    add_admin_routes,
    add_reset_prefix_cache_route,
)
from longroute.emulator.correctness import KvVerdict, build_judge
from longroute.emulator.engine_driver import EngineDriver, TokenStream
from longroute.emulator.faults import FaultInjector, FaultPlan, cut_connection, hang_until_gone
from longroute.emulator.kv_publisher import build_publisher
from longroute.emulator.metrics import CONTENT_TYPE, EmulatorMetrics
from longroute.emulator.network import NetworkDelay
from longroute.emulator.options import (
    PRIORITY_SCHEDULERS,
    EmulatorOptions,
    build_endpoint,
    build_engine_policies,
    build_predictor,
)
from longroute.emulator.outage import Outage, install_outage
from longroute.emulator.protocol import ApiError, ApiKind, ParsedRequest, parse_request
from longroute.emulator.responses import ReplyRenderer, usage
from longroute.headers import ATTEMPT_HEADER
from longroute.types import Request

if TYPE_CHECKING:
    from longroute.emulator.tokenizer import EngineTokenizer

MAX_BODY_BYTES = 32 * 1024 * 1024
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def _sleep_until(wall_s: float) -> None:
    delay_s = wall_s - time.monotonic()
    if delay_s > 0.0:
        await asyncio.sleep(delay_s)


def _error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


class Emulator:
    """Holds one app's engine driver, metrics and fault injector; its methods are handlers."""

    def __init__(self, options: EmulatorOptions) -> None:
        predictor = build_predictor(options)
        self.endpoint = build_endpoint(options, predictor)
        self.options = options
        self.model_name = options.model_name
        self.metrics = EmulatorMetrics(self.model_name)
        self.kv_publisher = build_publisher(options.kv_events)
        self.driver = EngineDriver(
            self.endpoint,
            predictor,
            speed=options.speed,
            prefix_block_tokens=options.prefix_block_tokens,
            observer=self.metrics,
            policies=build_engine_policies(options),
            kv_event_sink=None if self.kv_publisher is None else self.kv_publisher.publish,
        )
        self.judge = build_judge(options)
        self.tokenizer: EngineTokenizer | None = None
        if options.tokenizer_dir is not None:  # imports tokenizers and jinja2 only then
            from longroute.emulator.tokenizer import load_engine_tokenizer

            self.tokenizer = load_engine_tokenizer(
                options.tokenizer_dir, options.prefix_block_tokens
            )
        self.faults = FaultInjector(
            error_rate=options.error_rate,
            hang_rate=options.hang_rate,
            crash_rate=options.crash_rate,
            crash_after_tokens=options.crash_after_tokens,
            seed=options.seed,
        )
        # the delay is in emulated time, like everything else the emulator times
        self.network = NetworkDelay(
            options.network_delay_ms,
            options.network_delay_schedule,
            speed=options.speed,
            now_s=self.driver.now_s,
        )
        self.created = int(time.time())
        assert self.endpoint.max_model_len_tokens is not None
        self.max_model_len_tokens: int = self.endpoint.max_model_len_tokens

    # ---- lifecycle ----------------------------------------------------------
    async def on_startup(self, _: web.Application) -> None:
        if self.kv_publisher is not None:
            self.kv_publisher.start()  # a taken port fails the start
        self.driver.start()

    async def on_cleanup(self, _: web.Application) -> None:
        self.driver.close()
        if self.kv_publisher is not None:
            await asyncio.to_thread(self.kv_publisher.close)  # sends what is queued first

    async def _travel(self) -> None:
        """Half the network round trip (a request arriving or a response leaving)."""
        half_s = self.network.half_trip_wall_s()
        if half_s:
            await asyncio.sleep(half_s)

    # ---- simple endpoints (delayed too: RTT probes must see the region) ------
    async def health(self, _: web.Request) -> web.Response:
        await self._travel()
        await self._travel()
        return web.Response()

    async def models(self, _: web.Request) -> web.Response:
        await self._travel()
        await self._travel()
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "longroute-emulator",
            "root": self.options.profile,
            "parent": None,
            "max_model_len": self.max_model_len_tokens,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_page(self, _: web.Request) -> web.Response:
        await self._travel()
        self.driver.advance()
        engine = self.driver.engine
        waiting, running, kv_usage = engine.stats()
        body = self.metrics.render(waiting, running, kv_usage, engine.num_preemptions)
        await self._travel()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(ApiKind.CHAT, request)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(ApiKind.COMPLETION, request)

    # ---- generation -----------------------------------------------------------
    async def _generate(self, kind: ApiKind, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        is_priority_scheduling = self.options.scheduler in PRIORITY_SCHEDULERS
        await self._travel()
        try:
            parsed = parse_request(
                kind,
                raw,
                served_model=self.model_name,
                block_size_tokens=self.options.prefix_block_tokens,
                max_model_len_tokens=self.max_model_len_tokens,
                is_priority_scheduling=is_priority_scheduling,
                tokenizer=self.tokenizer,
            )
        except ApiError as err:
            await self._travel()
            return _error_response(err)
        self.metrics.requests_received.inc()
        marker = self.options.poison_marker
        if marker is not None and parsed.text is not None and marker in parsed.text:
            self.metrics.requests_poisoned.inc()
            await self._travel()
            message = "the engine failed on this prompt"
            poison = ApiError(500, message, error_type="internal_server_error", code="poisoned")
            return _error_response(poison)
        plan = self.faults.next_plan()
        if plan.is_error:
            await self._travel()
            message = "injected fault: the engine failed this request"
            fault = ApiError(500, message, error_type="internal_server_error", code="injected")
            return _error_response(fault)
        if plan.is_hang:
            return await hang_until_gone(request)
        try:
            verdict = self._verdict(request, parsed)
        except ApiError as err:
            await self._travel()
            return _error_response(err)
        prefix = "chatcmpl-" if kind is ApiKind.CHAT else "cmpl-"
        request_id = prefix + uuid.uuid4().hex
        engine_request = Request(
            request_id=request_id,
            arrival_s=self.driver.now_s(),
            num_prompt_tokens=parsed.prompt.num_tokens,
            num_output_tokens=parsed.num_output_tokens,
            block_hashes=parsed.prompt.block_hashes,
            block_size_tokens=self.options.prefix_block_tokens,
            model=self.model_name,
            # vLLM's priority, for the queue policies that read it (others get none)
            priority=float(parsed.priority) if is_priority_scheduling else None,
        )
        stream = self.driver.submit(engine_request, parsed.finish_reason, parsed.prompt.token_ids)
        answer = None if verdict is None else verdict.answer
        renderer = ReplyRenderer(
            kind, request_id, int(time.time()), self.model_name, parsed.prompt.key, answer
        )
        try:
            if parsed.is_stream:
                return await self._stream(request, parsed, stream, renderer, plan)
            return await self._whole(parsed, stream, renderer)
        finally:
            if self.driver.abort(stream):  # the client left early (else a no-op: it finished)
                self.metrics.requests_aborted.inc()

    def _verdict(self, request: web.Request, parsed: ParsedRequest) -> KvVerdict | None:
        """The KV-lookup verdict of a request (None: no table, or no question); counted."""
        if self.judge is None or parsed.text is None:
            return None
        verdict = self.judge.judge(
            parsed.text, parsed.prompt.num_tokens, request.headers.get(ATTEMPT_HEADER)
        )
        if verdict is not None:
            self.metrics.on_kv_answer(verdict.is_correct)
        return verdict

    def _usage(self, parsed: ParsedRequest, stream: TokenStream) -> Any:
        return usage(parsed.prompt.num_tokens, parsed.num_output_tokens, stream.num_cached_tokens)

    async def _whole(
        self, parsed: ParsedRequest, stream: TokenStream, renderer: ReplyRenderer
    ) -> web.Response:
        total = stream.num_output_tokens
        while True:
            wall_s, num_tokens = await stream.updates.get()
            if num_tokens >= total:
                break
        await _sleep_until(wall_s + self.network.half_trip_wall_s())
        body = renderer.body(total, parsed.finish_reason, self._usage(parsed, stream))
        return web.Response(body=body, content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        stream: TokenStream,
        renderer: ReplyRenderer,
        plan: FaultPlan,
    ) -> web.StreamResponse:
        total = stream.num_output_tokens
        cut_at = None if plan.crash_after_tokens is None else min(plan.crash_after_tokens, total)
        updates, network = stream.updates, self.network
        response = web.StreamResponse(headers=_SSE_HEADERS)
        num_sent = 0
        try:
            while num_sent < total:
                wall_s, num_tokens = await updates.get()
                half_delay_s = network.half_trip_wall_s()
                if half_delay_s:
                    await _sleep_until(wall_s + half_delay_s)
                else:  # everything queued is due: write it in one go
                    while not updates.empty():
                        wall_s, num_tokens = updates.get_nowait()
                chunks = b""
                if not response.prepared:
                    await response.prepare(request)
                    chunks = renderer.opening_chunk()
                if cut_at is not None and num_tokens >= cut_at:
                    await response.write(chunks + renderer.token_chunks(num_sent, cut_at))
                    cut_connection(request)
                    return response
                await response.write(chunks + renderer.token_chunks(num_sent, num_tokens))
                num_sent = num_tokens
            usage_obj = self._usage(parsed, stream) if parsed.is_usage_in_stream else None
            await response.write(renderer.closing_chunks(parsed.finish_reason, usage_obj))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left; the handler's finally aborts the sequence
        return response


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Routing and body-size errors get OpenAI-style JSON bodies too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = ApiError(exc.status, exc.reason or "error", error_type="invalid_request_error")
        return web.Response(
            status=exc.status, text=json.dumps(err.body()), content_type="application/json"
        )


EMULATOR_KEY = web.AppKey("emulator", Emulator)


def create_app(options: EmulatorOptions) -> web.Application:
    """The emulator app. Raises ProfileError/ValueError for options that cannot run
    (unknown profile, model does not fit, bad limits, a broken tokenizer folder)
    before anything starts."""
    emulator = Emulator(options)
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])
    app[EMULATOR_KEY] = emulator
    app.on_startup.append(emulator.on_startup)
    app.on_cleanup.append(emulator.on_cleanup)
    app.router.add_post("/v1/chat/completions", emulator.chat_completions)
    app.router.add_post("/v1/completions", emulator.completions)
    app.router.add_get("/v1/models", emulator.models)
    app.router.add_get("/health", emulator.health)
    app.router.add_get("/metrics", emulator.metrics_page)
    admin_paths = (NETWORK_DELAY_PATH, RESET_PREFIX_CACHE_PATH) if options.admin_enabled else ()
    outage = Outage(emulator.network, emulator.driver.wall_of, exempt_paths=admin_paths)
    install_outage(app, outage)  # after the driver's startup: the watcher reads its clock
    if options.admin_enabled:  # else no admin surface at all: /admin/* is a 404
        admin = NetworkDelayAdmin(emulator.network, emulator.driver.now_s, outage.cut_if_down)
        add_admin_routes(app, admin)
        add_reset_prefix_cache_route(app, emulator.driver.reset_prefix_cache)
    return app
