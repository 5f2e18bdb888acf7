"""A waiting room shared by two gateway processes: one pace, one token spend."""

from __future__ import annotations

from typing import Any

import aiohttp
from redis.asyncio import Redis

from gateway.redis.layout import RoomKeys
from testkit.gateways import GatewayCluster
from testkit.polling import wait_for
from testkit.rooms import SECRET
from testkit.services import REDIS_URL

ADMIT_PER_S = 2
PEOPLE = 6


class TestTwoInstances:
    """Admission is decided in Redis, so two processes share one pace and one
    record of spent tokens."""

    async def test_pace_and_single_spend_across_processes(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """Six people join through one process and poll through both: all are let
        in, in join order, never more than two in any 1000 ms of Redis's clock; a
        token bought with on one process is refused on the other."""
        async with (
            GatewayCluster(
                2,
                redis_url=REDIS_URL,
                database_url=database_url,
                key_prefix=key_prefix,
                settings={"admission_secret": SECRET},
            ) as cluster,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        ):
            room = {"admit_per_s": ADMIT_PER_S, "token_ttl_s": 60}
            await cluster.admin("PUT", f"/admin/skus/{sku}", {"stock": 10, "waiting_room": room})

            async def call(method: str, via: int, path: str, **kw: Any) -> tuple[int, Any]:
                async with http.request(method, f"{cluster[via].url}{path}", **kw) as resp:
                    return resp.status, await resp.json()

            tickets = []
            for i in range(PEOPLE):
                status, body = await call("POST", 0, f"/v1/queue/{sku}", json={"user_id": f"u{i}"})
                assert status == 200, body
                tickets.append(body["ticket"])
            tokens: dict[int, str] = {}

            async def everyone_in() -> bool:
                for i, ticket in enumerate(tickets):
                    _, body = await call("GET", i % 2, f"/v1/queue/{sku}/{ticket}")
                    if body["status"] == "admitted":
                        tokens[i] = body["admission_token"]
                return len(tokens) == PEOPLE

            await wait_for(everyone_in, within=20, what="everyone admitted")
            records = await redis.hmget(RoomKeys.of(key_prefix, sku).tickets, tickets)
            at = [int(str(r, "utf-8").split("|")[1]) for r in records if isinstance(r, bytes)]
            assert len(at) == PEOPLE and at == sorted(at)
            assert max(sum(1 for t in at if s <= t < s + 1000) for s in at) == ADMIT_PER_S

            order = {"sku": sku, "user_id": "u0", "request_id": f"{sku}.first"}
            headers = {"Admission-Token": tokens[0]}
            status, _ = await call("POST", 0, "/v1/purchase", json=order, headers=headers)
            assert status == 201
            other = {**order, "request_id": f"{sku}.second"}
            status, body = await call("POST", 1, "/v1/purchase", json=other, headers=headers)
            assert (status, body["error"]) == (403, "admission_invalid")
            status, _ = await call("POST", 1, "/v1/purchase", json=order, headers=headers)
            assert status == 201
            assert (await cluster.report(sku))["sold"] == 1
