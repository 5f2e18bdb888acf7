"""Active skus (issue 33): a reconcile pass and the per-sku series cost what the
skus still selling cost; archiving retires a sku; the admin API lists skus."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from gateway.http.appkeys import RECONCILER
from gateway.redis.layout import SkuKeys
from testkit.metrics import samples
from testkit.purchases import ADMIN_HEADERS, buy, put_sku
from testkit.rooms import SECRET, join, put_room_sku


async def reconcile(client: Any) -> dict[str, Any]:
    """``POST /admin/reconcile``: what the pass did, per sku it visited."""
    resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()
    done: dict[str, Any] = await resp.json()
    return done


async def series(client: Any, sku: str) -> dict[str, float]:
    """The samples of ``/metrics`` labelled with ``sku``."""
    text = await (await client.get("/metrics")).text()
    return {k: v for k, v in samples(text).items() if f'sku="{sku}"' in k}


async def archive(client: Any, sku: str) -> tuple[int, dict[str, Any]]:
    """``DELETE /admin/skus/{sku}``: (status, body)."""
    resp = await client.delete(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
    return resp.status, await resp.json()


class TestActiveSkus:
    """A pass visits the active skus alone, and an idle sku is active again once changed."""

    async def test_a_pass_visits_only_the_active_skus(self, start_gateway: Any, sku: str) -> None:
        """The first pass visits every sku; a sold-out sku with nothing pending and
        a sku without stock are then idle: the next pass skips them (no lock, no
        read) and their series leave /metrics, while the sku still on sale is
        visited again. A restock makes the idle sku active again."""
        client = await start_gateway(reconcile_interval_s=3600)
        selling, sold, empty = f"{sku}-selling", f"{sku}-sold", f"{sku}-empty"
        await put_sku(client, selling, 5)
        await put_sku(client, sold, 1)
        await put_sku(client, empty, 0)
        assert (await buy(client, sold, "u1", "r1"))[0] == 201
        assert (await buy(client, selling, "u1", "r1"))[0] == 201

        first = await reconcile(client)
        assert {selling, sold, empty} <= first.keys()
        second = await reconcile(client)
        assert selling in second and sold not in second and empty not in second
        assert await series(client, sold) == {}
        live = await series(client, selling)
        assert live[f'flashsale_sku_on_sale{{sku="{selling}"}}'] == 4
        assert live[f'flashsale_sku_sold{{sku="{selling}"}}'] == 1
        assert live[f'flashsale_sku_held{{sku="{selling}"}}'] == 0
        assert live[f'flashsale_sku_confirmed_total{{sku="{selling}"}}'] == 1

        resp = await client.post(
            f"/admin/skus/{empty}/restock", json={"delta": 2}, headers=ADMIN_HEADERS
        )
        assert resp.status == 200
        third = await reconcile(client)
        assert empty in third and sold not in third
        assert (await series(client, empty))[f'flashsale_sku_on_sale{{sku="{empty}"}}'] == 2

    async def test_a_sold_out_sku_with_a_reservation_pending_stays_active(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A sku whose counter is 0 while a reservation waits in its ledger is not
        idle: the pass keeps visiting it until the ledger is empty."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "u1", "r1"))[0] == 201
        await reconcile(client)
        assert sku not in await reconcile(client)
        # A restock and a purchase of it: the row changed, so the sku is active.
        resp = await client.post(
            f"/admin/skus/{sku}/restock", json={"delta": 1}, headers=ADMIN_HEADERS
        )
        assert resp.status == 200
        assert (await buy(client, sku, "u2", "r2"))[0] == 201
        assert (await reconcile(client))[sku]["pending"] == 0
        assert sku not in await reconcile(client)

    async def test_a_change_on_one_instance_makes_the_sku_active_on_another(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Two gateways on one database and Redis: once the sold-out sku is idle,
        neither visits it; a restock through one makes the other's next pass
        visit it (the row changed), and a purchase on the other buys the unit."""
        first = await start_gateway(reconcile_interval_s=3600)
        second = await start_gateway(reconcile_interval_s=3600)
        await put_sku(first, sku, 1)
        assert (await buy(first, sku, "u1", "r1"))[0] == 201
        for client in (first, second):
            await reconcile(client)
            assert sku not in await reconcile(client)
        resp = await first.post(
            f"/admin/skus/{sku}/restock", json={"delta": 1}, headers=ADMIN_HEADERS
        )
        assert resp.status == 200
        assert sku in await reconcile(second)
        assert (await buy(second, sku, "u2", "r2"))[0] == 201

    async def test_a_resumed_change_feed_makes_the_next_pass_visit_every_sku(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Announcements missed while the change feed was down (it resumed) or
        stock that came back in Redis for an idle sku: the next pass visits
        every sku once, then the active ones again."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 0)
        await reconcile(client)
        assert sku not in await reconcile(client)
        reconciler = client.app[RECONCILER]
        for missed in (reconciler.feed_resumed, lambda: reconciler.stock_returned(sku)):
            missed()
            assert sku in await reconcile(client)
            assert sku not in await reconcile(client)

    async def test_an_idle_sku_whose_redis_changed_is_active_until_repaired(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """Redis lost the write that took an idle sku's last unit (its counter is 1
        again, the database's stock 0): the pass over every sku after the feed
        resumed repairs the drift and makes the sku active again; the next pass
        visits it, finds it quiet, and it is idle once more."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "u1", "r1"))[0] == 201
        await reconcile(client)
        assert sku not in await reconcile(client)
        await redis.set(SkuKeys.of(key_prefix, sku).stock, 1)
        client.app[RECONCILER].feed_resumed()
        assert (await reconcile(client))[sku]["repaired"] is True
        assert (await reconcile(client))[sku]["drift"] == 0
        assert sku not in await reconcile(client)
        assert (await buy(client, sku, "u2", "r2"))[1]["status"] == "sold_out"


class TestArchive:
    """DELETE /admin/skus/{sku} archives a sku: not for sale, its books kept."""

    async def test_archived_sku_is_unknown_to_buyers_and_keeps_its_orders(
        self, start_gateway: Any, sku: str
    ) -> None:
        """After DELETE, a purchase is 404 unknown_sku; the order made before is
        still there; DELETE again answers the same; PATCH and restock are 404; its
        series leave /metrics at the next pass; the sku is listed as archived."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 5)
        assert (await buy(client, sku, "u1", "r1"))[0] == 201
        await reconcile(client)
        assert await series(client, sku) != {}

        status, body = await archive(client, sku)
        assert status == 200
        assert body == {"sku": sku, "status": "archived", "archived_at": body["archived_at"]}
        assert await archive(client, sku) == (200, body)

        status, refused = await buy(client, sku, "u2", "r2")
        assert (status, refused["error"]) == (404, "unknown_sku")
        resp = await client.get(f"/v1/orders/{sku}.r1?user_id=u1")
        assert resp.status == 200 and (await resp.json())["user_id"] == "u1"
        resp = await client.patch(f"/admin/skus/{sku}", json={"stock": 9}, headers=ADMIN_HEADERS)
        assert (resp.status, (await resp.json())["error"]) == (404, "unknown_sku")
        resp = await client.post(
            f"/admin/skus/{sku}/restock", json={"delta": 1}, headers=ADMIN_HEADERS
        )
        assert (resp.status, (await resp.json())["error"]) == (404, "unknown_sku")
        report = await (await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
        assert report["sold"] == 1 and report["db_stock"] == 4

        assert sku in await reconcile(client)  # what it had pending is settled
        assert sku not in await reconcile(client)
        assert await series(client, sku) == {}
        query = f"status=archived&after={sku[:-1]}"
        resp = await client.get(f"/admin/skus?{query}", headers=ADMIN_HEADERS)
        listed = await resp.json()
        assert resp.status == 200, listed
        assert {
            "sku": sku,
            "status": "archived",
            "stock": 4,
            "archived_at": body["archived_at"],
        } in listed["skus"]

    async def test_every_way_to_buy_is_refused(self, start_gateway: Any, sku: str) -> None:
        """The queue strategy and a waiting room's join and poll are 404 unknown_sku
        too once the sku is archived."""
        client = await start_gateway(admission_secret=SECRET)
        queued, roomed = f"{sku}-queued", f"{sku}-roomed"
        await put_sku(client, queued, 3, strategy="queue")
        await put_room_sku(client, roomed, 3)
        status, ticket = await join(client, roomed, "u1")
        assert status == 200
        for archived in (queued, roomed):
            assert (await archive(client, archived))[0] == 200
        status, refused = await buy(client, queued, "u1", "r1")
        assert (status, refused["error"]) == (404, "unknown_sku")
        status, refused = await join(client, roomed, "u2")
        assert (status, refused["error"]) == (404, "unknown_sku")
        resp = await client.get(f"/v1/queue/{roomed}/{ticket['ticket']}")
        assert (resp.status, (await resp.json())["error"]) == (404, "unknown_sku")

    async def test_put_lists_an_archived_sku_again(self, start_gateway: Any, sku: str) -> None:
        """A PUT of an archived sku puts it on sale again with the PUT's stock; its
        old buyer still has their order (one order per buyer), a new one buys."""
        client = await start_gateway()
        await put_sku(client, sku, 2)
        assert (await buy(client, sku, "u1", "r1"))[0] == 201
        assert (await archive(client, sku))[0] == 200
        await put_sku(client, sku, 3)
        assert (await buy(client, sku, "u1", "r2"))[0] == 409
        assert (await buy(client, sku, "u2", "r3"))[0] == 201
        report = await (await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
        assert (report["db_stock"], report["sold"]) == (2, 2)

    async def test_unknown_sku_is_404(self, start_gateway: Any, sku: str) -> None:
        """DELETE of a sku that never existed is 404 unknown_sku."""
        client = await start_gateway()
        status, body = await archive(client, sku)
        assert (status, body["error"]) == (404, "unknown_sku")


class TestListing:
    """GET /admin/skus pages through the skus by name, filtered by status."""

    async def test_pages_follow_the_cursor(self, start_gateway: Any, sku: str) -> None:
        """Pages of 2 walk five skus in name order with ``next`` as the cursor; the
        filter shows the active, idle or archived ones; bad parameters are 400."""
        client = await start_gateway(reconcile_interval_s=3600)
        names = [f"{sku}-{i}" for i in range(5)]
        for name in names:
            await put_sku(client, name, 0 if name == names[1] else 1)
        assert (await archive(client, names[4]))[0] == 200
        await reconcile(client)

        seen: list[dict[str, Any]] = []
        after: str | None = sku
        while after is not None and after <= names[-1]:
            resp = await client.get(f"/admin/skus?limit=2&after={after}", headers=ADMIN_HEADERS)
            assert resp.status == 200
            page = await resp.json()
            assert len(page["skus"]) <= 2
            seen += [s for s in page["skus"] if s["sku"] in names]
            after = page["next"]
        assert [s["sku"] for s in seen] == names
        assert [s["status"] for s in seen] == ["active", "idle", "active", "active", "archived"]

        for status, expected in (("idle", [names[1]]), ("archived", [names[4]])):
            resp = await client.get(
                f"/admin/skus?status={status}&after={sku}", headers=ADMIN_HEADERS
            )
            shown = [s["sku"] for s in (await resp.json())["skus"] if s["sku"] in names]
            assert shown == expected
        for query in ("status=sold", "limit=0", "limit=1001", "limit=x", "after=a%20b"):
            resp = await client.get(f"/admin/skus?{query}", headers=ADMIN_HEADERS)
            assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")
        resp = await client.get("/admin/skus")
        assert resp.status == 401
