"""The stock audit's exit codes and messages: a duplicate user caught without the
unique constraint, an unknown sku and an unreachable store."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from gateway.domain.errors import UnknownSku
from gateway.ops.audit import Finding, audit
from gateway.postgres.database import migrate
from gateway.settings import Settings
from testkit.commands import run_audit
from testkit.purchases import put_sku
from testkit.services import create_database, drop_database


class TestDuplicateUser:
    """A user with two orders of one sku is caught even without the constraint."""

    async def test_two_orders_of_one_user_without_the_unique_constraint(
        self, make_settings: Callable[..., Settings]
    ) -> None:
        """In a throwaway database whose unique live (sku, user_id) was dropped, two
        orders of one user balance the books yet are DUPLICATE_USER (exit 1)."""
        name = f"flashsale_audit_{uuid.uuid4().hex[:8]}"
        url = await create_database(name)
        try:
            con = await asyncpg.connect(url)
            try:
                await migrate(con)
                await con.execute("DROP INDEX orders_live_buyer")
                await con.execute("INSERT INTO inventory (sku, stock) VALUES ('dup', 0)")
                await con.execute(
                    "INSERT INTO stock_movements (sku, delta, reason, stock_after)"
                    " VALUES ('dup', 2, 'set', 2)"
                )
                await con.execute(
                    "INSERT INTO orders (request_id, sku, user_id, qty)"
                    " VALUES ('r1', 'dup', 'u1', 1), ('r2', 'dup', 'u1', 1)"
                )
            finally:
                await con.close()
            settings = make_settings(database_url=url)

            [row] = await audit(settings)
            assert (row.orders, row.users, row.duplicate_users) == (2, 1, 1)
            assert row.findings == (Finding.DUPLICATE_USER,)
            assert (await run_audit(settings))[0] == 1
        finally:
            await drop_database(name)


class TestUsage:
    """An unknown sku or an unreachable store is exit 2 with a one-line error."""

    async def test_unknown_sku(self, make_settings: Callable[..., Settings], sku: str) -> None:
        """A sku not in the inventory raises UnknownSku; the command exits 2."""
        settings = make_settings()
        with pytest.raises(UnknownSku):
            await audit(settings, sku)
        code, out, err = await run_audit(settings, "--sku", sku)
        assert (code, out) == (2, "")
        assert err == f"flashsale-gateway audit: no sku {sku!r}\n"

    @pytest.mark.parametrize(
        ("store", "url"),
        [
            ("redis", "redis://127.0.0.1:1/0"),
            ("postgres", "postgresql://postgres@127.0.0.1:1/flashsale"),
        ],
    )
    async def test_unreachable_store(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        store: str,
        url: str,
    ) -> None:
        """Nothing listening on the store's port: exit 2, one line naming the
        store's setting and URL, and that nothing answers there."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        field = "redis_url" if store == "redis" else "database_url"
        code, out, err = await run_audit(make_settings(**{field: url}), "--sku", sku)
        assert (code, out) == (2, "")
        setting = f"GATEWAY_{field.upper()}"
        assert err == f"flashsale-gateway audit: {setting}={url}: nothing answers at 127.0.0.1:1\n"
