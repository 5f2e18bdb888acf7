"""An order's life after the 201 through an in-process gateway's HTTP test
client: a sku with a payment window, and its orders paid or cancelled."""

from __future__ import annotations

from typing import Any

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


async def cancel(client: Client, sku: str, rid: str) -> tuple[int, Any]:
    """``POST /v1/orders/<sku>.<rid>/cancel``."""
    resp = await client.post(f"/v1/orders/{sku}.{rid}/cancel", headers=PAY_HEADERS)
    return resp.status, await resp.json()
