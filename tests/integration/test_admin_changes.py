"""The admin trail and PATCH /admin/skus/{sku} (issue 19), read from the log a
real in-process gateway writes, on real Redis and PostgreSQL."""

from __future__ import annotations

from typing import Any

from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from gateway.http.admin_tokens import fingerprint
from testkit.logs import events
from testkit.purchases import ADMIN_TOKEN, admin

ROOM = {"admit_per_s": 5, "token_ttl_s": 60, "shuffle_at_start": False}
WINDOW = {"starts_at": "2030-01-01T10:00:00.000Z", "ends_at": "2030-01-01T12:00:00.000Z"}


class TestAdminTrail:
    """One admin_change per change that took effect, saying what was set; one
    admin_refused, with its status, per refused request; never the token."""

    async def test_changes_and_refusals_are_logged_as_what_they_were(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A PUT creating the sku, a PATCH and a restock are three admin_change
        lines with old -> new; a restock of 0 and of -5, one of an unknown sku,
        a PUT with a bad window, a PATCH of an unknown sku and a wrong token are
        refused lines with their status, and change nothing."""
        client = await start_gateway()
        base = f"/admin/skus/{sku}"
        with capture_logs(processors=[merge_contextvars]) as logs:
            assert (await admin(client, "PUT", base, {"stock": 5, **WINDOW}))[0] == 200
            assert (await admin(client, "PATCH", base, {"stock": 8}))[0] == 200
            assert (await admin(client, "POST", f"{base}/restock", {"delta": 2}))[0] == 200
            refused = [
                ("POST", f"{base}/restock", {"delta": 0}, ADMIN_TOKEN, 400),
                ("POST", f"{base}/restock", {"delta": -5}, ADMIN_TOKEN, 400),
                ("POST", f"{base}-none/restock", {"delta": 1}, ADMIN_TOKEN, 404),
                ("PUT", base, {"stock": "many"}, ADMIN_TOKEN, 400),
                ("PATCH", f"{base}-none", {"stock": 1}, ADMIN_TOKEN, 404),
                ("PATCH", base, {"stock": 1}, "wrong-token", 401),
            ]
            for method, path, body, token, status in refused:
                assert (await admin(client, method, path, body, token))[0] == status, path
            # A PUT without the start clears it: a change, logged as one.
            ended = {"stock": 1, "ends_at": "2000-01-01T00:00:00Z"}
            assert (await admin(client, "PUT", base, ended))[0] == 200
        changes = events(logs, "admin_change")
        mine = fingerprint(ADMIN_TOKEN)
        assert [(c["change"], c["token"], c["sku"]) for c in changes] == [
            ("put_sku", mine, sku),
            ("patch_sku", mine, sku),
            ("restock", mine, sku),
            ("put_sku", mine, sku),
        ]
        assert changes[0]["created"] is True
        assert changes[0]["set"]["stock"] == [None, 5]
        assert changes[0]["set"]["starts_at"] == [None, WINDOW["starts_at"]]
        assert changes[1]["set"] == {"stock": [5, 8]}
        assert changes[2]["set"] == {"stock": [8, 10]}
        assert changes[3]["set"]["starts_at"] == [WINDOW["starts_at"], None]
        assert changes[3]["set"]["ends_at"] == [WINDOW["ends_at"], "2000-01-01T00:00:00.000Z"]
        refusals = events(logs, "admin_refused")
        assert [(r["change"], r["status"]) for r in refusals] == [
            ("restock", 400),
            ("restock", 400),
            ("restock", 404),
            ("put_sku", 400),
            ("patch_sku", 404),
            ("patch_sku", 401),
        ]
        assert [r["token"] for r in refusals] == [mine] * 5 + [None]
        assert ADMIN_TOKEN not in repr(logs)


class TestPatch:
    """PATCH /admin/skus/{sku} changes the fields it names and nothing else."""

    async def test_stock_alone_keeps_the_window_room_and_rates(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A sku with a window, a waiting room, a rate, a limit and a strategy
        gets new stock by PATCH: every other field is as it was; a PATCH can
        also clear one field (``null``) and switch the strategy."""
        client = await start_gateway(admission_secret="patch-test-admission-secret")
        full = {
            "stock": 3,
            "per_user_limit": 2,
            **WINDOW,
            "user_rate": "5/s:10",
            "client_rate": "off",
            "waiting_room": ROOM,
            "strategy": "sql-direct",
        }
        status, put = await admin(client, "PUT", f"/admin/skus/{sku}", full)
        assert status == 200, put
        status, patched = await admin(client, "PATCH", f"/admin/skus/{sku}", {"stock": 10})
        assert status == 200, patched
        assert patched == {**put, "stock": 10}
        shown = await (await client.get(f"/v1/skus/{sku}")).json()
        assert (shown["available"], shown["starts_at"]) == (10, WINDOW["starts_at"])
        body = {"starts_at": None, "strategy": "reserve-batch"}
        status, cleared = await admin(client, "PATCH", f"/admin/skus/{sku}", body)
        assert status == 200, cleared
        assert cleared == {
            **put,
            "stock": 10,
            "starts_at": None,
            "strategy": "reserve-batch",
            "redis_stock": 10,
        }

    async def test_bad_patches_are_400_and_change_nothing(
        self, start_gateway: Any, sku: str
    ) -> None:
        """An empty PATCH, an unknown field, a null stock and an end before the
        stored start are each a 400, and the sku stays as it was."""
        client = await start_gateway()
        status, put = await admin(client, "PUT", f"/admin/skus/{sku}", {"stock": 4, **WINDOW})
        assert status == 200, put
        for body in (
            {},
            {"colour": "red"},
            {"stock": None},
            {"ends_at": "2029-12-31T00:00:00Z"},
        ):
            status, answer = await admin(client, "PATCH", f"/admin/skus/{sku}", body)
            assert (status, answer["error"]) == (400, "invalid_request"), body
        status, same = await admin(client, "PATCH", f"/admin/skus/{sku}", {"per_user_limit": 1})
        assert (status, same) == (200, put)
