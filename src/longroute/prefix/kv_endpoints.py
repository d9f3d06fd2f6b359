"""ZeroMQ endpoints of KV-event publishers: ranks, bind-or-connect. Pure: no I/O.

vLLM's ``ZmqEventPublisher`` binds its PUB socket when the endpoint holds a
wildcard (``*`` or ``::``) or is ``ipc://``/``inproc://``, and connects
otherwise; data-parallel rank ``r`` publishes on the configured TCP port + ``r``
(port 0, "any port", is left alone) or on ``inproc://name_dp<r>``.
"""

from __future__ import annotations

_SCHEMES = ("tcp://", "ipc://", "inproc://")
_MAX_ENDPOINT_CHARS = 256


def is_bind_endpoint(endpoint: str) -> bool:
    """Whether vLLM binds (rather than connects) a socket on ``endpoint``."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _tcp_port(endpoint: str) -> tuple[str, int]:
    base, colon, port_text = endpoint.rpartition(":")
    if not colon or base in ("", "tcp") or not port_text.isdigit():
        raise ValueError(f"a tcp endpoint is tcp://host:port, got {endpoint!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port of {endpoint!r} must be in 0..65535, got {port}")
    return base, port


def check_endpoint(endpoint: str) -> None:
    """Raise ``ValueError`` naming ``endpoint`` unless it is a usable ZeroMQ address."""
    if not 0 < len(endpoint) <= _MAX_ENDPOINT_CHARS:
        raise ValueError(
            f"a ZeroMQ endpoint has 1..{_MAX_ENDPOINT_CHARS} characters, got {len(endpoint)}"
        )
    if not endpoint.startswith(_SCHEMES):
        raise ValueError(
            f"a ZeroMQ endpoint starts with one of {', '.join(_SCHEMES)}, got {endpoint!r}"
        )
    if any(c.isspace() for c in endpoint):
        raise ValueError(f"a ZeroMQ endpoint has no whitespace, got {endpoint!r}")
    if endpoint.startswith("tcp://"):
        _tcp_port(endpoint)
    elif endpoint.rstrip("/").endswith(":"):
        raise ValueError(f"an {endpoint.split(':')[0]} endpoint needs a name, got {endpoint!r}")


def offset_endpoint_port(endpoint: str, dp_rank: int) -> str:
    """The endpoint data-parallel rank ``dp_rank`` uses, by vLLM's rule.

    Rank 0 keeps ``endpoint``; a tcp port grows by the rank unless it is 0;
    ``inproc://name`` becomes ``inproc://name_dp<rank>``; ``ipc://`` has no
    per-rank form in vLLM and is refused for ranks above 0.
    """
    if dp_rank < 0:
        raise ValueError(f"data-parallel rank must be >= 0, got {dp_rank}")
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    if endpoint.startswith("tcp://"):
        base, port = _tcp_port(endpoint)
        if port == 0:
            return endpoint
        if port + dp_rank > 65535:
            raise ValueError(f"{endpoint!r} + rank {dp_rank} passes port 65535")
        return f"{base}:{port + dp_rank}"
    raise ValueError(
        f"data-parallel rank {dp_rank} needs a tcp:// or inproc:// endpoint, got {endpoint!r}"
    )
