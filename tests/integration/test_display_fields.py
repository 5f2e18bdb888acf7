"""A sku's display fields through the admin API (issue 34): set, read back by the
admin and the public API, cleared, logged; and every malformed one refused
with a typed answer, storing nothing. A real in-process gateway on the shared
Redis and PostgreSQL."""

from __future__ import annotations

from typing import Any

from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from testkit.logs import events
from testkit.purchases import Client, admin

IMAGES = "https://img.shop.example"
DESK = {
    "title": "Standing desk «kick» 站立桌",
    "image_url": f"{IMAGES}/desk.jpg?v=2",
    "price_text": "¥99",
}


async def shown(client: Client, sku: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The display fields the admin report and the public sku answer (those set)."""
    _, report = await admin(client, "GET", f"/admin/skus/{sku}", None)
    public = await (await client.get(f"/v1/skus/{sku}")).json()
    return (
        {k: report[k] for k in DESK if k in report},
        {k: public[k] for k in DESK if k in public},
    )


class TestDisplayFields:
    """Set, read back and cleared; each change logged with before and after."""

    async def test_set_read_back_cleared_and_logged(self, start_gateway: Any, sku: str) -> None:
        """A PUT sets the three fields (the answer shows them); the admin GET and
        GET /v1/skus/{sku} read them back; a PATCH of the stock keeps them; a
        PATCH with a null title clears that one alone; a PUT without them
        clears them all. A field not set is absent from every answer. Each
        change is an admin_change line with [before, after]."""
        client = await start_gateway(waiting_page_image_origins=frozenset({IMAGES}))
        base = f"/admin/skus/{sku}"
        with capture_logs(processors=[merge_contextvars]) as logs:
            status, answer = await admin(client, "PUT", base, {"stock": 3, **DESK})
            assert status == 200 and {k: answer[k] for k in DESK} == DESK
            assert await shown(client, sku) == (DESK, DESK)
            assert (await admin(client, "PATCH", base, {"stock": 4}))[0] == 200
            assert await shown(client, sku) == (DESK, DESK)
            status, answer = await admin(client, "PATCH", base, {"title": None})
            assert status == 200 and "title" not in answer
            untitled = {k: v for k, v in DESK.items() if k != "title"}
            assert await shown(client, sku) == (untitled, untitled)
            status, answer = await admin(client, "PUT", base, {"stock": 4})
            assert status == 200 and answer.keys().isdisjoint(DESK)
            assert await shown(client, sku) == ({}, {})
        changes = [c["set"] for c in events(logs, "admin_change")]
        assert {k: changes[0][k] for k in DESK} == {k: [None, v] for k, v in DESK.items()}
        assert changes[1] == {"stock": [3, 4]}
        assert changes[2] == {"title": [DESK["title"], None]}
        assert changes[3]["image_url"] == [DESK["image_url"], None]


class TestRefused:
    """Malformed display fields: a typed 4xx with a JSON body, nothing stored."""

    async def test_each_bad_field_is_refused_and_nothing_changes(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Off the listed origins (also by scheme or port) is 422
        image_origin_not_allowed; not an http(s) URL, credentials, spaces,
        too long, control characters, empty, or not a string is 400
        invalid_request. Each is logged as admin_refused; the sku keeps what it
        had, and a sku never created is not created."""
        client = await start_gateway(waiting_page_image_origins=frozenset({IMAGES}))
        base = f"/admin/skus/{sku}"
        assert (await admin(client, "PUT", base, {"stock": 1, **DESK}))[0] == 200
        refused: list[tuple[dict[str, Any], int, str]] = [
            ({"image_url": "https://evil.example/x.png"}, 422, "image_origin_not_allowed"),
            ({"image_url": "http://img.shop.example/x.png"}, 422, "image_origin_not_allowed"),
            ({"image_url": f"{IMAGES}:8443/x.png"}, 422, "image_origin_not_allowed"),
            ({"image_url": "javascript:alert(1)"}, 400, "invalid_request"),
            ({"image_url": "data:image/png;base64,AAAA"}, 400, "invalid_request"),
            ({"image_url": "desk.jpg"}, 400, "invalid_request"),
            ({"image_url": f"https://u:p@{IMAGES[8:]}/x.png"}, 400, "invalid_request"),
            ({"image_url": f"{IMAGES}/a b.png"}, 400, "invalid_request"),
            ({"image_url": f"{IMAGES}/{'x' * 2048}"}, 400, "invalid_request"),
            ({"image_url": 7}, 400, "invalid_request"),
            ({"title": "x" * 201}, 400, "invalid_request"),
            ({"title": ""}, 400, "invalid_request"),
            ({"title": "Desk\nnew line"}, 400, "invalid_request"),
            ({"title": "Desk\u009b31m"}, 400, "invalid_request"),
            ({"title": ["Desk"]}, 400, "invalid_request"),
            ({"price_text": "9" * 41}, 400, "invalid_request"),
            ({"price_text": "\x1b[31m¥99"}, 400, "invalid_request"),
            ({"price_text": 99}, 400, "invalid_request"),
        ]
        with capture_logs(processors=[merge_contextvars]) as logs:
            for body, status, code in refused:
                for method in ("PATCH", "PUT"):
                    got = await admin(client, method, base, {"stock": 2, **body})
                    assert got[0] == status and got[1]["error"] == code, (method, body, got)
            fresh = await admin(client, "PUT", f"{base}-new", {"stock": 1, **refused[0][0]})
            assert fresh[0] == 422
        assert events(logs, "admin_change") == []
        assert len(events(logs, "admin_refused")) == 2 * len(refused) + 1
        assert await shown(client, sku) == (DESK, DESK)
        _, report = await admin(client, "GET", base, None)
        assert report["db_stock"] == 1
        assert (await admin(client, "GET", f"{base}-new", None))[0] == 404

    async def test_without_image_origins_every_image_is_refused(
        self, start_gateway: Any, sku: str
    ) -> None:
        """With GATEWAY_WAITING_PAGE_IMAGE_ORIGINS unset, any image_url is 422
        image_origin_not_allowed; a title and a price alone are fine."""
        client = await start_gateway()
        base = f"/admin/skus/{sku}"
        got = await admin(client, "PUT", base, {"stock": 1, **DESK})
        assert got[0] == 422 and got[1]["error"] == "image_origin_not_allowed"
        assert "GATEWAY_WAITING_PAGE_IMAGE_ORIGINS" in got[1]["detail"]
        body = {"stock": 1, "title": DESK["title"], "price_text": DESK["price_text"]}
        assert (await admin(client, "PUT", base, body))[0] == 200
        assert (
            await shown(client, sku) == ({k: v for k, v in DESK.items() if k != "image_url"},) * 2
        )
