"""Sale rules across real gateway processes: rate limits shared by every
instance through Redis, and a gateway whose clock runs an hour fast."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from testkit.gateways import GatewayCluster
from testkit.services import REDIS_URL
from testkit.skew import skewed_env

pytestmark = pytest.mark.timeout(120)


async def purchase(url: str, sku: str, user: str, rid: str) -> tuple[int, dict[str, Any], Any]:
    """``POST /v1/purchase`` to one instance; (status, body, headers)."""
    body = {"sku": sku, "user_id": user, "request_id": f"{sku}.{rid}"}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.post(f"{url}/v1/purchase", json=body) as response,
    ):
        return response.status, await response.json(), response.headers


async def test_limits_are_shared_by_two_instances(
    database_url: str, key_prefix: str, redis: Redis, sku: str
) -> None:
    """With GATEWAY_USER_RATE=0.01/s:2 and GATEWAY_CLIENT_RATE=0.01/s:4 on two
    gateway processes, attempts alternating between them draw on one bucket per
    user and one per client address: the user's third attempt and the client's
    fifth are 429 with Retry-After, whichever instance they reach."""
    settings = {"user_rate": "0.01/s:2", "client_rate": "0.01/s:4"}
    async with GatewayCluster(
        2, redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix, settings=settings
    ) as cluster:
        await cluster.put_sku(sku, 10)
        a, b = cluster.urls
        assert (await purchase(a, sku, "u1", "1"))[0] == 201
        assert (await purchase(b, sku, "u1", "2"))[:2] == (409, {"status": "duplicate"})
        status, body, headers = await purchase(a, sku, "u1", "3")
        assert (status, body) == (429, {"error": "rate_limited"})
        assert 99 <= int(headers["Retry-After"]) <= 100
        # The refused attempt took no token of the client's: two left, then none.
        assert (await purchase(b, sku, "u2", "4"))[0] == 201
        assert (await purchase(a, sku, "u3", "5"))[0] == 201
        status, body, headers = await purchase(b, sku, "u4", "6")
        assert (status, body) == (429, {"error": "rate_limited"}) and headers["Retry-After"]


async def test_a_gateway_an_hour_fast_does_not_sell_early(
    database_url: str, key_prefix: str, redis: Redis, sku: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway process whose clock runs an hour ahead (libfaketime; its Date
    header shows it) is asked for a sale that starts in 30 minutes by Redis's
    clock: it answers not_started with a Retry-After of about 30 minutes, as
    Redis's clock says, and sells nothing."""
    for name, value in skewed_env("+1h").items():
        monkeypatch.setenv(name, value)
    cluster = GatewayCluster(
        1, redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix
    )
    for name in ("LD_PRELOAD", "FAKETIME"):
        monkeypatch.delenv(name)  # the child took them; only it runs skewed
    async with cluster:
        seconds, _ = await redis.time()
        redis_now = datetime.fromtimestamp(seconds, UTC)
        starts = redis_now + timedelta(minutes=30)
        await cluster.admin(
            "PUT", f"/admin/skus/{sku}", {"stock": 5, "starts_at": starts.isoformat()}
        )
        status, body, headers = await purchase(cluster.urls[0], sku, "u1", "early")
        gateway_now = parsedate_to_datetime(headers["Date"])
        assert gateway_now - redis_now > timedelta(minutes=55), "the clock is not skewed"
        assert (status, body["status"]) == (409, "not_started")
        assert 1795 <= int(headers["Retry-After"]) <= 1800
        report = await cluster.report(sku)
        assert (report["redis_stock"], report["pending"], report["sold"]) == (5, 0, 0)
