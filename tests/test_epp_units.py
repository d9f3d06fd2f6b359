"""The endpoint picker's parts around the protocol: config checks, the Envoy config and
binary lookup, and the gRPC server itself (health services, bounded streams, a peer that
hangs up mid-body), in process, without Envoy."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_messages import chat_body, request_body, request_headers
from longroute.epp import envoy_binary
from longroute.epp.envoy import epp_config
from longroute.epp.picker import EndpointPicker, endpoint_address
from longroute.epp.server import serve_epp
from longroute.errors import ConfigError
from longroute.gateway.config import parse_gateway_config
from longroute.gateway.secrets import GatewaySecrets

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "envoy-epp.yaml"


def test_the_documented_envoy_config_is_the_tested_one() -> None:
    assert yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")) == epp_config()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.5:8000", "10.0.0.5:8000"),
        ("http://10.0.0.5", "10.0.0.5:80"),
        ("http://[2600:4040::1]:80", "[2600:4040::1]:80"),
    ],
)
def test_endpoint_address(url: str, expected: str) -> None:
    assert endpoint_address("b", url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [("http://engine.local:8000", "IP address"), ("https://10.0.0.5:443", "http://")],
)
def test_endpoint_address_refuses_names_and_tls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        endpoint_address("b", url)


def _config(**backend: Any) -> Any:
    entry = {"name": "a", "url": "http://127.0.0.1:1", "model": "llama-3-8b", **backend}
    return parse_gateway_config({"backends": [entry]}, "test")


def test_backend_api_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="api_key_env is not supported"):
        EndpointPicker(_config(api_key_env="KEY"), GatewaySecrets({"a": "k"}, None))


def test_find_envoy_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(envoy_binary.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv(envoy_binary.ENV_BINARY, str(tmp_path / "missing"))
    with pytest.raises(envoy_binary.EnvoyNotFoundError, match="not an executable"):
        envoy_binary.find_envoy()
    monkeypatch.delenv(envoy_binary.ENV_BINARY)
    with pytest.raises(envoy_binary.EnvoyNotFoundError, match="--install-envoy"):
        envoy_binary.find_envoy()
    fake = envoy_binary.cached_envoy_path()
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "$0  version: abc/1.40.0/Clean/RELEASE/BoringSSL"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert envoy_binary.find_envoy() == fake
    assert envoy_binary.envoy_version(fake).startswith("abc/1.40.0")
    messages: list[str] = []
    assert envoy_binary.install_envoy(messages.append) == fake  # cached: no download
    assert "already installed" in messages[0]


# ---- the gRPC server, in process ---------------------------------------------------


TEST_TIMEOUT_S = 30.0
Body = Callable[[Any, EndpointPicker], Awaitable[None]]


def run_with_epp(body: Body) -> None:
    """Runs ``body(channel, picker)`` against a picker whose only backend never answers (port
    1), with short stream bounds, under a hard limit so that a hang fails the test."""
    config = parse_gateway_config(
        {
            "backends": [{"name": "a", "url": "http://127.0.0.1:1", "model": "llama-3-8b"}],
            "http": {"body_timeout_s": 0.5},
            "health": {"interval_s": 0.2, "timeout_s": 0.2},
            "rtt_probe_interval_s": None,
            "scrape_interval_s": None,
        },
        "test",
    )

    async def main() -> None:
        async with serve_epp(config, GatewaySecrets({}, None)) as running:
            channel = grpc.aio.insecure_channel(running.grpc_address)
            try:
                await body(channel, running.server.picker)
            finally:
                await channel.close()

    asyncio.run(asyncio.wait_for(main(), TEST_TIMEOUT_S))


def test_health_services() -> None:
    async def body(channel: Any, _: EndpointPicker) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        status = health_pb2.HealthCheckResponse

        async def check(service: str) -> int:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            return int(answer.status)

        assert await check("liveness") == status.SERVING
        # no backend has answered: not ready, for the readiness and the ext_proc services
        assert await check("readiness") == status.NOT_SERVING
        assert await check("envoy.service.ext_proc.v3.ExternalProcessor") == status.NOT_SERVING

    run_with_epp(body)


def _count(picker: EndpointPicker, kind: str) -> float:
    value = picker.metrics.registry.get_sample_value("longroute_errors_total", {"kind": kind})
    return 0.0 if value is None else value


def test_a_peer_that_hangs_up_mid_body() -> None:
    async def body(channel: Any, picker: EndpointPicker) -> None:
        sent = asyncio.Event()

        async def messages() -> AsyncIterator[Any]:
            yield request_headers()
            yield request_body(chat_body()[:10], end_of_stream=False)
            sent.set()
            await asyncio.sleep(30)  # never ends the body

        call = external_processor_pb2_grpc.ExternalProcessorStub(channel).Process(messages())
        await sent.wait()
        await asyncio.sleep(0.1)
        call.cancel()
        for _ in range(100):
            if _count(picker, "client_disconnect") == 1:
                break
            await asyncio.sleep(0.02)
        assert _count(picker, "client_disconnect") == 1
        assert picker.fleet.state("a").num_inflight_requests == 0

    run_with_epp(body)


def test_a_peer_that_stops_sending_is_cut_off() -> None:
    async def body(channel: Any, picker: EndpointPicker) -> None:
        async def messages() -> AsyncIterator[Any]:
            yield request_headers()
            await asyncio.sleep(30)

        call = external_processor_pb2_grpc.ExternalProcessorStub(channel).Process(messages())
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _count(picker, "stream_timeout") == 1

    run_with_epp(body)


def test_out_of_order_messages_end_the_stream() -> None:
    async def body(channel: Any, _: EndpointPicker) -> None:
        async def messages() -> AsyncIterator[Any]:
            yield request_body(b"{}", end_of_stream=True)

        call = external_processor_pb2_grpc.ExternalProcessorStub(channel).Process(messages())
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    run_with_epp(body)
