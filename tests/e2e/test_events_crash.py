"""Order events through a crash, with a real gateway process (issue 32): the
gateway is SIGKILLed while the webhook receiver answers 500 and the event
stream refuses too (its key holds a string: every XADD is answered
WRONGTYPE); both recover, the gateway restarts, and every event arrives at
both, duplicates only with the same ``event_id``, each order's versions in
order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from redis.asyncio import Redis

from testkit.gateways import GatewayCluster
from testkit.order_events import EVENTS_OF_SKU, check_arrivals
from testkit.polling import wait_for
from testkit.services import REDIS_URL, database_url, drop_database
from testkit.webhook_receivers import Receiver, receiving

PAYMENT_TOKEN = "test-payment-token-e2e"
SECRET = "test-webhook-secret-e2e"
SINKS = 2
BUYERS = 30
# Each order's first version, and the second of the paid and the cancelled ones.
EVENTS_MADE = range(BUYERS + 2 * BUYERS // 3)
OWED = "SELECT count(*) FROM events_owed"
REFUSED = "SELECT count(*) FROM event_deliveries WHERE attempts >= 1"


@pytest.fixture
async def own_database() -> AsyncIterator[str]:
    """A database of the test's own (``migrate`` creates it): no other test's events."""
    name = f"flashsale_crash_{uuid.uuid4().hex[:8]}"
    yield database_url(name)
    await drop_database(name)


async def count(url: str, query: str) -> int:
    """One count from the database at ``url``."""
    con = await asyncpg.connect(url)
    try:
        found: int = await con.fetchval(query)
        return found
    finally:
        await con.close()


async def buy_and_close(base: str, sku: str) -> None:
    """BUYERS pending orders; a third paid, a third cancelled."""
    pay_headers = {"Authorization": f"Bearer {PAYMENT_TOKEN}"}
    async with aiohttp.ClientSession(base) as http:
        for i in range(BUYERS):
            body = {"sku": sku, "user_id": f"u{i}", "request_id": f"{sku}.r{i}"}
            async with http.post("/v1/purchase", json=body) as resp:
                assert resp.status == 201, await resp.text()
        for i in range(2 * BUYERS // 3):
            action = "pay" if i < BUYERS // 3 else "cancel"
            payload = {"payment_id": f"p{i}"} if action == "pay" else None
            path = f"/v1/orders/{sku}.r{i}/{action}"
            async with http.post(path, json=payload, headers=pay_headers) as resp:
                assert resp.status == 200, await resp.text()


async def on_stream(redis: Redis, key: str) -> list[dict[str, str]]:
    """Every entry of the event stream, in order, as text fields."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


class TestKilledWhileTheSinkRefuses:
    """SIGKILL with every event refused and owed, then recovery."""

    async def test_every_event_arrives_once_the_sinks_and_the_gateway_are_back(
        self, own_database: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """30 orders, 20 of them paid or cancelled: 50 events owed to each sink,
        each order's first refused (500, WRONGTYPE) and retried, the second
        held behind it; the gateway is SIGKILLed, the receiver answers 200 and
        the stream is made writable, the gateway restarts: every event is at
        the receiver and on the stream, a duplicate only with its own
        event_id, each order's versions in order."""
        stream = f"{key_prefix}:events"
        await redis.set(stream, "not a stream")
        receiver = Receiver(status=500)
        async with receiving(receiver) as url:
            settings: dict[str, Any] = {
                "payment_token": PAYMENT_TOKEN,
                "events_stream": stream,
                "events_poll_s": 0.05,
                "webhook_url": url,
                "webhook_secret": SECRET,
            }
            ids = await self.crash_and_recover(own_database, key_prefix, sku, settings, receiver)
        assert len(ids) == len(EVENTS_MADE)
        check_arrivals([e for e in await on_stream(redis, stream) if e["sku"] == sku], ids)
        posted = [json.loads(r.body) for r in receiver.received]
        check_arrivals([e for e in posted if e["sku"] == sku], ids)

    async def crash_and_recover(
        self,
        own_database: str,
        key_prefix: str,
        sku: str,
        settings: dict[str, Any],
        receiver: Receiver,
    ) -> dict[tuple[str, int], str]:
        """The sale with both sinks refusing, the SIGKILL, the recovery; the
        events written, by (order, version)."""
        stream = settings["events_stream"]
        async with GatewayCluster(
            1,
            redis_url=REDIS_URL,
            database_url=own_database,
            key_prefix=key_prefix,
            settings=settings,
        ) as cluster:
            await cluster.admin(
                "PUT", f"/admin/skus/{sku}", {"stock": BUYERS, "payment_window_s": 600}
            )
            await buy_and_close(cluster.urls[0], sku)

            # The later versions wait behind their order's refused first one.
            async def all_refused() -> bool:
                refused = await count(own_database, REFUSED)
                owed = await count(own_database, OWED)
                return refused == SINKS * BUYERS and owed == SINKS * len(EVENTS_MADE)

            await wait_for(all_refused, within=20, what="every first version refused")
            await cluster[0].crash()
            receiver.status = 200
            async with Redis.from_url(REDIS_URL) as redis:
                await redis.delete(stream)
            await cluster[0].start()

            async def relayed() -> bool:
                return await count(own_database, OWED) == 0

            await wait_for(relayed, within=30, what="every event relayed after the restart")
            con = await asyncpg.connect(own_database)
            try:
                return {(r[0], r[1]): r[2] for r in await con.fetch(EVENTS_OF_SKU, sku)}
            finally:
                await con.close()
