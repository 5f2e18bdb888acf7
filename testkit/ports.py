"""Loopback ports for servers a test or a load test starts."""

from __future__ import annotations

import os
import random
import socket

HOST = "127.0.0.1"
Address = tuple[str, int]

# Ports handed out are drawn below Linux's ephemeral range (32768-60999), so
# an outgoing connection cannot take a server's port while it is restarting.
PORT_RANGE = (20000, 32000)


def _own_range() -> tuple[int, int]:
    """This process's share of PORT_RANGE: under pytest-xdist each worker draws from
    its own slice (PYTEST_XDIST_WORKER gw0, gw1, ...), so two workers can never
    both find a port free and start servers on it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return PORT_RANGE
    low, high = PORT_RANGE
    width = (high - low) // count
    start = low + int(worker[2:]) * width
    return start, start + width


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now and was not handed out before in this process.

    Raises:
        RuntimeError: no free port found after 200 tries.
    """
    for _ in range(200):
        port = random.randrange(*_own_range())
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port found")
