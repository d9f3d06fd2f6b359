"""The endpoint picker's servers: ext_proc and gRPC health on one port, metrics on another.

:class:`EppServer` owns an :class:`~longroute.epp.picker.EndpointPicker`, a
``grpc.aio`` server carrying ``envoy.service.ext_proc.v3.ExternalProcessor``
and ``grpc.health.v1.Health`` (services ``liveness``, ``readiness`` and
``envoy.service.ext_proc.v3.ExternalProcessor``, as the inference extension's
protocol names them), an HTTP server for ``/health``, ``/ready`` and
``/metrics`` (the gateway's own HTTP layer), and the monitoring loops (health
checks, RTT probes, engine scraping).

Every stream is bounded: until its request is picked it must progress within
the config's ``http.body_timeout_s`` (a peer that stops sending is cut off),
and the whole exchange lasts at most ``admission.request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from longroute.epp.envoy import DEFAULT_MAX_BODY_BYTES
from longroute.epp.exchange import Exchange, Phase, ProtocolError, ResponseBodies
from longroute.epp.picker import EndpointPicker
from longroute.gateway.config import GatewayConfig
from longroute.gateway.http.server import HttpServer, ResponseStream
from longroute.gateway.http.types import JSON_TYPE, HttpRequest, HttpResponse
from longroute.gateway.secrets import GatewaySecrets

log = logging.getLogger("longroute.epp")

LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_REFRESH_S = 1.0
#: gRPC messages carry more than a body: headers, metadata, the protobuf framing.
GRPC_MESSAGE_HEADROOM_BYTES = 1024 * 1024


def max_grpc_message_bytes(max_body_bytes: int) -> int:
    """The largest gRPC message each way. A BUFFERED request body comes in one message, as
    large as Envoy's buffer limit (``epp_config``'s 8 MiB, or ``admission.max_body_bytes``
    where a deployment raised both), whatever the picker's own limit: it must arrive to be
    refused with the picker's 413 (gRPC's default of 4 MiB broke the stream: Envoy
    answered 503). A rewritten body goes back in one message too."""
    return max(DEFAULT_MAX_BODY_BYTES, max_body_bytes) + GRPC_MESSAGE_HEADROOM_BYTES


class ExtProcService(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """``Process``: one stream per HTTP request, driven by an :class:`Exchange`."""

    def __init__(
        self, picker: EndpointPicker, response_bodies: ResponseBodies = ResponseBodies.AUTO
    ) -> None:
        self.picker = picker
        if response_bodies is ResponseBodies.AUTO and getattr(
            picker.router, "needs_observed_length", False
        ):
            response_bodies = ResponseBodies.ALL  # the router learns from every answer's usage
        self.response_bodies = response_bodies
        config = picker.config
        self.max_body_bytes = config.admission.max_body_bytes
        self.body_timeout_s = config.http.body_timeout_s
        self.request_timeout_s = config.admission.request_timeout_s

    async def Process(self, request_iterator: Any, context: Any) -> None:
        exchange = Exchange(
            self.picker, max_body_bytes=self.max_body_bytes, response_bodies=self.response_bodies
        )
        loop = asyncio.get_running_loop()
        is_picked = False
        try:
            async with asyncio.timeout(self.body_timeout_s) as deadline:
                while True:
                    message = await context.read()
                    if message is grpc.aio.EOF:
                        return
                    try:
                        responses = exchange.on_message(message)
                    except ProtocolError as exc:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:200])
                    for response in responses:
                        await context.write(response)
                    if not is_picked and exchange.phase is not Phase.REQUEST_HEADERS:
                        if exchange.phase is not Phase.REQUEST_BODY:
                            is_picked = True
                            deadline.reschedule(loop.time() + self.request_timeout_s)
                        else:  # each body message restarts the body's clock
                            deadline.reschedule(loop.time() + self.body_timeout_s)
        except TimeoutError:
            self.picker.metrics.errors.labels("stream_timeout").inc()
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "ext_proc stream timed out")
        finally:
            exchange.close()


@dataclass(frozen=True, slots=True)
class RunningEpp:
    """A started picker: its gRPC address (``host:port``) and metrics URL."""

    grpc_address: str
    metrics_url: str
    server: EppServer


class EppServer:
    """Everything one ``longroute epp`` process owns."""

    def __init__(
        self,
        config: GatewayConfig,
        secrets: GatewaySecrets,
        *,
        num_fallbacks: int = 0,
        response_bodies: ResponseBodies = ResponseBodies.AUTO,
    ) -> None:
        self.picker = EndpointPicker(config, secrets, num_fallbacks=num_fallbacks)
        self.response_bodies = response_bodies
        self.health_service = HealthServicer()
        self._grpc: Any = None
        self._http: HttpServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, host: str, port: int, metrics_port: int) -> tuple[str, str]:
        """Starts the loops and both servers; returns the gRPC ``host:port`` and metrics URL."""
        picker = self.picker
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit_per_host=4, ttl_dns_cache=10),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        loops = [picker.health.run(self._session), self._refresh_health()]
        loops += [m.run(self._session) for m in (picker.rtt, picker.scraper) if m is not None]
        self._tasks = [asyncio.create_task(loop) for loop in loops]
        try:
            truth = picker.engine_truth
            if truth is not None:  # a socket that cannot bind fails the start, naming it
                await truth.set_backends(picker.backends)
                self._tasks.append(asyncio.create_task(truth.run()))
            max_message = max_grpc_message_bytes(picker.config.admission.max_body_bytes)
            options = [
                ("grpc.max_receive_message_length", max_message),
                ("grpc.max_send_message_length", max_message),
            ]
            server = self._grpc = grpc.aio.server(options=options)
            external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
                ExtProcService(picker, self.response_bodies), server
            )
            health_pb2_grpc.add_HealthServicer_to_server(self.health_service, server)
            await self._set_health()
            bound_port = server.add_insecure_port(f"{host}:{port}")
            if bound_port == 0:
                raise OSError(f"cannot listen on {host}:{port} for gRPC")
            await server.start()
            self._http = HttpServer(self._dispatch, max_body_bytes=1024)
            http_host, http_port = (await self._http.start(host, metrics_port))[0]
        except BaseException:
            await self.stop()
            raise
        return f"{host}:{bound_port}", f"http://{http_host}:{http_port}"

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
            self._grpc = None
        if self._http is not None:
            await self._http.close(grace_s)
            self._http = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.picker.engine_truth is not None:
            await self.picker.engine_truth.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _refresh_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_REFRESH_S)
            await self._set_health()

    async def _set_health(self) -> None:
        status = health_pb2.HealthCheckResponse
        ready = status.SERVING if self.picker.is_ready else status.NOT_SERVING
        await self.health_service.set("", status.SERVING)
        await self.health_service.set(LIVENESS, status.SERVING)
        await self.health_service.set(READINESS, ready)
        await self.health_service.set(EXT_PROC_SERVICE, ready)

    async def _dispatch(self, request: HttpRequest, _: ResponseStream) -> HttpResponse:
        picker = self.picker
        if request.method == "GET" and request.path == "/health":
            return HttpResponse(200, b'{"status": "ok"}', JSON_TYPE)
        if request.method == "GET" and request.path == "/ready":
            healthy = picker.health.ready_backends()
            body: dict[str, Any] = {"status": "ready" if healthy else "no healthy backend"}
            body["healthy"] = healthy
            if not healthy:
                body["causes"] = picker.redactor.client_text(picker.health.causes())
            return HttpResponse(200 if healthy else 503, json.dumps(body).encode(), JSON_TYPE)
        if request.method == "GET" and request.path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            return HttpResponse(200, picker.metrics.render(), CONTENT_TYPE_LATEST)
        return HttpResponse(404, b'{"error": "not found"}', JSON_TYPE)


@asynccontextmanager
async def serve_epp(
    config: GatewayConfig,
    secrets: GatewaySecrets,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    metrics_port: int = 0,
    num_fallbacks: int = 0,
    response_bodies: ResponseBodies = ResponseBodies.AUTO,
) -> AsyncIterator[RunningEpp]:
    """Runs a picker for the ``async with`` block (port 0: any free one)."""
    server = EppServer(
        config, secrets, num_fallbacks=num_fallbacks, response_bodies=response_bodies
    )
    grpc_address, metrics_url = await server.start(host, port, metrics_port)
    try:
        yield RunningEpp(grpc_address, metrics_url, server)
    finally:
        await server.stop()
