"""The three failures a schema fuzzer found in ``ccdf30d`` (issue 20), each kept
as a test, with the checks that came with their fixes.

1. ``422 idempotency_mismatch`` answered with a code the schema's Error lacked.
2. An ``Admission-Token`` longer than the schema allows accepted (201) on a sku
   without a waiting room: a header was checked only when the sku used it.
3. A waiting room accepted on an instance that cannot sign its tokens, and every
   buyer answered 503 at sale time: now refused when configured, and reported at
   start-up and in ``/readyz`` when it reaches such an instance anyway.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog

from testkit.purchases import ADMIN_HEADERS, buy, put_sku
from testkit.rooms import SECRET
from testkit.schema import component, responses
from testkit.services import create_database, drop_database

ROOM = {"admit_per_s": 10, "token_ttl_s": 60}


def error_codes() -> set[str]:
    """The codes the published Error schema allows."""
    return set(component("Error")["properties"]["error"]["enum"])


async def test_idempotency_mismatch_answers_inside_the_schema(start_gateway: Any, sku: str) -> None:
    """A request id reused for another buyer gets a 422 whose body the schema's
    Error describes: its code in the enum, no other field than error and detail."""
    client = await start_gateway()
    await put_sku(client, sku, 10)
    assert (await buy(client, sku, "alice", "r1"))[0] == 201
    status, body = await buy(client, sku, "bob", "r1")
    assert status == 422
    assert body["error"] == "idempotency_mismatch"
    assert body["error"] in error_codes()
    assert set(body) <= set(component("Error")["properties"])


async def test_an_overlong_admission_token_is_refused_on_a_sku_without_room(
    start_gateway: Any, sku: str
) -> None:
    """An Admission-Token over 160 characters is a 400 on a sku without a waiting
    room, through the fast path and through the router alike, and nothing
    is sold; one within the limit is ignored there, as before."""
    client = await start_gateway()
    await put_sku(client, sku, 10)
    order = {"sku": sku, "user_id": "alice", "request_id": f"{sku}.r1"}
    # The fast path, then the router's way in (what the fast path leaves to the application).
    for extra in ({}, {"Expect": "100-continue"}):
        headers = {"Admission-Token": "t" * 161, **extra}
        resp = await client.post("/v1/purchase", json=order, headers=headers)
        body = await resp.json()
        assert (resp.status, body["error"]) == (400, "invalid_request"), extra
        assert "Admission-Token" in body["detail"]
    report = await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
    assert (await report.json())["sold"] == 0
    resp = await client.post("/v1/purchase", json=order, headers={"Admission-Token": "t" * 160})
    assert resp.status == 201


async def test_an_unknown_query_parameter_is_refused(start_gateway: Any, sku: str) -> None:
    """A query parameter a route does not take is a 400, as an unknown body field
    is; the one a route takes still works."""
    client = await start_gateway()
    await put_sku(client, sku, 10)
    order = {"sku": sku, "user_id": "alice", "request_id": f"{sku}.r1"}
    resp = await client.post("/v1/purchase?coupon=1", json=order)
    assert resp.status == 400
    assert (await resp.json())["detail"] == "unknown query parameters: coupon"
    resp = await client.get(f"/v1/skus/{sku}?x=1")
    assert resp.status == 400
    assert (await buy(client, sku, "alice", "r1"))[0] == 201
    resp = await client.get(f"/v1/orders/{sku}.r1?user_id=alice&wait=0.1")
    assert resp.status == 200
    resp = await client.get(f"/v1/orders/{sku}.r1?user_id=alice&wait=0.1&x=1")
    assert resp.status == 400


async def test_a_waiting_room_is_refused_without_an_admission_secret(
    start_gateway: Any, sku: str
) -> None:
    """PUT of a waiting room on an instance without GATEWAY_ADMISSION_SECRET is a
    422 not_configured naming the setting, and changes nothing; the same sku
    without a room is accepted."""
    client = await start_gateway(admission_secret=None)
    body = {"stock": 10, "waiting_room": ROOM}
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    answer = await resp.json()
    assert (resp.status, answer["error"]) == (422, "not_configured")
    assert "GATEWAY_ADMISSION_SECRET" in answer["detail"]
    assert answer["error"] in error_codes()
    report = await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
    assert report.status == 404
    resp = await client.put(f"/admin/skus/{sku}", json={"stock": 10}, headers=ADMIN_HEADERS)
    assert resp.status == 200


async def test_a_waiting_room_patched_in_without_an_admission_secret(
    start_gateway: Any, sku: str
) -> None:
    """PATCH of a waiting room onto a sku, on an instance without
    GATEWAY_ADMISSION_SECRET, is the 422 not_configured PUT answers, which the
    schema documents for PATCH too (issue 33: schemathesis's ST103 against such
    an instance), and the sku keeps no room."""
    client = await start_gateway(admission_secret=None)
    await put_sku(client, sku, 10)
    body = {"waiting_room": ROOM}
    resp = await client.patch(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    answer = await resp.json()
    assert (resp.status, answer["error"]) == (422, "not_configured")
    assert "422" in responses("/admin/skus/{sku}", "patch")
    assert (await (await client.get(f"/v1/skus/{sku}")).json())["waiting_room"] is False


@pytest.fixture
async def own_database(run_id: str) -> AsyncIterator[str]:
    """A database of this test's own, dropped after its gateways closed (set up
    before them): the start-up report names at most 20 skus, and the session's
    database holds the waiting rooms of every other test."""
    name = f"flashsale_test_{run_id}_unservable"
    yield await create_database(name)
    await drop_database(name)


async def test_an_instance_without_secret_reports_its_waiting_rooms(
    own_database: str, start_gateway: Any, sku: str
) -> None:
    """A waiting-room sku put through an instance with the secret, then an
    instance without one: it logs sku_unservable at start-up, stays ready, and
    /readyz names the sku and why; its buyers get 503 with the reason."""
    with_secret = await start_gateway(admission_secret=SECRET, database_url=own_database)
    body = {"stock": 10, "waiting_room": ROOM}
    resp = await with_secret.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200
    with structlog.testing.capture_logs() as logs:
        without = await start_gateway(admission_secret=None, database_url=own_database)
    errors = [e for e in logs if e["event"] == "sku_unservable" and e["sku"] == sku]
    assert errors and errors[0]["log_level"] == "error"
    assert "GATEWAY_ADMISSION_SECRET" in errors[0]["reason"]
    resp = await without.get("/readyz")
    readiness = await resp.json()
    assert resp.status == 200 and readiness["ready"] is True
    assert "GATEWAY_ADMISSION_SECRET" in readiness["unservable"][sku]
    resp = await without.post(f"/v1/queue/{sku}", json={"user_id": "alice"})
    assert resp.status == 503
    assert "GATEWAY_ADMISSION_SECRET" in (await resp.json())["detail"]
    healthy = await (await with_secret.get("/readyz")).json()
    assert healthy["unservable"] == {}
