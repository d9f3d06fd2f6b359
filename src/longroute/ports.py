"""Loopback ports for sockets that a child process will bind later (its KV-event sockets).

A port found free by binding port 0 and closing comes from the kernel's ephemeral range,
the same range every other ``bind(("", 0))`` and every outgoing connection draws from.
Between the pick and the child's bind, another process starting at the same time (an
emulator's HTTP server on port 0, a gateway's connection to a backend) may be handed
that very port, and the child fails with "Address already in use". So these ports are
drawn from outside the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
where the kernel hands out nothing on its own, each checked bindable and all distinct.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default
LOWEST = 10_000  # below: well-known and registered services' ports
MAX_TRIES_PER_PORT = 200


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    if not 0 < low <= high <= 65535:
        return DEFAULT_EPHEMERAL
    return low, high


def _spans(low: int, high: int) -> list[range]:
    """Ports outside [low, high] and at least LOWEST, as ranges (possibly none)."""
    spans = [range(LOWEST, low), range(max(LOWEST, high + 1), 65536)]
    return [span for span in spans if len(span) > 0]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserved_ports(count: int, *, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct loopback ports, bindable now and outside the ephemeral range.

    Falls back to kernel-chosen ports when no port lies outside the range (a range set
    to cover everything); raises OSError when too few bindable ports are found."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = rng or random.Random()
    spans = _spans(*ephemeral_range())
    if not spans:
        return _kernel_ports(count)
    chosen: list[int] = []
    for _ in range(count * MAX_TRIES_PER_PORT):
        if len(chosen) == count:
            break
        span = rng.choices(spans, weights=[len(s) for s in spans])[0]
        port = rng.choice(span)
        if port not in chosen and _bindable(port):
            chosen.append(port)
    if len(chosen) < count:
        raise OSError(f"found {len(chosen)} of {count} free loopback ports")
    return chosen


def _kernel_ports(count: int) -> list[int]:
    """Distinct kernel-chosen ports: every socket is held open until all are chosen."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


__all__ = ["ephemeral_range", "reserved_ports"]
