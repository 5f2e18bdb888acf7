"""Every 4xx the API promises, with its JSON body; no input yields a 500."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.purchases import ADMIN_HEADERS, counts, put_sku

BAD_PURCHASES: list[tuple[str, bytes, str]] = [
    ("malformed JSON", b'{"sku": ', "not valid JSON"),
    ("not an object", b"[1, 2]", "JSON object"),
    ("missing sku", b'{"user_id": "u"}', "sku is required"),
    ("missing user", b'{"sku": "SKU"}', "user_id is required"),
    ("extra field", b'{"sku": "SKU", "user_id": "u", "price": 1}', "unknown fields: price"),
    ("boolean qty", b'{"sku": "SKU", "user_id": "u", "qty": true}', "qty must be an integer"),
    ("float qty", b'{"sku": "SKU", "user_id": "u", "qty": 1.0}', "qty must be an integer"),
    ("string qty", b'{"sku": "SKU", "user_id": "u", "qty": "1"}', "qty must be an integer"),
    ("zero qty", b'{"sku": "SKU", "user_id": "u", "qty": 0}', "qty must be from 1"),
    ("huge qty", b'{"sku": "SKU", "user_id": "u", "qty": 99999999999999999999}', ""),
    ("bad characters", b'{"sku": "SKU", "user_id": "a b"}', "user_id must be 1 to 64"),
    ("too long", b'{"sku": "SKU", "user_id": "' + b"x" * 65 + b'"}', "user_id must be 1 to 64"),
    ("empty id", b'{"sku": "SKU", "user_id": ""}', "user_id must be 1 to 64"),
    ("numeric user", b'{"sku": "SKU", "user_id": 7}', "user_id must be a string"),
    ("bad request id", b'{"sku": "SKU", "user_id": "u", "request_id": "a/b"}', "request_id"),
    ("not utf-8", b'{"sku": "\xff"}', "not valid JSON"),
]
# The same field twice, in any spelling JSON allows: which was meant is not guessed.
DUPLICATE_KEYS: list[tuple[str, bytes]] = [
    ("user_id twice", b'{"sku": "SKU", "user_id": "b2", "user_id": "b3"}'),
    ("escaped spelling", b'{"sku": "SKU", "user_id": "b2", "\\u0075ser_id": "b3"}'),
    ("sku twice, same value", b'{"sku": "SKU", "sku": "SKU", "user_id": "b2"}'),
    ("a comma in a value", b'{"sku": "SKU", "user_id": "b,2", "user_id": "b3"}'),
]


class TestPurchaseValidation:
    """Malformed purchases get 400 invalid_request with a detail, and change nothing."""

    @pytest.mark.parametrize(
        ("case", "body", "detail"), BAD_PURCHASES, ids=[c[0] for c in BAD_PURCHASES]
    )
    async def test_bad_body(
        self, start_gateway: Any, sku: str, case: str, body: bytes, detail: str
    ) -> None:
        """Each malformed body is a 400 with a JSON error naming what is wrong."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        resp = await client.post("/v1/purchase", data=body.replace(b"SKU", sku.encode()))
        assert resp.status == 400
        assert resp.content_type == "application/json"
        payload = await resp.json()
        assert payload["error"] == "invalid_request"
        assert detail in payload["detail"]
        report = await (await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
        assert report["sold"] == 0 and report["redis_stock"] == 5

    @pytest.mark.parametrize(("case", "body"), DUPLICATE_KEYS, ids=[c[0] for c in DUPLICATE_KEYS])
    async def test_a_field_given_twice(
        self, start_gateway: Any, sku: str, case: str, body: bytes
    ) -> None:
        """A body naming a field twice is a 400 duplicate_key naming the field,
        and sells nothing (orjson alone would keep the last value: a 201 for b3)."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        resp = await client.post("/v1/purchase", data=body.replace(b"SKU", sku.encode()))
        assert resp.status == 400
        payload = await resp.json()
        assert payload["error"] == "duplicate_key"
        assert "given more than once" in payload["detail"]
        report = await (await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
        assert report["sold"] == 0 and report["redis_stock"] == 5

    async def test_a_field_given_twice_inside_an_object(self, start_gateway: Any, sku: str) -> None:
        """A waiting room naming admit_per_s twice is refused as the purchase is,
        and the sku is not created."""
        client = await start_gateway(admission_secret="duplicate-key-secret")
        room = b'{"admit_per_s": 1, "admit_per_s": 100, "token_ttl_s": 60}'
        resp = await client.put(
            f"/admin/skus/{sku}",
            data=b'{"stock": 5, "waiting_room": ' + room + b"}",
            headers=ADMIN_HEADERS,
        )
        assert (resp.status, (await resp.json())["error"]) == (400, "duplicate_key")
        resp = await client.get(f"/v1/skus/{sku}")
        assert resp.status == 404

    async def test_a_body_nested_deep_is_a_400(self, start_gateway: Any, sku: str) -> None:
        """A body nested as deep as orjson parses (a thousand arrays), which the
        duplicate check parses again, is a 400, never a 500."""
        client = await start_gateway()
        deep = b"[" * 1000 + b"1, 2" + b"]" * 1000
        resp = await client.post("/v1/purchase", data=b'{"sku": ' + deep + b', "user_id": "u"}')
        assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")

    async def test_bad_idempotency_key(self, start_gateway: Any, sku: str) -> None:
        """A malformed Idempotency-Key header is a 400 too."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        resp = await client.post(
            "/v1/purchase", json={"sku": sku, "user_id": "u"}, headers={"Idempotency-Key": "a b"}
        )
        assert resp.status == 400

    async def test_unknown_sku(self, start_gateway: Any) -> None:
        """A sku that does not exist is a 404 unknown_sku."""
        client = await start_gateway()
        resp = await client.post("/v1/purchase", json={"sku": "no-such-sku", "user_id": "u"})
        assert resp.status == 404
        assert (await resp.json())["error"] == "unknown_sku"

    async def test_body_over_four_kib(self, start_gateway: Any, sku: str) -> None:
        """A body over 4 KiB is a 413 too_large, declared or chunked."""
        client = await start_gateway()
        big = b'{"sku": "' + b"x" * 5000 + b'"}'
        resp = await client.post("/v1/purchase", data=big)
        assert resp.status == 413
        assert (await resp.json())["error"] == "too_large"

        async def chunks() -> Any:
            for _ in range(5):
                yield b" " * 1000

        resp = await client.post("/v1/purchase", data=chunks())
        assert resp.status == 413
        assert (await resp.json())["error"] == "too_large"


class TestRoutes:
    """Unknown routes and methods answer JSON too."""

    async def test_unknown_route_and_method(self, start_gateway: Any) -> None:
        """404 and 405 carry a JSON error body."""
        client = await start_gateway()
        resp = await client.get("/nope")
        assert (resp.status, (await resp.json())["error"]) == (404, "not_found")
        resp = await client.get("/v1/purchase")
        assert (resp.status, (await resp.json())["error"]) == (405, "method_not_allowed")

    async def test_sku_availability(self, start_gateway: Any, sku: str) -> None:
        """GET /v1/skus/{sku} shows what Redis has left, the strategy the sku
        sells under and the sale window (none here); unknown skus are 404."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        resp = await client.get(f"/v1/skus/{sku}")
        assert await resp.json() == {
            "sku": sku,
            "available": 3,
            "strategy": "reserve-batch",
            "starts_at": None,
            "ends_at": None,
            "waiting_room": False,
        }
        assert (await client.get("/v1/skus/other-sku")).status == 404

    async def test_health_and_readiness(self, start_gateway: Any) -> None:
        """/healthz answers; /readyz reports Redis and PostgreSQL up."""
        client = await start_gateway()
        assert (await client.get("/healthz")).status == 200
        resp = await client.get("/readyz")
        assert resp.status == 200
        assert (await resp.json())["redis"] is True


class TestAdmin:
    """Admin routes need the bearer token, compared in constant time."""

    async def test_token_missing_or_wrong(self, start_gateway: Any, sku: str) -> None:
        """Without or with a wrong token: 401 unauthorized."""
        client = await start_gateway()
        resp = await client.put(f"/admin/skus/{sku}", json={"stock": 1})
        assert (resp.status, (await resp.json())["error"]) == (401, "unauthorized")
        resp = await client.put(
            f"/admin/skus/{sku}", json={"stock": 1}, headers={"Authorization": "Bearer nope"}
        )
        assert resp.status == 401

    async def test_admin_off_without_token(self, start_gateway: Any, sku: str) -> None:
        """With no admin token configured, admin routes answer 403."""
        client = await start_gateway(admin_token=None)
        resp = await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
        assert (resp.status, (await resp.json())["error"]) == (403, "forbidden")

    @pytest.mark.parametrize(
        "body",
        [{"stock": -1}, {"stock": 1.5}, {"stock": True}, {"stock": 1, "per_user_limit": 0}, {}],
    )
    async def test_bad_sku_bodies(self, start_gateway: Any, sku: str, body: dict[str, Any]) -> None:
        """Negative, fractional, boolean or missing stock and a zero limit are 400s."""
        client = await start_gateway()
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")

    async def test_restock_and_reset(self, start_gateway: Any, sku: str) -> None:
        """Restock adds to both stores; a reset sets remaining stock; orders stay."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        assert (await client.post("/v1/purchase", json={"sku": sku, "user_id": "a"})).status == 201
        sold_out = await client.post("/v1/purchase", json={"sku": sku, "user_id": "b"})
        assert (await sold_out.json())["status"] == "sold_out"
        resp = await client.post(
            f"/admin/skus/{sku}/restock", json={"delta": 2}, headers=ADMIN_HEADERS
        )
        assert resp.status == 200
        assert (await client.post("/v1/purchase", json={"sku": sku, "user_id": "b"})).status == 201
        await put_sku(client, sku, 10)
        report = await (await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
        assert counts(report) == {"db_stock": 10, "redis_stock": 10, "pending": 0, "sold": 2}
        resp = await client.post(
            "/admin/skus/nope/restock", json={"delta": 1}, headers=ADMIN_HEADERS
        )
        assert resp.status == 404
        resp = await client.post(
            f"/admin/skus/{sku}/restock", json={"delta": 0}, headers=ADMIN_HEADERS
        )
        assert resp.status == 400
