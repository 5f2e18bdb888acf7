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
   Redis lost may include the records of committed orders). A cancelled or
   expired order's return is no drift: given to Redis (its ``returned`` hash)
   but not yet recorded in PostgreSQL, in flight or cut off by a crash, its
   units count as database stock; a return given while the pass looked
   (the hash grew) leaves the sku to the next pass. Without a lock a
   drift may be a flush caught between its commit and its settle, so it is
   repaired only when seen twice alike.

A reservation of the queue strategy still in its sku's stream is not stale,
however old: a writer will commit it (step 1 skips it); its units count as
pending in step 2 like any reservation's.

A sku whose strategy keeps no Redis state (``Strategy.reserves`` false) has
no counter to compare: step 1 still settles what an earlier reserve-batch sale
left in its ledger, step 2 is skipped. Its books (stock + sold = provided) are
the database's alone, which the audit checks.

A pass visits the **active** skus alone (``gateway.postgres.inventory.ACTIVE``),
so it costs what the sale being run costs, not every sku ever created. A sku
the pass finds exhausted (or archived) with nothing pending, held or drifting
is idle: it leaves the passes, and its per-sku series leave the metrics,
until the next change of its row (a flush, a restock, an admin change, a
return of units) makes it active again, on every instance at once. Redis can
change without the row: an announcement that stock came back for a sku that
is not active, or a change feed that resumed (announcements missed; Redis may
have failed over and lost writes), makes the next pass visit every sku once,
as does this instance's start. What 2,000 idle skus add to a pass is in
docs/performance.md ("A reconcile pass costs the active skus").
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import asdict, dataclass
from typing import NamedTuple, Protocol

import structlog
from redis.exceptions import RedisError

from gateway.domain.errors import Unavailable, UnknownSku
from gateway.domain.model import Verdict
from gateway.domain.skus import SkuState
from gateway.domain.stock import Settlement, StockLoad
from gateway.lock import LockError
from gateway.lock.tasks import rest, stop_if_cancelled
from gateway.usecases.catalog import Catalog
from gateway.usecases.ports import (
    Counters,
    OrderBooks,
    Pruning,
    Rebuilding,
    SkuLocking,
    SkuStates,
    Stamping,
    WhichDatabase,
)

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


class Found(NamedTuple):
    """What one sku's pass saw, beside what it did: whether the sku is quiet
    (nothing pending, no drift, no stock in Redis) and so may be idle."""

    done: SkuReconciliation
    quiet: bool


class ReconcileObserver(Protocol):
    """What the metrics want to know of each pass (gateway.ops.metrics)."""

    def sku_state(self, sku: str, pending: int, drift: int) -> None:
        """A sku's pending units and drift, as one pass found them."""

    def sale(self, state: SkuState) -> None:
        """An active sku's stock on sale, units held and units sold."""

    def retain(self, skus: Collection[str]) -> None:
        """Only ``skus`` are active: every other sku's series go."""


class Reconciler:
    """Settles stale reservations and repairs unexplained drift, per active sku."""

    def __init__(
        self,
        *,
        reservations: Counters,
        orders: OrderBooks,
        inventory: SkuStates,
        stamp: Stamping,
        database: WhichDatabase,
        retention: Pruning,
        locks: SkuLocking,
        timeout_s: float,
        interval_s: float,
        observer: ReconcileObserver,
        queued: Callable[[str], Awaitable[set[str]]],
        catalog: Catalog,
        rebuilds: Rebuilding,
    ) -> None:
        self._reservations = reservations
        self._orders = orders
        self._inventory = inventory
        self._stamp = stamp
        self._database = database
        self._retention = retention
        self._locks = locks
        self._timeout_ms = int(timeout_s * 1000)
        self._interval = interval_s
        self._observer = observer
        # The queue strategy's request ids still in a sku's stream: reserved and
        # durably queued, so never stale however long they wait for a writer.
        self._queued = queued
        self._catalog = catalog
        # Starts the rebuild of the hashes a drift repair flagged.
        self._rebuilds = rebuilds
        self._suspect: dict[str, int] = {}
        # Every sku at the next pass: this instance may have missed a change.
        self._every = True
        # Skus whose stock came back in Redis since the last pass.
        self._returned: set[str] = set()

    async def run(self) -> None:
        """Reconcile the active skus each interval until cancelled; a failed pass is
        logged and the next one tries again, so the task never dies quietly."""
        while True:
            await rest(self._interval)
            try:
                await self.reconcile_all()
            except Exception as exc:
                stop_if_cancelled(exc)
                log.exception("reconcile_pass_failed")

    async def reconcile_all(self) -> dict[str, SkuReconciliation]:
        """One pass over the active skus (every sku when this instance may have
        missed a change), after making sure Redis holds this database's state
        (a restored or failed-over database drops it); the skus it found
        idle leave the passes and the metrics."""
        # PostgreSQL's own housekeeping first: it needs no Redis.
        await self._retention.prune()
        await self.adopt_database()
        every, self._every = self._every, False
        returned, self._returned = self._returned, set()
        states = await self._inventory.states(every=every)
        if not every and not returned <= {s.sku for s in states}:
            states = await self._inventory.states(every=True)
        done: dict[str, SkuReconciliation] = {}
        live: list[str] = []
        for state in states:
            try:
                found = await self.reconcile(state.sku)
            except (Unavailable, LockError, RedisError) as exc:
                stop_if_cancelled(exc)
                log.warning("reconcile_failed", sku=state.sku, cause=repr(exc))
                self._returned.add(state.sku)  # not known idle: seen again next pass
                if not state.archived:
                    live.append(state.sku)  # its series stay as the last pass left them
                continue
            done[state.sku] = found.done
            if await self._idle(state, found):
                continue
            if not state.archived:
                live.append(state.sku)
                self._observer.sku_state(state.sku, found.done.pending, found.done.drift)
                self._observer.sale(state)
        self._observer.retain(live)
        return done

    async def _idle(self, state: SkuState, found: Found) -> bool:
        """Whether the sku is idle: nothing is left to change by itself (quiet, no
        units held, no stock on sale unless archived), marked so if it was not.
        An idle sku found otherwise (a pass over every sku, after Redis changed
        without its row) is made active again."""
        if found.quiet and not state.held and (not state.stock or state.archived):
            return not state.active or await self._inventory.mark_idle(state.sku, state.updated_at)
        if not state.active:
            await self._inventory.mark_active(state.sku)
        return False

    # What the change feed tells (gateway.redis.change_feed.ChangeSubscriber).
    def stock_returned(self, sku: str) -> None:
        """Stock came back in Redis, maybe for a sku whose row did not change."""
        self._returned.add(sku)

    def sku_changed(self, sku: str) -> None:
        """An admin change writes the row: the sku is active already."""

    def state_dropped(self) -> None:
        """Redis's state was dropped: every sku is looked at again."""
        self._every = True

    def feed_resumed(self) -> None:
        """Announcements may have been missed: every sku is looked at again."""
        self._every = True

    async def adopt_database(self) -> None:
        """Make the Redis state this database's: state stamped by another
        (restored, failed over) is dropped, to be reloaded from PostgreSQL."""
        if await self._stamp.adopt(await self._database.read()):
            log.warning("redis_state_dropped", reason="another database")

    async def reconcile(self, sku: str) -> Found:
        """One pass over one sku, under its flush lock."""
        async with self._locks.held(sku):
            # Without a lock a flush may sit between its commit and its settle.
            return await self._reconcile(sku, exact=self._locks.enabled)

    async def _reconcile(self, sku: str, *, exact: bool) -> Found:
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
        if await self._selling_in_redis(sku):
            drift, pending, repaired, counter = await self._check(sku, exact=exact)
        else:
            drift, repaired, counter = 0, False, None
            pending = sum(p.qty for p in await reservations.pending(sku))
        confirmed = sum(1 for s in settlements if s.verdict is Verdict.CONFIRMED)
        released = len(settlements) - confirmed
        quiet = not (pending or drift or counter)
        return Found(SkuReconciliation(confirmed, released, pending, drift, repaired), quiet)

    async def _selling_in_redis(self, sku: str) -> bool:
        """Whether the sku sells from a Redis counter (an archived one sells no more)."""
        try:
            return (await self._catalog.strategy(sku)).reserves
        except UnknownSku:
            return False

    async def _check(self, sku: str, *, exact: bool) -> tuple[int, int, bool, int | None]:
        """(drift, pending units, repaired, Redis stock after);
        drift = db - (redis + pending - committed)."""
        reservations, orders = self._reservations, self._orders
        given = await reservations.returns_given(sku)
        redis_stock, pending = await reservations.snapshot(sku)
        db_stock = await orders.stock(sku)
        units = sum(p.qty for p in pending)
        if db_stock is None or redis_stock is None:
            # A missing key is reloaded on the next purchase; nothing to compare.
            return 0, units, False, redis_stock
        found = await orders.orders([p.request_id for p in pending])
        committed = sum(p.qty for p in pending if p.request_id in found)
        drift = db_stock - (redis_stock + units - committed)
        if drift:
            db_stock = await self._stock_as_given(sku, given)
            if db_stock is None:
                return 0, units, False, redis_stock
            drift = db_stock - (redis_stock + units - committed)
        if drift == 0:
            self._suspect.pop(sku, None)
            return 0, units, False, redis_stock
        if not exact and self._suspect.get(sku) != drift:
            self._suspect[sku] = drift
            return drift, units, False, redis_stock
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
        return drift, units, True, after

    async def _stock_as_given(self, sku: str, given: int) -> int | None:
        """The database's stock as Redis saw the returns: every return counted
        but those not yet given to Redis. Between the two steps of a return
        (return_units.lua, then its record) Redis has the units while the
        database's stock still leaves them out as owed. None when a return was
        given since the pass read Redis (``given`` orders given then): its
        units may be in one read and not the other, so nothing is measured."""
        found = await self._orders.stock_and_owed(sku)
        if found is None:
            return None
        stock, owed = found
        in_redis = await self._reservations.returned(sku, list(owed))
        if await self._reservations.returns_given(sku) != given:
            return None
        return stock - sum(qty for rid, qty in owed.items() if rid not in in_redis)
