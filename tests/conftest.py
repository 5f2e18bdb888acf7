"""Session fixtures: a private PostgreSQL database and Redis key prefix per run.

Redis and PostgreSQL are the shared servers on 127.0.0.1 (``make test`` starts
them if nothing listens). Each test session works in its own database and
under its own key prefix, and removes both when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from gateway import lane
from gateway.app import create_app
from gateway.appkeys import METRICS
from gateway.settings import Settings
from tests.support.gateways import LAG_LIMIT_S
from tests.support.purchases import ADMIN_TOKEN
from tests.support.services import REDIS_URL, create_database, drop_database


@pytest.fixture(scope="session")
def run_id() -> str:
    """A short id unique to this test session."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def database_url(run_id: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session, dropped at the end."""
    name = f"flashsale_test_{run_id}"
    yield asyncio.run(create_database(name))
    asyncio.run(drop_database(name))


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
    """A factory of running gateway apps (in this process) with HTTP test clients.

    Every client is closed even when closing another fails, so one app's failed
    shutdown fails its own test and leaks nothing into the next one's."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**overrides: Any) -> TestClient[web.Request, web.Application]:
            client = TestClient(TestServer(create_app(make_settings(**overrides))))
            stack.push_async_callback(client.close)
            await client.start_server()
            assert client.server.runner is not None and client.server.runner.server is not None
            # As gateway.server does: plain purchases through the lane.
            lane.install(client.app, client.server.runner.server)
            stack.push_async_callback(_lag_guard, client.app, _late_timers(client.app))
            return client

        yield start


def _late_timers(app: web.Application) -> float:
    """How often the app's lag timer ran more than LAG_LIMIT_S late."""
    within = every = 0.0
    for family in app[METRICS].loop_lag.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket") and sample.labels["le"] == str(LAG_LIMIT_S):
                within = sample.value
            elif sample.name.endswith("_bucket") and sample.labels["le"] == "+Inf":
                every = sample.value
    return every - within


async def _lag_guard(app: web.Application, at_start: float) -> None:
    """The lag guard of an in-process gateway, as of a gateway process
    (tests.support.gateways): its loop is the test's, so a test or fixture that
    blocks it fails too, which is as it should be."""
    late = _late_timers(app) - at_start
    assert late == 0, f"event loop stalled: {late:.0f} timer(s) over {LAG_LIMIT_S}s late"


@pytest.fixture
def sku(key_prefix: str) -> str:
    """A sku name unique to one test."""
    return f"sku-{key_prefix}"
