"""Free TCP ports on loopback for listeners about to start (tests, benchmarks, a local stack
on free ports).

Chosen below the kernel's ephemeral range where there is room: a port bind(0) hands out lies
in that range, and any outgoing connection (services dialing each other while a stack starts)
may take it as its source port before the listener binds it.
"""

from __future__ import annotations

import functools
import random
import socket
from pathlib import Path

# free_port picks from here up to the kernel's ephemeral range; ports it handed out in this
# process are never handed out again (nothing holds them until their listener binds).
PICK_FROM = 20_000
_handed_out: set[int] = set()
_pick = random.SystemRandom()  # independent of any seeded `random` in the caller


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a listener to bind shortly.

    Chosen below the kernel's ephemeral range where there is room: a port bind(0) hands out
    lies in that range, and any outgoing connection (services dialing each other while a
    stack starts) may take it as its source port before the listener binds it.
    """
    low = ephemeral_range()[0]
    if low - PICK_FROM >= 2_000:
        for _ in range(200):
            port = _pick.randrange(PICK_FROM, low)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    return _kernel_port()


@functools.cache
def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux; else the IANA one)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49_152, 65_535


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
