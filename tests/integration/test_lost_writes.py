"""A replica promoted without the newest writes: a committed order's records are
gone from Redis, and a replay of its request id must still get its order.

Each test commits two orders through the gateway, then leaves Redis as a
replica that missed the second buyer's reservation and settle would be: no
done record, no buyer mark, and the unit back in the counter. What brings the
counter back to 0 differs (the unit sold again, the reconciler's repair,
another buyer's reservation on its way), and so does what makes PostgreSQL
answer the replay: the sku flagged as rebuilding (fleet-wide), or this
gateway's doubt after it saw Redis fail. The gateway's own reconciler is
held off (one pass an hour): each test runs its passes itself.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg
from redis.asyncio import Redis

from gateway.domain.model import Purchase, Verdict
from gateway.domain.stock import Pending
from gateway.http.appkeys import ORDERS
from gateway.ops.audit import audit
from gateway.redis.layout import SkuKeys, encode_pending
from gateway.settings import Settings
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, buy, put_sku, wait_sold_out_marked

QUIET = {"reconcile_interval_s": 3600.0}


async def sell_out(client: Any, sku: str) -> str:
    """Two buyers take both units; the order id of the second (``b``, ``<sku>.rb``)."""
    await put_sku(client, sku, 2)
    assert (await buy(client, sku, "a", "ra"))[0] == 201
    status, body = await buy(client, sku, "b", "rb")
    assert status == 201, body
    order_id: str = body["order_id"]
    return order_id


async def lose_last_writes(redis: Redis, keys: SkuKeys, sku: str) -> None:
    """Redis as a replica that missed ``b``'s reservation and settle: no done
    record, no buyer mark, and its unit back in the counter."""
    assert await redis.hdel(keys.done, f"{sku}.rb") == 1
    assert await redis.hdel(keys.buyers, "b") == 1
    await redis.incrby(keys.stock, 1)


async def rebuilt(redis: Redis, keys: SkuKeys, sku: str) -> None:
    """Wait until the rebuild ends, then check it wrote ``b``'s records back."""

    async def done() -> bool:
        return not await redis.exists(keys.rebuild)

    await wait_for(done, within=30, what="the rebuild ends")
    assert await redis.hget(keys.buyers, "b") is not None
    record = await redis.hget(keys.done, f"{sku}.rb")
    assert record is not None


async def reconcile(client: Any) -> None:
    """One reconciler pass of the gateway (asserts a 200)."""
    resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def audited_clean(settings: Settings, sku: str) -> None:
    """The audit finds nothing wrong with ``sku``."""
    (row,) = await audit(settings, sku)
    assert not row.findings, row


class TestLostWrites:
    """A replay of an order whose Redis records a failover lost gets its order."""

    async def test_after_the_unit_sold_again(
        self, start_gateway: Any, make_settings: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """The unit the lost reservation left in the counter is reserved by a new
        buyer, whom the database turns away (it has no stock): that flush shows
        Redis ran ahead, so the sku is flagged as rebuilding. The replay gets
        201 with its order, not sold out; a new buyer is sold out; the rebuild
        writes the order's records back and the audit is clean."""
        client = await start_gateway(**QUIET)
        keys = SkuKeys.of(key_prefix, sku)
        order_id = await sell_out(client, sku)
        await lose_last_writes(redis, keys, sku)

        assert (await buy(client, sku, "c", "rc"))[1]["status"] == "sold_out"

        status, body = await buy(client, sku, "b", "rb")
        assert (status, body.get("order_id")) == (201, order_id), body
        assert (await buy(client, sku, "d", "rd"))[1]["status"] == "sold_out"
        await rebuilt(redis, keys, sku)
        await reconcile(client)
        await audited_clean(make_settings(), sku)

    async def test_after_the_reconciler_repaired_the_counter(
        self, start_gateway: Any, make_settings: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """The reconciler finds the counter one above the database and repairs it
        (to 0), flagging the sku as rebuilding: the replay gets 201 with its
        order, a new buyer is sold out (with and without a request id), and the
        hashes are rebuilt; the audit is clean."""
        client = await start_gateway(**QUIET)
        keys = SkuKeys.of(key_prefix, sku)
        order_id = await sell_out(client, sku)
        await lose_last_writes(redis, keys, sku)

        await reconcile(client)
        assert await redis.get(keys.stock) == b"0"

        status, body = await buy(client, sku, "b", "rb")
        assert (status, body.get("order_id")) == (201, order_id), body
        assert (await buy(client, sku, "d", "rd"))[1]["status"] == "sold_out"
        assert (await buy(client, sku, "e"))[1]["status"] == "sold_out"
        await rebuilt(redis, keys, sku)
        await audited_clean(make_settings(), sku)

    async def test_after_this_gateway_saw_redis_fail(
        self, start_gateway: Any, make_settings: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """Before any evidence flags the sku: another buyer's reservation of the
        unit is on its way (the counter 0, nothing flagged), and this gateway
        saw Redis fail on another sku a moment ago. Its sold-out answer to the
        replay is checked in PostgreSQL: 201 with the order. A new buyer with a
        request id is still sold out after the check, one without at once."""
        client = await start_gateway(**QUIET)
        keys = SkuKeys.of(key_prefix, sku)
        order_id = await sell_out(client, sku)
        await lose_last_writes(redis, keys, sku)
        await redis.decrby(keys.stock, 1)
        reserved = Pending(f"{sku}.rc", "c", 1, 0)
        await redis.hset(keys.pending, reserved.request_id, encode_pending(reserved))

        # Redis fails under a reservation of another sku (a garbled counter makes
        # reserve.lua raise, as a dead node makes the call fail).
        other = f"{sku}-other"
        await put_sku(client, other, 1)
        await redis.set(SkuKeys.of(key_prefix, other).stock, "garbled")
        assert (await buy(client, other, "a", "ra"))[0] == 503
        await redis.set(SkuKeys.of(key_prefix, other).stock, 1)

        status, body = await buy(client, sku, "b", "rb")
        assert (status, body.get("order_id")) == (201, order_id), body
        assert not await redis.exists(keys.rebuild)
        assert (await buy(client, sku, "d", "rd"))[1]["status"] == "sold_out"
        assert (await buy(client, sku, "e"))[1]["status"] == "sold_out"

    async def test_on_a_sku_marked_sold_out_after_redis_failed(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """The sku is marked sold out here, its filter of confirmed ids built from
        a done hash without the order (``b``'s records lost, the counter 0):
        after this gateway saw Redis fail, a request id the filter lacks is
        looked up in PostgreSQL, and the replay gets 201 with its order, not the
        in-process sold out; a purchase without a request id still gets it."""
        client = await start_gateway(**QUIET)
        keys = SkuKeys.of(key_prefix, sku)
        order_id = await sell_out(client, sku)
        await lose_last_writes(redis, keys, sku)
        await redis.decrby(keys.stock, 1)
        assert (await buy(client, sku, "c", "rc"))[1]["status"] == "sold_out"
        await wait_sold_out_marked(client, sku)

        other = f"{sku}-other"
        await put_sku(client, other, 1)
        await redis.set(SkuKeys.of(key_prefix, other).stock, "garbled")
        assert (await buy(client, other, "a", "ra"))[0] == 503

        status, body = await buy(client, sku, "b", "rb")
        assert (status, body.get("order_id")) == (201, order_id), body
        assert (await buy(client, sku, "e"))[1]["status"] == "sold_out"

    async def test_a_sold_out_told_after_redis_failed_voids_earlier_attempts(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """A sold out told to a request id after this gateway saw Redis fail is
        made final in PostgreSQL: an attempt of that request id that arrived
        before (its reservation lost with a failed node, or its call still
        waiting one out while its client retried) is answered expired by the
        flush, even once stock is back; an attempt after the answer buys."""
        client = await start_gateway(**QUIET)
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "a", "ra"))[0] == 201
        other = f"{sku}-other"
        await put_sku(client, other, 1)
        await redis.set(SkuKeys.of(key_prefix, other).stock, "garbled")
        assert (await buy(client, other, "a", "ra"))[0] == 503

        before = int(time.time() * 1000) - 1
        assert (await buy(client, sku, "x", "rx"))[1]["status"] == "sold_out"
        after = int(time.time() * 1000) + 1
        con = await asyncpg.connect(database_url)
        try:
            await con.execute("UPDATE inventory SET stock = 1 WHERE sku = $1", sku)
        finally:
            await con.close()

        orders, rid = client.app[ORDERS], f"{sku}.rx"
        earlier = Purchase(sku, "x", 1, rid, reserved_at_ms=before)
        decided = await orders.commit_batch(sku, [earlier], None)
        assert decided.decisions[rid].verdict is Verdict.EXPIRED
        later = Purchase(sku, "x", 1, rid, reserved_at_ms=after)
        decided = await orders.commit_batch(sku, [later], None)
        assert decided.decisions[rid].verdict is Verdict.CONFIRMED
