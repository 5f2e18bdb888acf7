"""An order's life after the 201 through an in-process gateway's HTTP test
client: a sku with a payment window, and its orders paid or cancelled."""

from __future__ import annotations

from typing import Any

import asyncpg

from testkit.purchases import ADMIN_HEADERS, Client

PAYMENT_TOKEN = "test-payment-token"
PAY_HEADERS = {"Authorization": f"Bearer {PAYMENT_TOKEN}"}


async def start(start_gateway: Any, **overrides: Any) -> Client:
    """A gateway that takes payments and sweeps every 50 ms."""
    client: Client = await start_gateway(
        payment_token=PAYMENT_TOKEN, expiry_sweep_s=0.05, **overrides
    )
    return client


async def put_window(
    client: Client, sku: str, stock: int, window_s: int, strategy: str | None = None
) -> None:
    """Create the sku with a payment window."""
    body: dict[str, Any] = {"stock": stock, "payment_window_s": window_s, "strategy": strategy}
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def pay(client: Client, sku: str, rid: str, payment_id: str) -> tuple[int, Any]:
    """``POST /v1/orders/<sku>.<rid>/pay``."""
    resp = await client.post(
        f"/v1/orders/{sku}.{rid}/pay", json={"payment_id": payment_id}, headers=PAY_HEADERS
    )
    return resp.status, await resp.json()


async def cancel(
    client: Client, sku: str, rid: str, *, headers: dict[str, str] | None = None, **body: Any
) -> tuple[int, Any]:
    """``POST /v1/orders/<sku>.<rid>/cancel`` (with ``body``, e.g. a reason)."""
    resp = await client.post(
        f"/v1/orders/{sku}.{rid}/cancel", json=body or None, headers=headers or PAY_HEADERS
    )
    return resp.status, await resp.json()


async def refund(
    client: Client, sku: str, rid: str, *, restock: bool, reason: str | None = None
) -> tuple[int, Any]:
    """``POST /v1/orders/<sku>.<rid>/refund``."""
    body: dict[str, Any] = {"restock": restock}
    if reason is not None:
        body["reason"] = reason
    resp = await client.post(f"/v1/orders/{sku}.{rid}/refund", json=body, headers=PAY_HEADERS)
    return resp.status, await resp.json()


async def status_of(client: Client, sku: str, rid: str, user: str) -> str:
    """The order's status, as ``GET /v1/orders/{request_id}`` answers it."""
    resp = await client.get(f"/v1/orders/{sku}.{rid}", params={"user_id": user})
    body: dict[str, Any] = await resp.json()
    return str(body["status"])


async def available(client: Client, sku: str) -> int:
    """``GET /v1/skus/{sku}``'s units on sale."""
    resp = await client.get(f"/v1/skus/{sku}")
    return int((await resp.json())["available"])


async def books(database_url: str, sku: str) -> dict[str, int]:
    """The sku's stock, units by order status (``refunded_kept``: refunded
    without restock), and units returned by reason."""
    con = await asyncpg.connect(database_url)
    try:
        stock = await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
        rows = await con.fetch(
            "SELECT status || CASE WHEN restocked IS FALSE THEN '_kept' ELSE '' END AS status,"
            " sum(qty) AS units FROM orders WHERE sku = $1 GROUP BY 1",
            sku,
        )
        moved = await con.fetch(
            "SELECT reason, sum(delta) AS units, count(*) AS n FROM stock_movements"
            " WHERE sku = $1 GROUP BY reason",
            sku,
        )
    finally:
        await con.close()
    found = {"stock": stock, **{r["status"]: r["units"] for r in rows}}
    for r in moved:
        found[f"moved_{r['reason']}"] = r["units"]
        found[f"movements_{r['reason']}"] = r["n"]
    return found


# Movements that return what an order took: not provided by the admin.
RETURNS = ("expired", "cancelled", "refunded")


def balanced(found: dict[str, int]) -> bool:
    """provided (the admin's movements) = on sale + held + paid/confirmed + units
    refunded without restock (they left the stock for good)."""
    provided = sum(v for k, v in found.items() if k.startswith("moved_")) - sum(
        found.get(f"moved_{r}", 0) for r in RETURNS
    )
    gone = sum(found.get(s, 0) for s in ("pending_payment", "paid", "confirmed", "refunded_kept"))
    return provided == found["stock"] + gone
