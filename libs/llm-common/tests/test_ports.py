"""Free ports for listeners about to start: distinct, bindable, clear of outgoing
connections' source ports."""

from __future__ import annotations

import socket

import pytest

from llm_common import ports
from llm_common.ports import PICK_FROM, ephemeral_range, free_port


def test_free_ports_are_bindable_distinct_and_clear_of_outgoing_connections() -> None:
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if low - PICK_FROM >= 2_000:  # room below the ephemeral range (Linux's default)
        assert all(PICK_FROM <= p < low for p in ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_free_port_skips_a_port_someone_listens_on(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Every pick lands on the taken port first, then anywhere: the taken one is refused.
        picks = iter([port, port, port + 1 if port + 1 < 65536 else port - 1])
        monkeypatch.setattr(ports, "PICK_FROM", 1)
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (65_000, 65_535))
        monkeypatch.setattr(ports._pick, "randrange", lambda a, b: next(picks))
        assert free_port() not in (port, 0)
