"""A connection closed under a write, on uvloop, is a lost connection (a 503), never a 500.

In a Redis Cluster failover redis-py on uvloop let escape uvloop's
``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>;
the handler is closed`` from a write on a connection the failover had closed;
purchases were answered 500. These tests make that error on a real connection.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
import uvloop
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.domain.errors import RedisUnavailable
from gateway.lock import closed_under_write, connection_errors
from gateway.redis.connections import redis_call
from testkit.services import REDIS_URL


async def _closed_under_write() -> Connection:
    """A real connection to Redis whose transport was aborted under it."""
    url = urlsplit(REDIS_URL)
    conn = Connection(host=url.hostname or "127.0.0.1", port=url.port or 6379)
    await conn.connect()  # type: ignore[no-untyped-call]
    writer = conn._writer
    assert writer is not None
    writer.transport.abort()
    await asyncio.sleep(0)
    return conn


def test_uvloops_closed_transport_error_is_a_connection_error() -> None:
    """The raw error is uvloop's RuntimeError; connection_errors() makes it a
    ConnectionError and redis_call() a RedisUnavailable (the 503 of every adapter)."""

    async def main() -> None:
        conn = await _closed_under_write()
        with pytest.raises(RuntimeError, match="handler is closed") as raw:
            await conn.send_packed_command([b"PING\r\n"], check_health=False)
        assert closed_under_write(raw.value)

        conn = await _closed_under_write()
        with pytest.raises(RedisConnectionError, match="closed while writing"), connection_errors():
            await conn.send_packed_command([b"PING\r\n"], check_health=False)

        conn = await _closed_under_write()
        with pytest.raises(RedisUnavailable):
            await redis_call(conn.send_packed_command([b"PING\r\n"], check_health=False))

    uvloop.run(main())


def test_a_runtime_error_of_our_own_is_not_taken_for_a_lost_connection() -> None:
    """The same type raised in our code stays a bug (a 500 with its traceback)."""
    try:
        raise RuntimeError("the handler is closed")
    except RuntimeError as exc:
        assert not closed_under_write(exc)


def test_a_lock_bound_to_another_loop_stays_a_loud_error() -> None:
    """asyncio's own RuntimeError (the wedge of a cluster client whose lock was bound
    in a thread's loop) is a bug to see in the logs, not a connection to retry."""

    async def contend(lock: asyncio.Lock) -> None:
        async with lock:
            await asyncio.sleep(0.01)

    async def both(lock: asyncio.Lock) -> None:
        await asyncio.gather(contend(lock), contend(lock))

    lock = asyncio.Lock()
    asyncio.run(both(lock))
    with pytest.raises(RuntimeError, match="different event loop") as raised:
        asyncio.run(both(lock))
    assert not closed_under_write(raised.value)
