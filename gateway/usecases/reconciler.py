"""Reconciliation: nothing is lost after a crash.

A gateway killed between reservation and commit leaves entries in the pending
ledger. Every instance runs a reconciler; for each sku it takes the sku's
flush lock (so one reconciler, and no flush, touches the sku at a time) and:

1. settles each ledger entry older than the reservation timeout: confirmed
   when its order row exists, otherwise its stock and buyer go back;
2. checks ``redis_stock + pending == db_stock``. Entries whose order is
   already committed (a settle that failed after the commit) explain part of
   a difference and are left to step 1; any other drift is repaired from the
   database and logged, and flags the sku's hashes for a rebuild (the writes
   Redis lost may include the records of committed orders). Without a lock a
   drift may be a flush caught between its commit and its settle, so it is
   repaired only when seen twice alike.

A reservation of the queue strategy still in its sku's stream is not stale,
however old: a writer will commit it (step 1 skips it); its units count as
pending in step 2 like any reservation's.

A sku whose strategy keeps no Redis state (``Strategy.reserves`` false) has
no counter to compare: step 1 still settles what an earlier reserve-batch sale
left in its ledger, step 2 is skipped. Its books (stock + sold = provided) are
the database's alone, which the audit checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import structlog
from redis.exceptions import RedisError

from gateway.domain.errors import Unavailable
from gateway.domain.model import Verdict
from gateway.lock import LockError
from gateway.postgres.identity import DatabaseIdentity
from gateway.postgres.inventory import Inventory
from gateway.postgres.orders import Orders
from gateway.postgres.sale_gate import PostgresSaleGate
from gateway.redis.identity import IdentityStamp
from gateway.redis.reservations import Reservations, Settlement, StockLoad
from gateway.usecases.catalog import Catalog
from gateway.usecases.rebuilds import Rebuilds
from gateway.write.sku_locks import SkuLocks

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SkuReconciliation:
    """What one pass did for one sku."""

    confirmed: int
    released: int
    pending: int
    drift: int
    repaired: bool

    def as_json(self) -> dict[str, int | bool]:
        """The record as the admin API shows it."""
        return asdict(self)


class Reconciler:
    """Settles stale reservations and repairs unexplained drift, per sku."""

    def __init__(
        self,
        *,
        reservations: Reservations,
        orders: Orders,
        inventory: Inventory,
        stamp: IdentityStamp,
        database: DatabaseIdentity,
        gate: PostgresSaleGate,
        locks: SkuLocks,
        timeout_s: float,
        interval_s: float,
        publish: Callable[[str, int, int], None],
        queued: Callable[[str], Awaitable[set[str]]],
        catalog: Catalog,
        rebuilds: Rebuilds,
    ) -> None:
        self._reservations = reservations
        self._orders = orders
        self._inventory = inventory
        self._stamp = stamp
        self._database = database
        self._gate = gate
        self._locks = locks
        self._timeout_ms = int(timeout_s * 1000)
        self._interval = interval_s
        self._publish = publish
        # The queue strategy's request ids still in a sku's stream: reserved and
        # durably queued, so never stale however long they wait for a writer.
        self._queued = queued
        self._catalog = catalog
        # Starts the rebuild of the hashes a drift repair flagged.
        self._rebuilds = rebuilds
        self._suspect: dict[str, int] = {}

    async def run(self) -> None:
        """Reconcile every sku each interval until cancelled; a failed pass is
        logged and the next one tries again, so the task never dies quietly."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.reconcile_all()
            except Exception:
                log.exception("reconcile_pass_failed")

    async def reconcile_all(self) -> dict[str, SkuReconciliation]:
        """One pass over every sku of the inventory, after making sure Redis holds
        this database's state (a restored or failed-over database drops it)."""
        # PostgreSQL's own housekeeping first: it needs no Redis.
        await self._gate.prune_buckets()
        await self.adopt_database()
        done: dict[str, SkuReconciliation] = {}
        for sku in await self._inventory.skus():
            try:
                done[sku] = await self.reconcile(sku)
            except (Unavailable, LockError, RedisError) as exc:
                log.warning("reconcile_failed", sku=sku, cause=repr(exc))
        return done

    async def adopt_database(self) -> None:
        """Make the Redis state this database's: state stamped by another
        (restored, failed over) is dropped, to be reloaded from PostgreSQL."""
        if await self._stamp.adopt(await self._database.read()):
            log.warning("redis_state_dropped", reason="another database")

    async def reconcile(self, sku: str) -> SkuReconciliation:
        """One pass over one sku, under its flush lock."""
        async with self._locks.held(sku):
            # Without a lock a flush may sit between its commit and its settle.
            return await self._reconcile(sku, exact=self._locks.enabled)

    async def _reconcile(self, sku: str, *, exact: bool) -> SkuReconciliation:
        reservations, orders = self._reservations, self._orders
        stale_before = int(time.time() * 1000) - self._timeout_ms
        stale = [p for p in await reservations.pending(sku) if p.reserved_at_ms < stale_before]
        if stale:
            waiting = await self._queued(sku)
            stale = [p for p in stale if p.request_id not in waiting]
        found = (
            await orders.release_stale(sku, [(p.request_id, p.reserved_at_ms) for p in stale])
            if stale
            else {}
        )
        settlements = [
            Settlement(
                p.request_id, Verdict.CONFIRMED, p.user_id, p.qty, found[p.request_id].order_id
            )
            if p.request_id in found and found[p.request_id].sku == sku
            else Settlement(p.request_id, Verdict.RELEASED, p.user_id, p.qty)
            for p in stale
        ]
        if settlements:
            await reservations.settle(sku, settlements, None)
            log.warning("reservations_settled", sku=sku, count=len(settlements))
        if not (await self._catalog.strategy(sku)).reserves:
            drift, pending, repaired = 0, sum(p.qty for p in await reservations.pending(sku)), False
        else:
            drift, pending, repaired = await self._check(sku, exact=exact)
        self._publish(sku, pending, drift)
        confirmed = sum(1 for s in settlements if s.verdict is Verdict.CONFIRMED)
        released = len(settlements) - confirmed
        return SkuReconciliation(confirmed, released, pending, drift, repaired)

    async def _check(self, sku: str, *, exact: bool) -> tuple[int, int, bool]:
        """(drift, pending units, repaired); drift = db - (redis + pending - committed)."""
        reservations, orders = self._reservations, self._orders
        redis_stock, pending = await reservations.snapshot(sku)
        db_stock = await orders.stock(sku)
        units = sum(p.qty for p in pending)
        if db_stock is None or redis_stock is None:
            # A missing key is reloaded on the next purchase; nothing to compare.
            return 0, units, False
        found = await orders.orders([p.request_id for p in pending])
        committed = sum(p.qty for p in pending if p.request_id in found)
        drift = db_stock - (redis_stock + units - committed)
        if drift == 0:
            self._suspect.pop(sku, None)
            return 0, units, False
        if not exact and self._suspect.get(sku) != drift:
            self._suspect[sku] = drift
            return drift, units, False
        self._suspect.pop(sku, None)
        # Entries already committed still sit in the ledger: count them as
        # database stock so the counter is not lowered twice for them. A
        # counter the scripts cannot have left lost writes (a replica promoted
        # without the newest ones), and with them maybe the done and buyers
        # records of committed orders: the repair flags the sku as rebuilding,
        # so a replay of such an order is looked up in PostgreSQL, not told
        # sold out, until the hashes are whole again (gateway.usecases.rebuilds).
        after = await reservations.load_stock(sku, db_stock + committed, StockLoad.REPAIR)
        self._rebuilds.ensure(sku)
        log.warning("drift_repaired", sku=sku, drift=drift, redis_stock=after, db_stock=db_stock)
        return drift, units, True
