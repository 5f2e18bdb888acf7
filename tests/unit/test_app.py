"""The wiring (``gateway.app``): the object graph is built from the settings and
the opened resources alone, and starts nothing until the cleanup context does."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gateway.app import Opened, build_gateway, deduction_strategies
from gateway.domain.model import Strategy
from gateway.ops.metrics import Metrics
from gateway.postgres.database import Pool
from gateway.postgres.orders import Orders
from gateway.redis.connections import create_redis
from gateway.settings import load

# Never connected to: building must not touch it.
UNUSED_POOL = cast("Pool[Any]", object())


async def test_building_a_gateway_starts_nothing() -> None:
    """build_gateway hands every use case its adapters without I/O: no Redis
    connection is opened, the pool is never asked, and no task is started."""
    settings = load({"GATEWAY_REDIS_URL": "redis://127.0.0.1:1/0"})
    redis = create_redis(settings)
    before = asyncio.all_tasks()
    try:
        opened = Opened(settings, Metrics(), redis, UNUSED_POOL, Orders(UNUSED_POOL))
        gateway = build_gateway(opened)
        assert asyncio.all_tasks() == before
        assert gateway.writer is not None  # GATEWAY_QUEUE_WRITER's default
        assert gateway.lanes is None  # one worker: no lanes
    finally:
        await redis.aclose()


def test_every_strategy_without_redis_state_is_served() -> None:
    """The gateway has a deduction for exactly the strategies that do not
    reserve in Redis (``Strategy.reserves``), the others being Purchases' own."""
    served = deduction_strategies(load({}), Metrics(), UNUSED_POOL)
    assert set(served) == {s for s in Strategy if not s.reserves}
