"""Session fixtures: a private PostgreSQL database and Redis key prefix per run.

Redis and PostgreSQL are the shared servers on 127.0.0.1 (``make test`` starts
them if nothing listens). Each test session works in its own database and
under its own key prefix, and removes both when it ends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.settings import Settings

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


ADMIN_TOKEN = "test-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def make_settings(database_url: str, key_prefix: str, redis: Redis) -> Callable[..., Settings]:
    """A factory of settings on the session database and this test's key prefix
    (whose keys the ``redis`` fixture deletes afterwards)."""

    def make(**overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "redis_url": REDIS_URL,
            "database_url": database_url,
            "key_prefix": key_prefix,
            "admin_token": ADMIN_TOKEN,
        }
        base.update(overrides)
        return Settings(**base)

    return make


@pytest.fixture
async def start_gateway(
    make_settings: Callable[..., Settings],
) -> AsyncIterator[Callable[..., Awaitable[TestClient[web.Request, web.Application]]]]:
    """A factory of running gateway apps (in this process) with HTTP test clients."""
    clients: list[TestClient[web.Request, web.Application]] = []

    async def start(**overrides: Any) -> TestClient[web.Request, web.Application]:
        client = TestClient(TestServer(create_app(make_settings(**overrides))))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in reversed(clients):
        await client.close()


@pytest.fixture
def sku(key_prefix: str) -> str:
    """A sku name unique to one test."""
    return f"sku-{key_prefix}"


async def put_sku(
    client: TestClient[web.Request, web.Application], sku: str, stock: int, limit: int = 1
) -> None:
    """Create or reset a sku through the admin API."""
    resp = await client.put(
        f"/admin/skus/{sku}", json={"stock": stock, "per_user_limit": limit}, headers=ADMIN_HEADERS
    )
    assert resp.status == 200, await resp.text()
