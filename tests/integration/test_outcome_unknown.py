"""A flush whose commit outcome is unknown (``gateway.domain.errors.OutcomeUnknown``).

When the connection breaks after ``flush_batch()`` was sent, the flush may have
committed. The gateway must not give the reservations back (that could sell the
units twice in Redis and tell a buyer who got the order that it failed): it
answers 503, keeps them in the ledger, and the reconciler settles each from the
order rows once PostgreSQL is reachable.

To make the outcome unknown for certain, and committed, the gateway reaches
PostgreSQL through a fault proxy; the test holds the sku's row lock so the flush
waits inside PostgreSQL, stalls the proxy, lets the flush commit (its reply is
held by the proxy), and then cuts the connection before the reply arrives.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from redis.asyncio import Redis

from testkit.polling import wait_for
from testkit.proxy import FaultProxy
from testkit.purchases import (
    ADMIN_HEADERS,
    buy,
    client_metric,
    db_state,
    put_sku,
    redis_state,
)

# The gateway's flush, waiting on the row lock the test holds.
WAITING_FLUSH = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
  AND query LIKE '%flush_batch(%' AND pid <> pg_backend_pid()
"""


class TestOutcomeUnknown:
    """A flush cut off after it committed: 503 now, settled exactly once later."""

    async def test_committed_flush_with_lost_reply_is_kept_for_the_reconciler(
        self,
        start_gateway: Any,
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """Alice's flush commits but its reply is cut off: she is answered 503
        while her reservation stays in the ledger and Redis keeps her unit taken
        (given back, it would be sold twice). Once PostgreSQL is reachable the
        reconciler confirms it from her order row; a second pass changes nothing,
        her retry gets that order, and the other two units sell to two more
        buyers: three orders for three units, none lost, none twice."""
        with FaultProxy("127.0.0.1", 5432, name="postgres") as proxy:
            url = database_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
            client = await start_gateway(
                database_url=url, reservation_timeout_s=0.1, reconcile_interval_s=3600
            )
            await put_sku(client, sku, 3)
            # The watcher's own connection: in the blocker's transaction
            # pg_stat_activity would be one snapshot for the whole transaction.
            blocker, watcher = [await asyncpg.connect(database_url) for _ in range(2)]
            try:
                holding = blocker.transaction()
                await holding.start()
                await blocker.execute("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE", sku)
                alice = asyncio.create_task(buy(client, sku, "alice", "a1"))
                await wait_for(
                    lambda: watcher.fetchval(WAITING_FLUSH), what="the flush waits on the row"
                )
                proxy.stall()
                await holding.commit()
                await wait_for(
                    lambda: watcher.fetchval("SELECT count(*) FROM orders WHERE sku = $1", sku),
                    what="the flush committed",
                )
                proxy.cut()
                status, body = await asyncio.wait_for(alice, 10)
            finally:
                proxy.clear()
                await blocker.close()
                await watcher.close()
            assert (status, body["error"]) == (503, "unavailable"), body
            assert await redis_state(redis, key_prefix, sku) == (2, 1)
            metrics = await (await client.get("/metrics")).text()
            assert 'flashsale_flush_failures_total{reason="postgres"} 1.0' in metrics

            async def settled() -> bool:
                if await redis_state(redis, key_prefix, sku) == (2, 0):
                    return True
                await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
                return False

            await wait_for(settled, within=10, what="the reconciler settles alice's entry")
            again = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
            assert again.status == 200
            assert await redis_state(redis, key_prefix, sku) == (2, 0)
            assert await db_state(database_url, sku) == (2, 1, 1)
            status, body = await buy(client, sku, "alice", "a1")
            assert (status, body["user_id"], body["request_id"]) == (201, "alice", f"{sku}.a1")
            assert (await buy(client, sku, "bob", "b1"))[0] == 201
            assert (await buy(client, sku, "carol", "c1"))[0] == 201
            assert await buy(client, sku, "dave", "d1") == (409, {"status": "sold_out"})
            assert await db_state(database_url, sku) == (0, 3, 3)
            assert await redis_state(redis, key_prefix, sku) == (0, 0)
            assert await client_metric(client, "flashsale_flush_failures_total") == 1
            await client.close()
