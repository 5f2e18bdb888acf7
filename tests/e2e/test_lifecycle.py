"""Real gateway processes under load: graceful SIGTERM, and SIGKILL mid-sale."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from gateway.ops.audit import audit
from gateway.redis.layout import SkuKeys
from gateway.settings import Settings
from testkit.driver import LoadDriver, run_sale
from testkit.gateways import REPO, GatewayCluster, gateway_env
from testkit.invariants import check_invariants
from testkit.metrics import metric, samples, scrape
from testkit.polling import wait_for
from testkit.ports import HOST, free_port
from testkit.purchases import orders_of
from testkit.services import REDIS_URL


class TestGracefulShutdown:
    """SIGTERM under load: drain, settle, exit 0; nothing confirmed is missing."""

    @pytest.mark.parametrize(
        ("workers", "batch_wait_ms"), [(1, 20), (2, 300)], ids=["one-worker", "two-workers"]
    )
    async def test_sigterm_mid_sale(
        self,
        database_url: str,
        key_prefix: str,
        redis: Redis,
        sku: str,
        workers: int,
        batch_wait_ms: int,
    ) -> None:
        """One of two instances gets SIGTERM while 400 buyers hit both: it exits 0
        within the drain bound, every 201 has its row, the ledger ends empty and the
        survivors sell the whole stock. With two workers each, whose batches wait
        300 ms, purchases are passed to the sku's owner when the signal comes: the
        owner flushes them in its drain and each buyer gets the owner's answer,
        none "lost the lane" (a 503 and a wait for the reconciler)."""
        settings = {"batch_wait_ms": batch_wait_ms, "drain_s": 5, "workers": workers}
        async with GatewayCluster(
            2,
            redis_url=REDIS_URL,
            database_url=database_url,
            key_prefix=key_prefix,
            settings=settings,
        ) as cluster:
            await cluster.put_sku(sku, 300)
            sale = asyncio.create_task(run_sale(cluster.urls, sku, 400, start_spread_s=1.5, seed=1))
            await wait_for(lambda: _at_least(database_url, sku, 30), within=30, what="first orders")
            if workers > 1:
                passed = (await scrape(cluster.urls[0])).get("flashsale_lane_passed_total", 0)
                assert passed > 0, "no purchase passed to the owner before the SIGTERM"
            started = time.monotonic()
            cluster[0].kill(signal.SIGTERM)
            assert await cluster[0].wait_exit(within=15) == 0, cluster.logs()
            assert time.monotonic() - started < 5 + 3
            summary = await sale
            assert not cluster[0].log_events("lane_lost"), cluster.logs()
            report = await check_invariants(
                database_url, sku, 300, summary, scenario="sigterm", faults="SIGTERM gw0"
            )
            stuck = [(r.request_id, r.attempts[-3:]) for r in summary.unresolved]
            assert report.ok, f"{report}\n{stuck}\n{cluster.logs()}"
            assert report.sold == 300
            assert await redis.hlen(SkuKeys.of(key_prefix, sku).pending) == 0
            assert not summary.unresolved


async def _at_least(database_url: str, sku: str, n: int) -> bool:
    return await orders_of(database_url, sku) >= n


class TestCrashRecovery:
    """SIGKILL between reservation and commit: reconciliation gives the stock back."""

    async def test_sigkill_mid_sale_then_reconcile_then_second_wave(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """An instance killed with batches in flight leaves reservations behind; the
        survivor's reconciler settles them, and a second wave of buyers brings the
        sale to exactly the whole stock; the audit agrees."""
        settings = {
            "batch_wait_ms": 200,
            "batch_max": 1000,
            "reservation_timeout_s": 1,
            "reconcile_interval_s": 0.2,
        }
        async with GatewayCluster(
            2,
            redis_url=REDIS_URL,
            database_url=database_url,
            key_prefix=key_prefix,
            settings=settings,
        ) as cluster:
            await cluster.put_sku(sku, 100)
            first = LoadDriver([cluster.urls[0]], sku, users=60, run_id="w1")
            wave = asyncio.create_task(first.run())
            pending = SkuKeys.of(key_prefix, sku).pending

            async def reserved() -> bool:
                return await redis.hlen(pending) >= 20

            await wait_for(reserved, within=30, what="reservations in flight")
            await cluster[0].crash()
            summary1 = await wave
            assert summary1.counts["confirmed"] < 60

            async def settled() -> bool:
                return await redis.hlen(pending) == 0

            await wait_for(settled, within=30, what="the reconciler to settle the ledger")
            summary2 = await run_sale([cluster.urls[1]], sku, 200, run_id="w2")
            report = await check_invariants(
                database_url,
                sku,
                100,
                [summary1, summary2],
                scenario="sigkill",
                faults="SIGKILL gw0 mid-flush",
            )
            assert report.ok, f"{report}\n{cluster.logs()}"
            assert report.sold == 100
            rows = await audit(
                Settings(redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix),
                sku,
            )
            assert [r.verdict for r in rows] == ["ok"], rows


class TestWorkers:
    """GATEWAY_WORKERS=2: two processes share the port and one scrape sums them."""

    async def test_metrics_sum_across_workers_and_stop_cleanly(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """Twenty purchases spread over both workers (separate connections) show as
        twenty confirmed in every scrape, whichever worker answers it; SIGTERM to the
        supervisor stops both and exits 0."""
        async with GatewayCluster(
            1,
            redis_url=REDIS_URL,
            database_url=database_url,
            key_prefix=key_prefix,
            settings={"workers": 2},
        ) as cluster:
            await cluster.put_sku(sku, 50)
            url = cluster.urls[0]
            for i in range(20):
                # A fresh connection each time, so the kernel spreads them over workers.
                async with aiohttp.ClientSession() as http:
                    body = {"sku": sku, "user_id": f"w{i}"}
                    async with http.post(f"{url}/v1/purchase", json=body) as resp:
                        assert resp.status == 201
                    async with http.get(f"{url}/metrics") as resp:
                        text = await resp.text()
                    confirmed = samples(text).get('flashsale_purchases_total{outcome="confirmed"}')
                    assert confirmed == i + 1
            cluster[0].kill(signal.SIGTERM)
            assert await cluster[0].wait_exit(within=15) == 0, cluster.logs()

    async def test_two_workers_pass_a_hot_skus_purchases_to_its_owner(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """600 new buyers at once on both workers for 300 units of one sku: the
        worker that does not own the sku passes what it reserved to the one that
        does (flashsale_lane_passed_total > 0, and more passed than kept), so
        the sku's batches form in one worker; the whole stock sells with no
        oversell, every 201 has its row, no lock wait times out, the ledger ends
        empty and the audit is clean. Which worker reserves what is the kernel's
        spreading of connections, not asserted."""
        async with GatewayCluster(
            1,
            redis_url=REDIS_URL,
            database_url=database_url,
            key_prefix=key_prefix,
            settings={"workers": 2},
        ) as cluster:
            await cluster.put_sku(sku, 300)

            async def linked() -> bool:
                # Both workers linked to each other: the gateway is up as a whole
                # (its workers start in any order, and readiness is one worker's).
                return (await scrape(cluster.urls[0])).get("flashsale_lane_links") == 2

            await wait_for(linked, within=10, what="the two workers linked")
            summary = await run_sale(cluster.urls, sku, 600, start_spread_s=0.3)
            report = await check_invariants(database_url, sku, 300, summary, scenario="workers")
            assert report.ok and report.sold == 300, f"{report}\n{cluster.logs()}"
            assert not summary.unresolved
            assert summary.counts["confirmed"] == 300, summary.counts
            metrics = await scrape(cluster.urls[0])
            passed = metrics.get("flashsale_lane_passed_total", 0)
            kept = metric(metrics, "flashsale_lane_kept_total")
            assert passed > kept, f"passed {passed}, kept {kept}: the lanes carried nothing"
            assert metrics.get("flashsale_lock_timeouts_total", 0) == 0
            assert await redis.hlen(SkuKeys.of(key_prefix, sku).pending) == 0
            rows = await audit(
                Settings(redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix),
                sku,
            )
            assert [r.verdict for r in rows] == ["ok"], rows

    async def test_a_stop_while_the_workers_start_exits_0(
        self, database_url: str, key_prefix: str, tmp_path: Path
    ) -> None:
        """SIGTERM to the supervisor as soon as both workers exist, while they are
        still importing: they end by the signal passed on (nothing to drain yet),
        and the supervisor exits 0, not 15 (a stop as asked is not a failure)."""
        env = gateway_env(
            {
                "redis_url": REDIS_URL,
                "database_url": database_url,
                "key_prefix": key_prefix,
                "workers": 2,
                "host": HOST,
                "port": free_port(),
            }
        )
        log = tmp_path / "supervisor.log"
        with log.open("wb") as out:
            supervisor = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                "serve",
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children")
            await wait_for(
                lambda: len(children.read_text().split()) == 2, within=15, what="two workers"
            )
            supervisor.send_signal(signal.SIGTERM)
            await asyncio.wait_for(supervisor.wait(), 15)
        finally:
            if supervisor.returncode is None:
                supervisor.kill()
                await supervisor.wait()
        assert supervisor.returncode == 0, log.read_text()
