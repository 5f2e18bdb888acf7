"""Session fixtures: a private PostgreSQL database and Redis key prefix per run.

Redis and PostgreSQL are the shared servers on 127.0.0.1 (``make test`` starts
them if nothing listens). Each test session works in its own database and
under its own key prefix, and removes both when it ends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from redis.asyncio import Redis

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_URL = os.environ.get("TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_url(database: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture(scope="session")
def run_id() -> str:
    """A short id unique to this test session."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def database_url(run_id: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session, dropped at the end."""
    import asyncio

    name = f"flashsale_test_{run_id}"

    async def admin(sql: str) -> None:
        con = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await con.execute(sql)
        finally:
            await con.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    yield _pg_url(name)
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def key_prefix(run_id: str) -> str:
    """A Redis key prefix unique to one test."""
    return f"t{run_id}{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def redis(key_prefix: str) -> AsyncIterator[Redis]:
    """A client on the shared Redis; deletes the test's keys afterwards."""
    client = Redis.from_url(REDIS_URL)
    yield client
    async for key in client.scan_iter(match=f"{key_prefix}*", count=1000):
        await client.delete(key)
    await client.aclose()
