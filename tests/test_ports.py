"""Loopback ports for the servers our tools start (zbk.cli.ports)."""

from __future__ import annotations

import socket
from collections import deque

import pytest

from zbk.cli import ports


class Script:
    """A stand-in for the port generator that draws the given ports in order."""

    def __init__(self, draws: list[int]) -> None:
        self.draws = iter(draws)

    def randrange(self, low: int, high: int) -> int:
        port = next(self.draws)
        assert low <= port < high
        return port


def two_free_ports() -> tuple[int, int]:
    picked = [p for p in range(ports.AUTO_PORT_LOW + 7_000, ports.AUTO_PORT_HIGH) if ports.port_free(p)][:2]
    return picked[0], picked[1]


def test_a_port_handed_out_is_not_handed_out_again_before_its_server_binds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two servers' ports are picked before either starts: the second must not get the
    first's, although nothing listens on it yet."""
    a, b = two_free_ports()
    monkeypatch.setattr(ports, "_handed_out", deque(maxlen=ports._HANDED_OUT_KEPT))
    monkeypatch.setattr(ports, "_pick", Script([a, a, a, b]))
    assert ports.free_port() == a
    assert ports.free_port() == b


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_free_ports()
    monkeypatch.setattr(ports, "_handed_out", deque(maxlen=ports._HANDED_OUT_KEPT))
    monkeypatch.setattr(ports, "_pick", Script([a, b]))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ports.LOOPBACK, a))
        s.listen()
        assert ports.free_port() == b


def test_the_memory_of_handed_out_ports_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last _HANDED_OUT_KEPT are remembered: a long test run never runs out."""
    a, b = two_free_ports()
    kept: deque[int] = deque([a], maxlen=2)
    monkeypatch.setattr(ports, "_handed_out", kept)
    monkeypatch.setattr(ports, "_pick", Script([a, b, a]))
    assert ports.free_port() == b
    kept.append(b + 1)  # a third port handed out pushes ``a`` out of the memory
    assert ports.free_port() == a
