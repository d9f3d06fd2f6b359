"""Ports for sockets a child binds later: distinct, bindable, outside the ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from longroute import ports
from longroute.ports import ephemeral_range, reserved_ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    chosen = reserved_ports(40, rng=random.Random(0))
    assert len(set(chosen)) == 40
    assert all(ports.LOWEST <= p < 65536 and not low <= p <= high for p in chosen)
    for port in chosen:  # each one free: a socket binds it
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    # a range that leaves two ports outside it, 65534 and 65535; one is held
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST, 65533))
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", 65535))
        except OSError:
            pytest.skip("port 65535 is in use on this machine")
        for seed in range(20):
            assert reserved_ports(1, rng=random.Random(seed)) == [65534]


def test_too_few_free_ports_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST, 65534))
    with pytest.raises(OSError, match="of 2 free loopback ports"):
        reserved_ports(2, rng=random.Random(2))


def test_a_range_covering_everything_falls_back_to_distinct_kernel_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    chosen = reserved_ports(8)
    assert len(set(chosen)) == 8


def test_the_range_file_is_read_and_a_bad_one_gives_the_default(tmp_path: Path) -> None:
    good = tmp_path / "range"
    good.write_text("40000\t50000\n")
    assert ephemeral_range(good) == (40000, 50000)
    for text in ("", "a b", "50000 40000", "0 10"):
        good.write_text(text)
        assert ephemeral_range(good) == ports.DEFAULT_EPHEMERAL
    assert ephemeral_range(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL
