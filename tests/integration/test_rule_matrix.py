"""Every sale rule against every strategy (issue 19): a matrix, so a strategy
added to :class:`gateway.domain.model.Strategy` is run against every rule without
anyone remembering to add it here.

Each cell is one in-process gateway on real Redis and PostgreSQL, one sku on
that strategy with the rule set, and the answers a buyer sees through HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.domain.model import Strategy
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client
from testkit.rooms import SECRET

PAYMENT_TOKEN = "test-payment-token"
PAY_HEADERS = {"Authorization": f"Bearer {PAYMENT_TOKEN}"}

# What a purchase that got through answers: 201, or 202 for the asynchronous one.
ACCEPTED = {Strategy.QUEUE: 202}


def stamp(instant: datetime) -> str:
    """RFC 3339, as a client sends it."""
    return instant.isoformat()


async def put(client: Client, sku: str, strategy: Strategy, **fields: Any) -> None:
    """PUT the sku on ``strategy`` with 5 units (unless ``fields`` say otherwise)
    and ``fields``; asserts a 200."""
    body = {"stock": 5, "strategy": strategy.value, **fields}
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def post(
    client: Client, sku: str, user: str, rid: str, qty: int = 1
) -> tuple[int, dict[str, Any]]:
    """One purchase without an admission token; (status, body)."""
    body = {"sku": sku, "user_id": user, "qty": qty, "request_id": f"{sku}.{rid}"}
    resp = await client.post("/v1/purchase", json=body)
    return resp.status, await resp.json()


async def not_started(client: Client, sku: str, strategy: Strategy) -> None:
    """A sale starting in an hour answers 409 not_started with its start."""
    starts = datetime.now(UTC) + timedelta(hours=1)
    await put(client, sku, strategy, starts_at=stamp(starts))
    status, body = await post(client, sku, "u1", "r1")
    assert (status, body["status"]) == (409, "not_started"), body
    assert body["starts_at"] == starts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def ended(client: Client, sku: str, strategy: Strategy) -> None:
    """A sale that ended a minute ago answers 409 ended."""
    await put(client, sku, strategy, ends_at=stamp(datetime.now(UTC) - timedelta(minutes=1)))
    assert await post(client, sku, "u1", "r1") == (409, {"status": "ended"})


async def user_rate(client: Client, sku: str, strategy: Strategy) -> None:
    """With a user rate of one token per 100 s, a user's second try is 429 (it
    takes a token before the duplicate check, as every strategy does), another
    user's first is not."""
    await put(client, sku, strategy, user_rate="0.01/s:1")
    assert (await post(client, sku, "u1", "r1"))[0] == ACCEPTED.get(strategy, 201)
    assert await post(client, sku, "u1", "r2") == (429, {"error": "rate_limited"})
    assert (await post(client, sku, "u2", "r3"))[0] == ACCEPTED.get(strategy, 201)


async def client_rate(client: Client, sku: str, strategy: Strategy) -> None:
    """With a client-address rate of one per 100 s, a second user from the same
    address is 429."""
    await put(client, sku, strategy, client_rate="0.01/s:1")
    assert (await post(client, sku, "u1", "r1"))[0] == ACCEPTED.get(strategy, 201)
    assert await post(client, sku, "u2", "r2") == (429, {"error": "rate_limited"})


async def waiting_room(client: Client, sku: str, strategy: Strategy) -> None:
    """A sku sold through a waiting room refuses a purchase without a token (428)."""
    await put(client, sku, strategy, waiting_room={"admit_per_s": 10, "token_ttl_s": 60})
    status, body = await post(client, sku, "u1", "r1")
    assert (status, body["error"]) == (428, "admission_required"), body


async def waiting_room_sold_out(client: Client, sku: str, strategy: Strategy) -> None:
    """A waiting-room sku with nothing left answers 409 sold_out, token or not."""
    await put(client, sku, strategy, stock=0, waiting_room={"admit_per_s": 10, "token_ttl_s": 60})
    assert await post(client, sku, "u1", "r1") == (409, {"status": "sold_out"})


async def per_user_limit(client: Client, sku: str, strategy: Strategy) -> None:
    """More units than the per-user limit is a 400; the limit itself goes through."""
    await put(client, sku, strategy, per_user_limit=2)
    status, body = await post(client, sku, "u1", "r1", qty=3)
    assert (status, body["error"]) == (400, "invalid_request"), body
    assert (await post(client, sku, "u1", "r2", qty=2))[0] == ACCEPTED.get(strategy, 201)


async def one_order_per_buyer(client: Client, sku: str, strategy: Strategy) -> None:
    """A buyer's second purchase under another request id is 409 duplicate."""
    await put(client, sku, strategy)
    assert (await post(client, sku, "u1", "r1"))[0] == ACCEPTED.get(strategy, 201)
    assert await post(client, sku, "u1", "r2") == (409, {"status": "duplicate"})


async def payment_window(client: Client, sku: str, strategy: Strategy) -> None:
    """With a 1 s payment window the order is pending_payment until it expires;
    its unit is then bought by another buyer, and the late payment is 409."""
    await put(client, sku, strategy, stock=1, payment_window_s=1)
    assert (await post(client, sku, "u1", "r1"))[0] == ACCEPTED.get(strategy, 201)

    async def status_of_r1() -> str:
        resp = await client.get(f"/v1/orders/{sku}.r1", params={"user_id": "u1"})
        return str((await resp.json())["status"])

    await wait_for(lambda: _is(status_of_r1(), "pending_payment"), what="r1 pending")
    await wait_for(lambda: _is(status_of_r1(), "expired"), within=10, what="r1 expired")

    async def bought() -> bool:
        return (await post(client, sku, "u2", "r2"))[0] == ACCEPTED.get(strategy, 201)

    await wait_for(bought, within=5, what="u2 buys the unit back on sale")
    resp = await client.post(
        f"/v1/orders/{sku}.r1/pay", json={"payment_id": f"{sku}.p1"}, headers=PAY_HEADERS
    )
    assert (resp.status, (await resp.json())["error"]) == (409, "order_expired")


async def _is(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


RULES: dict[str, Callable[[Client, str, Strategy], Awaitable[None]]] = {
    rule.__name__: rule
    for rule in (
        not_started,
        ended,
        user_rate,
        client_rate,
        waiting_room,
        waiting_room_sold_out,
        per_user_limit,
        one_order_per_buyer,
        payment_window,
    )
}


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
@pytest.mark.parametrize("rule", list(RULES))
async def test_rule_holds_on_strategy(
    start_gateway: Any, sku: str, rule: str, strategy: Strategy
) -> None:
    """Each rule answers the same on every strategy (the sku's own strategy,
    through one gateway that serves them all)."""
    client = await start_gateway(admission_secret=SECRET, payment_token=PAYMENT_TOKEN)
    await RULES[rule](client, sku, strategy)
