"""Waiting-room helpers for tests: a sku with a room, joins, polls, token purchases."""

from __future__ import annotations

from typing import Any

from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client

SECRET = "test-admission-secret-0123456789"
OLD_SECRET = "old-admission-secret-0123456789"


async def put_room_sku(
    client: Client, sku: str, stock: int, admit_per_s: int = 100, token_ttl_s: int = 60
) -> dict[str, Any]:
    """Create or reset a sku with a waiting room; the admin answer (asserts a 200)."""
    body = {
        "stock": stock,
        "waiting_room": {"admit_per_s": admit_per_s, "token_ttl_s": token_ttl_s},
    }
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


async def join(client: Client, sku: str, user: str) -> tuple[int, dict[str, Any]]:
    """``POST /v1/queue/{sku}``; (status, body)."""
    resp = await client.post(f"/v1/queue/{sku}", json={"user_id": user})
    return resp.status, await resp.json()


async def poll(client: Client, sku: str, ticket: str) -> dict[str, Any]:
    """``GET /v1/queue/{sku}/{ticket}`` (asserts a 200); the body."""
    resp = await client.get(f"/v1/queue/{sku}/{ticket}")
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def admitted_token(client: Client, sku: str, ticket: str, within: float = 10.0) -> str:
    """Poll ``ticket`` until it is admitted; its admission token."""

    async def token() -> str | None:
        body = await poll(client, sku, ticket)
        return str(body["admission_token"]) if body["status"] == "admitted" else None

    return await wait_for(token, within=within, what=f"ticket {ticket} admitted")


async def buy_with(
    client: Client, sku: str, user: str, token: str | None, rid: str, qty: int = 1
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/purchase`` with an ``Admission-Token`` (if given); (status, body)."""
    headers = {} if token is None else {"Admission-Token": token}
    body = {"sku": sku, "user_id": user, "qty": qty, "request_id": f"{sku}.{rid}"}
    resp = await client.post("/v1/purchase", json=body, headers=headers)
    return resp.status, await resp.json()
