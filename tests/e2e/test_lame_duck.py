"""Stopping behind a balancer: the lame duck, and the client address in the logs."""

from __future__ import annotations

import signal
import time
from typing import Any

import aiohttp
import structlog
from redis.asyncio import Redis

from gateway.app import drain
from gateway.http.clients import add_client
from testkit.gateways import SIGTERM_EXIT_S, GatewayCluster
from testkit.polling import wait_for
from testkit.purchases import put_sku
from testkit.services import REDIS_URL

LAME_DUCK_S = 2.0


def one_gateway(database_url: str, key_prefix: str, **settings: Any) -> GatewayCluster:
    """A gateway process of its own, with ``settings``."""
    return GatewayCluster(
        1, redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix, settings=settings
    )


class TestLameDuck:
    """SIGTERM with GATEWAY_LAME_DUCK_S: out of rotation first, serving all along."""

    async def test_readyz_fails_at_once_while_purchases_are_served(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """Right after SIGTERM /readyz answers 503 (draining) while the gateway keeps
        listening and confirms a purchase; it exits 0 after the lame duck and the
        drain, not before the lame duck is over."""
        async with one_gateway(database_url, key_prefix, lame_duck_s=LAME_DUCK_S) as cluster:
            gateway = cluster[0]
            await cluster.put_sku(sku, 5)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
                started = time.monotonic()
                gateway.kill(signal.SIGTERM)

                async def not_ready() -> Any:
                    async with http.get(f"{gateway.url}/readyz") as resp:
                        return resp.status == 503 and await resp.json()

                readiness = await wait_for(not_ready, within=LAME_DUCK_S, what="/readyz 503")
                body = {"sku": sku, "user_id": "late", "request_id": f"{sku}.late"}
                async with http.post(f"{gateway.url}/v1/purchase", json=body) as resp:
                    bought = resp.status
                served_within = time.monotonic() - started
            assert readiness["draining"] is True and readiness["redis"] is True
            assert bought == 201 and served_within < LAME_DUCK_S
            assert await gateway.wait_exit(within=LAME_DUCK_S + SIGTERM_EXIT_S) == 0, cluster.logs()
            assert time.monotonic() - started >= LAME_DUCK_S
            assert gateway.log_events("lame_duck")[0]["seconds"] == LAME_DUCK_S


class TestStopWithoutTheRelay:
    """SIGTERM to a gateway whose events are not relayed (GATEWAY_EVENTS_RELAY=false)."""

    async def test_it_exits_0_without_a_traceback(
        self, database_url: str, key_prefix: str, sku: str
    ) -> None:
        """It stops as one with the relay does: exit 0, nothing raised on the way
        (its background loops are none)."""
        async with one_gateway(database_url, key_prefix, events_relay=False) as cluster:
            gateway = cluster[0]
            await cluster.put_sku(sku, 5)
            gateway.kill(signal.SIGTERM)
            assert await gateway.wait_exit(within=SIGTERM_EXIT_S) == 0, cluster.logs()
            assert "Traceback" not in gateway.log_text(), cluster.logs()


class TestClientAddressLogged:
    """A logged request names its client, believing X-Forwarded-For only from a proxy."""

    async def _logged_client(self, start_gateway: Any, sku: str, **settings: Any) -> Any:
        """The ``client`` of the line logged for a purchase refused while draining,
        sent from loopback with a forged ``X-Forwarded-For``."""
        client = await start_gateway(**settings)
        await put_sku(client, sku, 5)
        await drain(client.app)
        processors = [add_client]
        with structlog.testing.capture_logs(processors=processors) as logs:
            resp = await client.post(
                "/v1/purchase",
                json={"sku": sku, "user_id": "u1"},
                headers={"X-Forwarded-For": "198.51.100.7, 203.0.113.9"},
            )
        assert resp.status == 503 and resp.headers["Retry-After"]
        [line] = [line for line in logs if line["event"] == "request_failed"]
        return line["client"]

    async def test_trusted_proxy_forwarded_address(self, start_gateway: Any, sku: str) -> None:
        """From a trusted peer the rightmost untrusted address of the chain is logged."""
        assert await self._logged_client(start_gateway, sku, trusted_proxies="127.0.0.1") == (
            "203.0.113.9"
        )

    async def test_untrusted_peer_is_logged_as_itself(self, start_gateway: Any, sku: str) -> None:
        """Without GATEWAY_TRUSTED_PROXIES the header is ignored: the peer is logged."""
        assert await self._logged_client(start_gateway, sku) == "127.0.0.1"
