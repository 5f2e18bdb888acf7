"""Loopback ports for servers a test or a load test starts."""

from __future__ import annotations

import random
import socket

HOST = "127.0.0.1"
Address = tuple[str, int]

# Ports handed out are drawn below Linux's ephemeral range (32768-60999), so
# an outgoing connection cannot take a server's port while it is restarting.
PORT_RANGE = (20000, 32000)

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now and was not handed out before in this process.

    Raises:
        RuntimeError: no free port found after 200 tries.
    """
    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
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
