"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.lock import LockSubscriber
from tests.integration.lock_support import Backend, close_pg_pool, open_pg_pool


@pytest.fixture(params=["redis", "postgres"])
async def backend(
    request: pytest.FixtureRequest, redis: Redis, key_prefix: str, database_url: str
) -> AsyncIterator[Backend]:
    """The lock backend under test, on a lock name of this test's own."""
    pool = await open_pg_pool(database_url) if request.param == "postgres" else None
    subscriber = LockSubscriber(redis)
    yield Backend(request.param, redis, pool, f"{key_prefix}:{{lock}}:lock", subscriber)
    await subscriber.aclose()
    if pool is not None:
        await close_pg_pool(pool)
