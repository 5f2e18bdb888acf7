"""Topologies of the chaos scenarios: two gateways, their servers, fault proxies between.

A :class:`Stack` is what a scenario acts on: the gateway cluster, the private
PostgreSQL cluster with the scenario's database, a private Redis (or a Sentinel
pair) and the proxies in front of them, plus direct ways to look at each.
:func:`proxied_stack` and :func:`sentinel_stack` build one and, if the scenario
fails, read every diagnostic before the servers remove their logs.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
import asyncpg

from gateway.ops.audit import SkuAudit, audit
from gateway.redis.layout import SkuKeys, lock_key
from gateway.settings import Settings
from testkit.gateways import GatewayCluster
from testkit.metrics import metric, scrape
from testkit.ports import Address
from testkit.postgres_servers import PostgresCluster
from testkit.proxy import FaultProxy
from testkit.redis_servers import RedisServer, redis_client
from testkit.sentinels import RedisSentinelCluster
from tests.chaos.reporting import Diagnostics, constant, freeze


@dataclass
class Stack:
    """Two gateways, the servers behind them, and direct ways to look at those servers."""

    gateways: GatewayCluster
    pg: PostgresCluster
    # Direct (not proxied) URL of the scenario's database, for the checks.
    database_url: str
    pg_proxy: FaultProxy
    redis_server: RedisServer | None = None
    redis_proxy: FaultProxy | None = None
    sentinel: RedisSentinelCluster | None = None

    @property
    def key_prefix(self) -> str:
        """The gateways' Redis key prefix."""
        return self.gateways.key_prefix

    @property
    def lock(self) -> str:
        """The flush lock the gateways use (``redis``, ``postgres`` or ``none``)."""
        return self.gateways.env.get("GATEWAY_FLUSH_LOCK", "redis")

    @property
    def lease_s(self) -> float:
        """The gateways' lock lease."""
        return float(self.gateways.env.get("GATEWAY_LOCK_LEASE_S", "10"))

    def keys(self, sku: str) -> SkuKeys:
        """The sku's Redis keys under the gateways' prefix."""
        return SkuKeys.of(self.key_prefix, sku)

    async def redis_address(self) -> Address:
        """The Redis data node the gateways write to, reached directly (no proxy)."""
        if self.sentinel is not None:
            return await self.sentinel.master_address()
        assert self.redis_server is not None
        return self.redis_server.address

    async def audit_settings(self) -> Settings:
        """Settings for :func:`gateway.ops.audit.audit` on these servers, read directly."""
        host, port = await self.redis_address()
        return Settings(
            redis_url=f"redis://{host}:{port}/0",
            database_url=self.database_url,
            key_prefix=self.key_prefix,
        )

    async def audit(self, sku: str) -> SkuAudit:
        """The audit row of ``sku``."""
        rows = await audit(await self.audit_settings(), sku)
        assert len(rows) == 1, rows
        return rows[0]

    async def orders(self, sku: str) -> int:
        """Order rows of ``sku`` (PostgreSQL, directly)."""
        con = await asyncpg.connect(self.database_url, timeout=2)
        try:
            count: int = await con.fetchval(
                "SELECT count(*) FROM orders WHERE sku = $1", sku, timeout=2
            )
            return count
        finally:
            await con.close(timeout=2)

    async def ledger(self, sku: str) -> dict[str, str]:
        """The pending ledger of ``sku``: request id -> ``user|qty|reserved_at_ms``."""
        async with redis_client(await self.redis_address()) as r:
            entries = await r.hgetall(self.keys(sku).pending)
        return {str(k): str(v) for k, v in entries.items()}

    def live_urls(self) -> list[str]:
        """Base URLs of the gateways that are running now."""
        return [g.url for g in self.gateways if g.running]


def log_digest(gateways: GatewayCluster, lines: int = 60) -> str:
    """The end of every gateway's log without its per-request failure lines (a
    fault makes hundreds), which are only counted."""
    parts = []
    for g in gateways:
        text = g.log_text().splitlines()
        kept = [line for line in text if '"request_failed"' not in line]
        parts.append(
            f"--- gateway {g.index} (port {g.port}, pid {g.pid}, rc {g.returncode}),"
            f" {len(text) - len(kept)} request_failed lines left out\n" + "\n".join(kept[-lines:])
        )
    return "\n".join(parts)


def pid_of(owner: str | None) -> int | None:
    """The pid at the start of a lock owner id ``<pid>:<random>:<serial>``."""
    if not owner:
        return None
    head = owner.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def text_of(value: str | bytes | None) -> str | None:
    """A Redis reply as text (replies are bytes unless the client decodes them)."""
    return value.decode() if isinstance(value, bytes) else value


async def lock_state(stack: Stack, sku: str = "flash") -> str:
    """The sku's flush lock (owner, the gateway whose pid it names, count, fence,
    PTTL) and ledger size in Redis, for the report of a failed scenario."""
    key = lock_key(stack.key_prefix, sku)
    try:
        async with redis_client(await stack.redis_address()) as r:
            lock = await r.hgetall(key)
            pttl = await r.pttl(key)
            pending = await r.hlen(stack.keys(sku).pending)
            stock = await r.get(stack.keys(sku).stock)
    except Exception as exc:
        return f"--- redis state: unreadable ({exc!r})"
    fields = {str(text_of(k)): text_of(v) for k, v in lock.items()}
    owner = fields.get("owner")
    holders = [f"gw{g.index}" for g in stack.gateways if g.pid == pid_of(owner)]
    return (
        f"--- redis state of {sku!r}: lock {fields or 'free'} pttl {pttl}ms held by"
        f" {holders or 'no running gateway'}; stock {stock!r}; ledger {pending} entries"
    )


async def freeze_stack(stack: Stack, diagnostics: Diagnostics) -> None:
    """On failure: read Redis's view of the sku, then every diagnostic (see freeze)."""
    state = await lock_state(stack)
    diagnostics.append(constant(state))
    freeze(diagnostics)


async def database_on(pg: PostgresCluster) -> str:
    """A new, empty database on ``pg`` (restarted first if a scenario left it down)."""
    if not pg.running:
        await pg.start()
    await pg.wait_ready(within=30)
    name = f"chaos_{uuid.uuid4().hex[:10]}"
    await pg.create_database(name)
    return name


@contextlib.asynccontextmanager
async def proxied_stack(
    pg: PostgresCluster,
    diagnostics: Diagnostics,
    settings: Mapping[str, str | int | float],
    count: int = 2,
) -> AsyncIterator[Stack]:
    """A private Redis and a new database on ``pg``, each behind a fault proxy, and
    ``count`` gateways reaching both through the proxies."""
    dbname = await database_on(pg)
    async with RedisServer() as redis_server:
        diagnostics.append(lambda: f"--- redis {redis_server.port}\n{redis_server.log_tail()}")
        with (
            FaultProxy(*redis_server.address, name="redis") as redis_proxy,
            FaultProxy(*pg.address, name="postgres") as pg_proxy,
        ):
            gateways = GatewayCluster(
                count,
                redis_url=redis_server.url(address=redis_proxy.address),
                database_url=pg.url(dbname, address=pg_proxy.address),
                settings=settings,
            )
            stack = Stack(
                gateways=gateways,
                pg=pg,
                database_url=pg.url(dbname),
                pg_proxy=pg_proxy,
                redis_server=redis_server,
                redis_proxy=redis_proxy,
            )
            async with _started(stack, diagnostics):
                yield stack


@contextlib.asynccontextmanager
async def sentinel_stack(
    pg: PostgresCluster,
    diagnostics: Diagnostics,
    settings: Mapping[str, str | int | float],
    count: int = 2,
) -> AsyncIterator[Stack]:
    """A Redis primary, its replica and three Sentinels; gateways that follow the
    primary the Sentinels name. Sentinels hand out the data nodes' real addresses,
    so Redis is reached directly; PostgreSQL still goes through a proxy."""
    dbname = await database_on(pg)
    async with RedisSentinelCluster() as sentinel:
        diagnostics.append(sentinel.log_tails)
        sentinels = ",".join(f"{h}:{p}" for h, p in sentinel.sentinel_addresses())
        primary = await sentinel.primary()
        with FaultProxy(*pg.address, name="postgres") as pg_proxy:
            gateways = GatewayCluster(
                count,
                # Ignored while GATEWAY_REDIS_SENTINELS is set.
                redis_url=primary.url(),
                database_url=pg.url(dbname, address=pg_proxy.address),
                settings={
                    **settings,
                    "redis_sentinels": sentinels,
                    "redis_sentinel_master": sentinel.master_name,
                },
            )
            stack = Stack(
                gateways=gateways,
                pg=pg,
                database_url=pg.url(dbname),
                pg_proxy=pg_proxy,
                sentinel=sentinel,
            )
            async with _started(stack, diagnostics):
                yield stack


@contextlib.asynccontextmanager
async def _started(stack: Stack, diagnostics: Diagnostics) -> AsyncIterator[None]:
    """Run the stack's gateways for the block; if it fails, read every diagnostic
    (Redis's view of the sku included) before the servers remove their logs."""
    diagnostics.append(lambda: log_digest(stack.gateways))
    async with stack.gateways:
        try:
            yield
        except BaseException:
            await freeze_stack(stack, diagnostics)
            raise


async def metric_total(stack: Stack, name: str) -> float:
    """Sum of ``name`` over every running gateway (counters restart with a process)."""
    total = 0.0
    for gateway in stack.gateways:
        if gateway.running:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                total += metric(await scrape(gateway.url), name)
    return total
