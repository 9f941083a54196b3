"""Ports tests restart servers on lie below the kernel's ephemeral range and are not handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests import ports
from tests.ports import _ephemeral_low, restartable_port


def test_restartable_ports_lie_below_the_ephemeral_range_and_come_in_turn() -> None:
    picked = [restartable_port() for _ in range(50)]
    assert len(set(picked)) == 50
    assert all(10_000 <= port < _ephemeral_low() for port in picked)


def test_a_port_in_use_is_passed_over() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", restartable_port()))
        taken.listen()
        held = taken.getsockname()[1]
        assert all(restartable_port() != held for _ in range(20))


def test_an_unreadable_port_range_falls_back_to_the_linux_default(tmp_path: Path) -> None:
    assert _ephemeral_low(tmp_path / "missing") == 32_768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert _ephemeral_low(tmp_path / "range") == 40_000


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_worker_slice", lambda: range(0))
    port = restartable_port()
    assert 0 < port < 65_536
