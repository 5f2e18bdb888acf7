"""redis-py's leaked write errors become connection errors; ours stay what they are."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.lock import connection_errors


async def test_a_write_on_a_connection_closed_under_it_is_a_connection_error() -> None:
    # A connection whose writer is gone, as after a failover closed it mid-command:
    # redis-py 8.1 raises AttributeError from its own write (redis/redis-py#4287).
    closed = Connection()
    with pytest.raises(RedisConnectionError, match="closed while writing"), connection_errors():
        await closed._send_packed_command([b"PING\r\n"])


def test_an_attribute_error_of_our_own_propagates_unchanged() -> None:
    nothing: Any = None
    with pytest.raises(AttributeError), connection_errors():
        nothing.writelines([b"PING\r\n"])
