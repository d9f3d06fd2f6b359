"""Envoy configs for the endpoint picker, and an Envoy process on loopback.

:func:`epp_config` is the config of ``examples/envoy-epp.yaml`` (a test keeps
the two equal): one HTTP listener whose ``ext_proc`` filter asks the picker
about every request (headers and the ``BUFFERED`` request body sent, response
bodies ``STREAMED`` unless the picker's ``mode_override`` turns them off), and an
``ORIGINAL_DST`` cluster that connects to the
address in the ``x-gateway-destination-endpoint`` header the picker sets.
:func:`direct_config` is plain Envoy with a round-robin cluster over fixed
backends, the baseline of ``benchmarks/epp_overhead.py``.

:class:`EnvoyProcess` runs a binary (:mod:`.envoy_binary`) with such a config,
ports chosen by the kernel (``port_value: 0``; the bound ones are read from
Envoy's admin API), and stops it, with its process group, at exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from longroute.epp.messages import DESTINATION_KEY, METADATA_NAMESPACE

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
#: The gateway's default ``admission.max_body_bytes`` (8 MiB).
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _listener(
    port: int,
    cluster: str,
    http_filters: list[dict[str, Any]],
    buffer_limit_bytes: int | None = None,
) -> dict[str, Any]:
    manager = {
        "@type": _HCM + "HttpConnectionManager",
        "stat_prefix": "inference",
        "codec_type": "AUTO",
        "route_config": {
            "name": "inference",
            "virtual_hosts": [
                {
                    "name": "inference",
                    "domains": ["*"],
                    # no per-route timeout: a long answer streams for minutes
                    "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}
                    ],
                }
            ],
        },
        "http_filters": [
            *http_filters,
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
        ],
    }
    listener: dict[str, Any] = {"name": "inference", "address": _address("127.0.0.1", port)}
    if buffer_limit_bytes is not None:
        listener["per_connection_buffer_limit_bytes"] = buffer_limit_bytes
    return {
        **listener,
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def epp_config(
    *,
    port: int = 8081,
    admin_port: int = 9901,
    epp_host: str = "127.0.0.1",
    epp_port: int = 9002,
    failure_mode_allow: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> dict[str, Any]:
    """Envoy in front of ``longroute epp`` (see the module doc). ``max_body_bytes``: the
    largest request body Envoy buffers for the picker (its per-connection buffer limit;
    Envoy answers 413 above it), the gateway's ``admission.max_body_bytes`` default."""
    ext_proc = {
        "@type": _EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "longroute_epp"}, "timeout": "10s"},
        # the picker unavailable: refuse the request (failure_mode_allow: false), never send
        # it on unrouted; Envoy then answers 503 by itself (a status clients retry)
        "failure_mode_allow": failure_mode_allow,
        "status_on_error": {"code": 503},
        # the whole request body in one message (Envoy holds the headers until the picker
        # answers it); response bodies by default, each chunk as it passes, and the picker
        # turns them off per request (mode_override) where it does not read them
        "processing_mode": {
            "request_header_mode": "SEND",
            "response_header_mode": "SEND",
            "request_body_mode": "BUFFERED",
            "response_body_mode": "STREAMED",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SEND",
        },
        "allow_mode_override": True,
        # the picker answers each message at once; the bound is for a stalled picker
        "message_timeout": "60s",
        # accept the picked endpoint in the picker's dynamic metadata
        "metadata_options": {"receiving_namespaces": {"untyped": [METADATA_NAMESPACE]}},
    }
    epp_cluster = {
        "name": "longroute_epp",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            _HTTP_OPTIONS: {
                "@type": "type.googleapis.com/" + _HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "longroute_epp",
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(epp_host, epp_port)}}]}
            ],
        },
    }
    pool_cluster = {
        "name": "inference_pool",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_KEY},
    }
    filters = [{"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}]
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [_listener(port, "inference_pool", filters, max_body_bytes)],
            "clusters": [pool_cluster, epp_cluster],
        },
    }


def direct_config(
    backends: Sequence[tuple[str, int]], *, port: int = 8081, admin_port: int = 9901
) -> dict[str, Any]:
    """Plain Envoy: round robin over ``backends`` (``(ip, port)`` pairs), no picker."""
    cluster = {
        "name": "direct_pool",
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": "5s",
        "load_assignment": {
            "cluster_name": "direct_pool",
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(h, p)}} for h, p in backends]}
            ],
        },
    }
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [_listener(port, "direct_pool", [])],
            "clusters": [cluster],
        },
    }


class EnvoyError(RuntimeError):
    """Envoy did not start; the message quotes its log."""


class EnvoyProcess:
    """One Envoy process with ``config``; ``url`` is its listener once :meth:`start` returned.

    Envoy's log goes to ``workdir/<name>.log``. ``concurrency``: Envoy's worker threads.
    """

    def __init__(
        self,
        binary: Path,
        config: dict[str, Any],
        workdir: Path,
        *,
        name: str = "envoy",
        concurrency: int = 1,
        log_level: str = "warning",
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.name = name
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        self._admin_path = workdir / f"{name}.admin"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        self._args = [
            *(str(binary), "-c", str(self.config_path), "--concurrency", str(concurrency)),
            *("--log-level", log_level, "--disable-hot-restart"),
            *("--admin-address-path", str(self._admin_path)),
        ]
        self.popen: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.admin_url = ""

    def start(self, timeout_s: float = 60.0) -> EnvoyProcess:
        """Starts Envoy and waits until its listener is bound; raises EnvoyError."""
        self._admin_path.unlink(missing_ok=True)
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                self._args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline_s = time.monotonic() + timeout_s
        while time.monotonic() < deadline_s:
            if self.popen.poll() is not None:
                raise EnvoyError(f"{self.name} exited with {self.popen.returncode}: {self.tail()}")
            if self._admin_path.is_file() and (admin := self._admin_path.read_text().strip()):
                self.admin_url = f"http://{admin}"
                port = self._listener_port()
                if port is not None:
                    self.url = f"http://127.0.0.1:{port}"
                    return self
            time.sleep(0.05)
        self.stop()
        raise EnvoyError(f"{self.name} was not ready within {timeout_s:g} s: {self.tail()}")

    def _listener_port(self) -> int | None:
        try:
            with urllib.request.urlopen(self.admin_url + "/listeners?format=json", timeout=2) as r:
                listeners = json.loads(r.read())
            for listener in listeners.get("listener_statuses", []):
                port = listener["local_address"]["socket_address"].get("port_value")
                if port:
                    return int(port)
        except (OSError, ValueError, KeyError):
            return None
        return None

    def tail(self, num_lines: int = 20) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; idempotent."""
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()

    def __enter__(self) -> EnvoyProcess:
        return self.start() if self.popen is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
