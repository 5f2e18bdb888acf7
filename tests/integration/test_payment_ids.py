"""One payment id is one payment (issue 38), on real PostgreSQL: once an id paid
an order or was recorded as another order's late payment, any use of it for a
third order is 409 ``payment_id_taken``, whatever that order's state, in either
order of the two uses and when they race; and the database refuses it to any
writer, since one key (``payments``) covers both uses."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.postgres.database import migrate
from testkit.migrations import migrated_before
from testkit.order_lifecycle import cancel, pay, put_window, start
from testkit.purchases import Client, buy, put_sku

# Concurrent rounds per race: each races two uses of one new payment id.
ROUNDS = 40


async def bought(client: Client, sku: str, *rids: str) -> None:
    """Buy one unit per request id, each for its own buyer (named as the id),
    and wait for each 201."""
    for rid in rids:
        status, body = await buy(client, sku, rid, rid)
        assert status == 201, body


async def uses_of(database_url: str, payment_id: str) -> set[tuple[str, str]]:
    """Every use of ``payment_id`` in the books: ("paid"|"late", request id)."""
    con = await asyncpg.connect(database_url)
    try:
        rows = await con.fetch(
            "SELECT 'paid' AS use, request_id FROM orders WHERE payment_id = $1"
            " UNION ALL SELECT 'late', request_id FROM late_payments WHERE payment_id = $1",
            payment_id,
        )
    finally:
        await con.close()
    return {(r["use"], r["request_id"]) for r in rows}


async def ids_of_two_orders(database_url: str) -> list[str]:
    """Payment ids used for more than one order, across both uses."""
    con = await asyncpg.connect(database_url)
    try:
        rows = await con.fetch(
            "SELECT payment_id FROM (SELECT payment_id, request_id FROM orders"
            " WHERE payment_id IS NOT NULL UNION SELECT payment_id, request_id"
            " FROM late_payments) u GROUP BY payment_id HAVING count(*) > 1"
        )
    finally:
        await con.close()
    return [r["payment_id"] for r in rows]


class TestOneIdOneOrder:
    """Both orders of the two uses, and every state of the third order."""

    @pytest.fixture
    async def client(self, start_gateway: Any, sku: str) -> Client:
        """A gateway with the sku on sale under a 2-minute payment window."""
        client = await start(start_gateway)
        await put_window(client, sku, 20, 120, "sql-direct")
        return client

    async def test_an_id_that_paid_is_not_recorded_late_for_another(
        self, client: Client, sku: str, database_url: str
    ) -> None:
        """The issue's reproduction: A paid by X; B cancelled, then paid with X:
        409 payment_id_taken, and X is recorded for A alone, so no refund of it
        can return A's payment."""
        await bought(client, sku, "a", "b")
        assert (await pay(client, sku, "a", f"pay-x-{sku}"))[0] == 200
        assert (await pay(client, sku, "b", f"pay-x-{sku}"))[1]["error"] == "payment_id_taken"
        assert (await cancel(client, sku, "b"))[0] == 200
        status, body = await pay(client, sku, "b", f"pay-x-{sku}")
        assert (status, body["error"]) == (409, "payment_id_taken")
        assert await uses_of(database_url, f"pay-x-{sku}") == {("paid", f"{sku}.a")}

    async def test_an_id_recorded_late_pays_no_other_order(
        self, client: Client, sku: str, database_url: str
    ) -> None:
        """B cancelled, X recorded as its late payment; then X for a pending D:
        409 payment_id_taken, and D stays pending, unpaid. X for B again is
        still B's late payment (409 order_cancelled, recorded once)."""
        await bought(client, sku, "b", "d")
        assert (await cancel(client, sku, "b"))[0] == 200
        status, body = await pay(client, sku, "b", f"pay-x-{sku}")
        assert (status, body["error"]) == (409, "order_cancelled")
        status, body = await pay(client, sku, "d", f"pay-x-{sku}")
        assert (status, body["error"]) == (409, "payment_id_taken")
        resp = await client.get(f"/v1/orders/{sku}.d", params={"user_id": "d"})
        assert (await resp.json())["status"] == "pending_payment"
        status, body = await pay(client, sku, "b", f"pay-x-{sku}")
        assert (status, body["error"]) == (409, "order_cancelled")
        assert await uses_of(database_url, f"pay-x-{sku}") == {("late", f"{sku}.b")}
        # D pays with its own id, as it should.
        assert (await pay(client, sku, "d", f"pay-d-{sku}"))[0] == 200

    @pytest.mark.parametrize("state", ["pending", "paid", "cancelled", "confirmed"])
    async def test_a_taken_id_is_taken_whatever_the_other_order_is(
        self, client: Client, sku: str, database_url: str, state: str
    ) -> None:
        """X paid A; X for an order that is pending, paid by its own id,
        cancelled, or final without a window: 409 payment_id_taken each time,
        never that order's own answer (already_paid, order_cancelled,
        no_payment_window), and X stays A's alone."""
        x = f"pay-x-{sku}"
        await bought(client, sku, "a", "c")
        assert (await pay(client, sku, "a", x))[0] == 200
        target = "c"
        if state == "paid":
            assert (await pay(client, sku, "c", f"pay-c-{sku}"))[0] == 200
        elif state == "cancelled":
            assert (await cancel(client, sku, "c"))[0] == 200
        elif state == "confirmed":
            final = f"{sku}-final"
            await put_sku(client, final, 1, strategy="sql-direct")
            status, body = await buy(client, final, "c", "c")
            assert status == 201 and body["status"] == "confirmed"
            sku = final
        status, body = await pay(client, sku, target, x)
        assert (status, body["error"]) == (409, "payment_id_taken")
        assert await ids_of_two_orders(database_url) == []


class TestRaces:
    """Two uses of one id for two orders at once: exactly one stands."""

    async def test_a_payment_and_a_late_payment_race(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """Per round, X pays pending A while X comes late for cancelled B, both
        at once: one of them wins (A paid, or B's late payment recorded), the
        other is payment_id_taken, and X names one order in the books."""
        client = await start(start_gateway)
        await put_window(client, sku, 2 * ROUNDS, 120, "sql-direct")
        for i in range(ROUNDS):
            await bought(client, sku, f"a{i}", f"b{i}")
            assert (await cancel(client, sku, f"b{i}"))[0] == 200

        async def race(i: int) -> tuple[str, str]:
            paid, late = await asyncio.gather(
                pay(client, sku, f"a{i}", f"pay-{i}-{sku}"),
                pay(client, sku, f"b{i}", f"pay-{i}-{sku}"),
            )
            return (
                "paid" if paid[0] == 200 else paid[1]["error"],
                late[1]["error"],
            )

        outcomes = collections.Counter(await asyncio.gather(*map(race, range(ROUNDS))))
        assert set(outcomes) <= {
            ("paid", "payment_id_taken"),
            ("payment_id_taken", "order_cancelled"),
        }, outcomes
        assert sum(outcomes.values()) == ROUNDS
        assert await ids_of_two_orders(database_url) == []

    async def test_two_payments_race(self, start_gateway: Any, sku: str, database_url: str) -> None:
        """Per round, X pays pending A and pending D at once: one paid, the
        other payment_id_taken and still pending."""
        client = await start(start_gateway)
        await put_window(client, sku, 2 * ROUNDS, 120, "sql-direct")
        for i in range(ROUNDS):
            await bought(client, sku, f"a{i}", f"d{i}")

        async def race(i: int) -> list[int]:
            answers = await asyncio.gather(
                pay(client, sku, f"a{i}", f"pay-{i}-{sku}"),
                pay(client, sku, f"d{i}", f"pay-{i}-{sku}"),
            )
            assert sorted(str(b.get("status") or b.get("error")) for _, b in answers) == [
                "paid",
                "payment_id_taken",
            ], answers
            return [s for s, _ in answers]

        await asyncio.gather(*map(race, range(ROUNDS)))
        assert await ids_of_two_orders(database_url) == []


class TestTheFloor:
    """The database refuses a second order for an id, whoever writes it."""

    async def test_a_writer_by_hand_is_refused(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """The previous release's statements, or SQL by hand: an UPDATE that pays
        another order with X, and an INSERT of X as another order's late payment,
        each fail with unique_violation; the same order's id again passes."""
        client = await start(start_gateway)
        await put_window(client, sku, 5, 120, "sql-direct")
        x = f"pay-x-{sku}"
        await bought(client, sku, "a", "b", "e")
        assert (await pay(client, sku, "a", x))[0] == 200
        assert (await cancel(client, sku, "e"))[0] == 200
        assert (await pay(client, sku, "e", f"pay-e-{sku}"))[1]["error"] == "order_cancelled"
        con = await asyncpg.connect(database_url)
        try:
            with pytest.raises(asyncpg.UniqueViolationError):
                await con.execute(
                    "UPDATE orders SET payment_id = $2 WHERE request_id = $1", f"{sku}.b", x
                )
            with pytest.raises(asyncpg.UniqueViolationError):
                await con.execute(
                    "UPDATE orders SET payment_id = $2 WHERE request_id = $1",
                    f"{sku}.b",
                    f"pay-e-{sku}",
                )
            with pytest.raises(asyncpg.UniqueViolationError):
                await con.execute(
                    "INSERT INTO late_payments (payment_id, request_id, reason)"
                    " VALUES ($2, $1, 'cancelled')",
                    f"{sku}.e",
                    x,
                )
            # The id's own order: a no-op claim.
            await con.execute(
                "UPDATE orders SET payment_id = $2 WHERE request_id = $1", f"{sku}.a", x
            )
        finally:
            await con.close()
        assert await ids_of_two_orders(database_url) == []


class TestUpgrade:
    """sql/013_payments.sql on a database the bug already wrote to."""

    async def test_the_migration_keeps_the_payment_and_drops_the_wrong_late_one(
        self, tmp_path: Path
    ) -> None:
        """Before 013: X paid A and was recorded as B's late payment, Y was C's
        late payment. After: X is A's alone (B's record, which a refund would
        have paid out of A's money, is gone), Y stays C's, and the rule holds
        from then on."""
        async with migrated_before("013", tmp_path) as con:
            await con.execute(
                "INSERT INTO inventory (sku, stock, payment_window_s) VALUES ('s', 0, 60);"
                "INSERT INTO orders (request_id, sku, user_id, qty, status, payment_id) VALUES"
                " ('a', 's', 'ua', 1, 'paid', 'pay-x'), ('b', 's', 'ub', 1, 'cancelled', NULL),"
                " ('c', 's', 'uc', 1, 'expired', NULL);"
                "INSERT INTO late_payments (payment_id, request_id, reason) VALUES"
                " ('pay-x', 'b', 'cancelled'), ('pay-y', 'c', 'expired')"
            )
            assert "013_payments" in await migrate(con)
            rows = await con.fetch("SELECT payment_id, request_id FROM payments ORDER BY 1")
            assert [tuple(r) for r in rows] == [("pay-x", "a"), ("pay-y", "c")]
            late = await con.fetch("SELECT payment_id, request_id FROM late_payments")
            assert [tuple(r) for r in late] == [("pay-y", "c")]
            with pytest.raises(asyncpg.UniqueViolationError):
                await con.execute("UPDATE orders SET payment_id = 'pay-y' WHERE request_id = 'b'")
