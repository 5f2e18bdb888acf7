"""The use cases' collaborators, each a small Protocol.

Every use case takes these, all required, wired in ``gateway.app``; an observer
left out is a no-op (:data:`UNOBSERVED`), never ``None``. No use case imports
an adapter (``gateway.redis``, ``gateway.postgres``, ``gateway.outbound``,
``gateway.write``): it speaks the domain's types to these, and
``tests/unit/test_purchases.py`` and its neighbours decide against fakes of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gateway.domain.errors import Unavailable
from gateway.domain.events import FirstEvents, OrderEvent, SinkStats
from gateway.domain.model import (
    Cause,
    Closed,
    Display,
    LimitGroup,
    Order,
    OrderStatus,
    Purchase,
    Result,
    SkuInfo,
    Strategy,
    Verdict,
)
from gateway.domain.payments import BuyerOrder, LatePayment, LateStatus, OrderCursor, Paying
from gateway.domain.rules import Bucket, GateAnswer
from gateway.domain.skus import IfMissing, SkuChange, SkuListing, SkuSheet, SkuState
from gateway.domain.stock import OrderPage, Pending, Prior, Reply, Settlement, Snapshot, StockLoad
from gateway.usecases.admission_tokens import Admission

# Names the client's address, asked only when a client rate limit applies.
Client = Callable[[], str | None] | None


class Reserve(Protocol):
    """:meth:`Reserving.reserve` or :meth:`Reserving.enqueue`."""

    async def __call__(
        self, purchase: Purchase, info: SkuInfo, client: Client = None, *, verified: bool = False
    ) -> Reply: ...


class Reserving(Protocol):
    """What the purchases ask of Redis (gateway.redis.reservations.Reservations)."""

    async def reserve(
        self, purchase: Purchase, info: SkuInfo, client: Client = None, *, verified: bool = False
    ) -> Reply: ...
    async def enqueue(
        self, purchase: Purchase, info: SkuInfo, client: Client = None, *, verified: bool = False
    ) -> Reply: ...
    async def available(self, sku: str) -> int | None: ...
    async def exhausted(self, sku: str) -> bool: ...
    async def confirmed_order(self, sku: str, request_id: str) -> Order | None: ...
    async def load_stock(self, sku: str, db_stock: int, mode: StockLoad) -> int: ...


class SkuCatalog(Protocol):
    """What the purchases know of each sku (gateway.usecases.catalog.Catalog)."""

    async def get(self, sku: str) -> SkuInfo: ...
    def strategy_of(self, info: SkuInfo) -> Strategy: ...
    async def strategy(self, sku: str) -> Strategy: ...


class Stocks(Protocol):
    """The database's stock of a sku (gateway.postgres.orders.Orders)."""

    async def stock(self, sku: str) -> int | None: ...


class OrderLookup(Protocol):
    """The order a request id made (gateway.postgres.lookups.OrderLookups)."""

    async def order(self, request_id: str) -> Order | None: ...


class PriorLookup(Protocol):
    """A new purchase's replay or repeat buyer (gateway.postgres.lookups.PriorLookups)."""

    async def prior(self, sku: str, request_id: str, user_id: str) -> Prior: ...


class Arbitration(Protocol):
    """A sold out made final in PostgreSQL (gateway.postgres.lookups.Arbitrations)."""

    async def order(self, sku: str, request_id: str) -> Order | None: ...


@dataclass(frozen=True, slots=True)
class Lookups:
    """PostgreSQL's answers while Redis's records cannot be trusted: a sold-out
    sku's unbuilt filter, a sku rebuilt, Redis doubted (gateway.postgres.lookups)."""

    orders: OrderLookup
    priors: PriorLookup
    arbitrations: Arbitration


class PaymentWindows(Protocol):
    """What a sku's payment window changes in a purchase's answer
    (gateway.usecases.lifecycle.PaymentWindow)."""

    async def answer(self, result: Result, purchase: Purchase, info: SkuInfo) -> Result: ...
    async def holding(self, info: SkuInfo) -> bool: ...


class Marking(Protocol):
    """Builds a sold-out sku's in-process mark (gateway.usecases.marking)."""

    def start(self, sku: str, generation: tuple[int, int], *, rebuilding: bool = False) -> None: ...


class Batching(Protocol):
    """Where reserved purchases go to be flushed: the batcher
    (gateway.write.batcher), or the host's lanes in front of it with several
    workers (gateway.write.lanes)."""

    @property
    def closing(self) -> bool: ...
    @property
    def full(self) -> bool: ...
    async def submit(self, purchase: Purchase) -> Result: ...


class GivingBack(Protocol):
    """Releases reservations that will not be flushed (gateway.write.flusher.Flusher)."""

    async def give_back(self, sku: str, batch: Sequence[Purchase]) -> None: ...


class Rebuilding(Protocol):
    """Rebuilds a sku's lost hashes in the background (gateway.usecases.rebuilds)."""

    def ensure(self, sku: str) -> None: ...


class QueuedIds(Protocol):
    """Which sku and buyer a queued request id belongs to (gateway.redis.streams.Streams)."""

    async def remember(self, request_id: str, sku: str, user_id: str) -> None: ...


class Deducting(Protocol):
    """The strategies that decide in PostgreSQL alone (:class:`Deductions`)."""

    async def purchase(
        self, strategy: Strategy, purchase: Purchase, info: SkuInfo, client: Client
    ) -> Result: ...


class Gate(Protocol):
    """The window and rate limits of a sku with no Redis state (SaleGate)."""

    async def enforce(self, purchase: Purchase, info: SkuInfo, client: Client) -> None: ...


class Draining(Protocol):
    """Whether this gateway is draining (the batcher, or the host's lanes)."""

    @property
    def closing(self) -> bool: ...


class ShedObserver(Protocol):
    """What the metrics want to know of a purchase refused for load (gateway.ops.metrics)."""

    def shed_one(self) -> None: ...


class PurchaseObserver(ShedObserver, Protocol):
    """What the metrics want to know of the purchases (see gateway.ops.metrics)."""

    def stock_reloaded(self) -> None: ...

    def purchase_confirmed(self, sku: str) -> None: ...


class BotCheck(Protocol):
    """A bot token's verdict from the provider that issued it
    (gateway.outbound.bot_check.SiteVerify), for the waiting rooms' joins."""

    @property
    def configured(self) -> bool:
        """Whether this instance can check bot tokens (GATEWAY_BOT_CHECK_URL)."""
        ...

    async def passes(self, token: str, remote_ip: str | None) -> bool:
        """Whether the provider vouches for ``token``; raises
        :class:`gateway.domain.errors.BotCheckUnavailable` when it cannot say."""
        ...

    async def close(self) -> None:
        """Release what the check holds (its connections)."""
        ...


# Why a waiting room is unavailable on an instance without GATEWAY_ADMISSION_SECRET.
NO_ADMISSION_SECRET = "waiting room: GATEWAY_ADMISSION_SECRET is not set"


class Signing(Protocol):
    """Signs and checks the waiting rooms' admission tokens
    (gateway.usecases.admission_tokens.Signer)."""

    @property
    def configured(self) -> bool:
        """Whether this instance can sign tokens (GATEWAY_ADMISSION_SECRET)."""
        ...

    def sign(self, sku: str, user_id: str, ticket: str, expires_ms: int) -> str:
        """The token admitting ``user_id`` to buy ``sku`` until ``expires_ms``."""
        ...

    def verify(self, token: str, sku: str, user_id: str) -> Admission | None:
        """The admission ``token`` grants, or None when it is not ours."""
        ...


class _NoSigner:
    """An instance without GATEWAY_ADMISSION_SECRET: its waiting rooms answer
    503, since no token could be signed or checked."""

    @property
    def configured(self) -> bool:
        """Not configured."""
        return False

    def sign(self, sku: str, user_id: str, ticket: str, expires_ms: int) -> str:
        """Refused: raises :class:`Unavailable`."""
        raise Unavailable(NO_ADMISSION_SECRET, retry_after=5)

    def verify(self, token: str, sku: str, user_id: str) -> Admission | None:
        """Refused: raises :class:`Unavailable`."""
        raise Unavailable(NO_ADMISSION_SECRET, retry_after=5)


NO_SIGNER = _NoSigner()


class AdmissionObserver(Protocol):
    """What the metrics want to know of the waiting rooms (see gateway.ops.metrics)."""

    def room_seen(self, sku: str, waiting: int, admitted_now: int) -> None: ...
    def admission_refused(self, reason: str) -> None: ...


class _NoBotCheck:
    """An instance without GATEWAY_BOT_CHECK_URL: no token passes (a room that
    checks is refused when configured here, and unservable if it arrives)."""

    @property
    def configured(self) -> bool:
        """Not configured."""
        return False

    async def passes(self, token: str, remote_ip: str | None) -> bool:
        """Never: failing closed."""
        return False

    async def close(self) -> None:
        """Nothing to release."""


NO_BOT_CHECK = _NoBotCheck()


class _Unobserved:
    """Purchases and waiting rooms nobody counts."""

    def shed_one(self) -> None:
        """Nothing to count."""

    def stock_reloaded(self) -> None:
        """Nothing to count."""

    def purchase_confirmed(self, sku: str) -> None:
        """Nothing to count."""

    def room_seen(self, sku: str, waiting: int, admitted_now: int) -> None:
        """Nothing to count."""

    def admission_refused(self, reason: str) -> None:
        """Nothing to count."""


UNOBSERVED = _Unobserved()


class Claimed(Protocol):
    """A batch of one sink's events held for the relay (gateway.postgres.outbox.Claim)."""

    @property
    def events(self) -> Sequence[OrderEvent]: ...
    @property
    def attempts(self) -> Sequence[int]:
        """Failed attempts so far, per event (what the next backoff grows from)."""
        ...

    async def record(
        self, delivered: Sequence[int], failed: Sequence[tuple[int, float, str]]
    ) -> list[float]:
        """Forget the delivered seqs; try each failed (seq, delay, why) again
        after its delay; the delivered events' lags."""
        ...


class Deliveries(Protocol):
    """What the relay asks of the outbox (gateway.postgres.outbox.Outbox)."""

    async def register(self, sink: str) -> None: ...
    def claim(
        self, sink: str, limit: int, *, packed: bool
    ) -> AbstractAsyncContextManager[Claimed]: ...
    async def due(self, sink: str) -> bool:
        """Whether a claim for ``sink`` may take anything now (never false when it would)."""
        ...

    async def dead_letter(self, sink: str, max_age_s: float) -> int: ...
    async def stats(self) -> list[SinkStats]: ...


class FirstEventsOut(Protocol):
    """Where a flush's first events are handed (gateway.redis.event_stream.EventStream)."""

    async def hand_off(self, flushes: Sequence[FirstEvents]) -> list[bool]:
        """Append every flush's first events in one go; per flush whether all
        of its events were appended."""
        ...


class HandOffRecords(Protocol):
    """The outbox's side of a hand-off (gateway.postgres.outbox.Outbox)."""

    async def handed_off(self, sink: str, tokens: Sequence[int]) -> int:
        """The flushes named by ``tokens`` handed their first events to ``sink``:
        it is owed them no more; how many batches that was."""
        ...


class Transitions(Protocol):
    """What an order's pay, cancel and refund ask of PostgreSQL, the arbiter
    (gateway.postgres.lifecycle.Lifecycle): each a guarded transition, None
    when it did not take place."""

    async def pay(self, request_id: str, payment_id: str) -> Paying | None: ...
    async def cancel(self, request_id: str, reason: str | None, cause: Cause) -> Closed | None: ...
    async def expire(self, request_id: str) -> Closed | None: ...
    async def refund(
        self, request_id: str, *, restock: bool, reason: str | None, cause: Cause
    ) -> Closed | None: ...
    async def order(self, request_id: str) -> Paying | None: ...
    async def record_late(self, payment_id: str, order: Order) -> bool: ...


class Sweeps(Protocol):
    """What the expiry sweep asks of PostgreSQL (gateway.postgres.lifecycle.Lifecycle)."""

    async def expire_due(self, limit: int) -> list[Closed]: ...
    async def owed(self, older_than_s: float, limit: int) -> list[Closed]: ...
    async def mark_synced(self, request_ids: Sequence[str]) -> None: ...
    async def next_deadline_s(self) -> float | None: ...
    async def held(self) -> tuple[int, int]: ...


class Listings(Protocol):
    """The late payments and a buyer's orders (gateway.postgres.lifecycle.Lifecycle)."""

    async def late_payments(
        self, status: LateStatus, after: int, limit: int
    ) -> list[LatePayment]: ...
    async def refund_late(self, payment_id: str) -> tuple[LatePayment, bool] | None: ...
    async def buyer_orders(
        self,
        user_id: str,
        *,
        sku: str | None,
        status: OrderStatus | None,
        before: OrderCursor | None,
        limit: int,
    ) -> list[BuyerOrder]: ...


class Returns(Protocol):
    """Closed orders' units back on sale in Redis (gateway.redis.reservations.Reservations)."""

    async def return_units(self, sku: str, closed: Iterable[Closed]) -> int: ...


class TurnEnds(Protocol):
    """A waiting room's turns spent on closed orders (gateway.redis.rooms.Rooms)."""

    async def end_turns(self, sku: str, spent: Sequence[tuple[str, str]]) -> int: ...


class HeldCounts(Protocol):
    """Units held for payment of a sku (gateway.postgres.lifecycle.Lifecycle)."""

    async def held_of(self, sku: str) -> tuple[int, float]: ...


# The limit groups' collaborators (gateway.usecases.limit_groups,
# gateway.usecases.group_tags).


class GroupStore(Protocol):
    """The limit groups in PostgreSQL (gateway.postgres.limit_groups.LimitGroups)."""

    async def put(self, name: str, per_user_limit: int) -> tuple[int | None, LimitGroup]: ...
    async def get(self, name: str) -> LimitGroup: ...
    async def delete(self, name: str) -> None: ...
    async def grouped_skus(self) -> dict[str, str]: ...


class SkuAnnouncer(Protocol):
    """Tells every instance that a sku changed (``meta:<sku>`` on the change feed,
    gateway.redis.reservations.Reservations)."""

    async def announce(self, sku: str) -> None: ...


class CatalogForgetting(Protocol):
    """This instance's catalog (gateway.usecases.catalog.Catalog)."""

    def forget(self, sku: str) -> None: ...


class Tags(Protocol):
    """Which limit group tags each sku's Redis keys (gateway.redis.layout.KeyTags)."""

    def group_of(self, sku: str) -> str | None: ...
    def set(self, sku: str, group: str | None) -> None: ...
    def replace(self, groups: dict[str, str]) -> None: ...


# The stock administration's and the reconciler's collaborators
# (gateway.usecases.admin, gateway.usecases.reconciler).


class SkuLocking(Protocol):
    """Each sku's lock (gateway.write.sku_locks.SkuLocks): one flush, admin
    change or reconcile of a sku at a time across the fleet."""

    @property
    def enabled(self) -> bool:
        """Whether a lock family is configured (else ``held`` holds nothing)."""
        ...

    def held(self, sku: str) -> AbstractAsyncContextManager[Any]:
        """The sku's lock, held for the ``async with`` block."""
        ...


class Counters(Protocol):
    """A sku's counter and ledger in Redis, as the admin and the reconciler
    change them (gateway.redis.reservations.Reservations)."""

    @property
    def tags(self) -> Tags: ...
    async def load_stock(self, sku: str, db_stock: int, mode: StockLoad) -> int: ...
    async def forget_stock(self, sku: str) -> None: ...
    async def drop_state(self, sku: str) -> None: ...
    async def announce(self, sku: str) -> None: ...
    async def available(self, sku: str) -> int | None: ...
    async def pending(self, sku: str) -> list[Pending]: ...
    async def snapshot(self, sku: str) -> Snapshot: ...
    async def settle(
        self, sku: str, settlements: Iterable[Settlement], db_stock_after: int | None
    ) -> int: ...
    async def returns_given(self, sku: str) -> int: ...
    async def returned(self, sku: str, request_ids: Sequence[str]) -> set[str]: ...


class OrderBooks(Protocol):
    """The order rows and the database's stock, as the admin and the reconciler
    read them (gateway.postgres.orders.Orders)."""

    async def stock(self, sku: str) -> int | None: ...
    async def units_sold(self, sku: str) -> int: ...
    async def orders(self, request_ids: Sequence[str]) -> dict[str, Order]: ...
    async def release_stale(
        self, sku: str, stale: Sequence[tuple[str, int]]
    ) -> dict[str, Order]: ...
    async def stock_and_owed(self, sku: str) -> tuple[int, dict[str, int]] | None: ...


class BuyersOrder(Protocol):
    """The order a request id made, for its buyer alone (gateway.postgres.orders.Orders)."""

    async def buyers_order(self, request_id: str, user_id: str) -> Order | None: ...


class OrderPages(Protocol):
    """A sku's orders page by page, for a rebuild (gateway.postgres.orders.Orders)."""

    async def order_page(self, sku: str, after_user: str, limit: int) -> OrderPage: ...


class SkuInfos(Protocol):
    """A sku's settings as the catalog caches them (gateway.postgres.inventory.Inventory)."""

    async def sku_info(self, sku: str) -> SkuInfo | None: ...


class SkuRows(Protocol):
    """The inventory rows as the admin changes and lists them
    (gateway.postgres.inventory.Inventory)."""

    async def change_sku(
        self, sku: str, fields: Mapping[str, Any], *, if_missing: IfMissing
    ) -> SkuChange | None: ...
    async def restock(self, sku: str, delta: int) -> int | None: ...
    async def archive(self, sku: str) -> tuple[datetime, bool] | None: ...
    async def listing(self, status: str, after: str, limit: int) -> list[SkuListing]: ...
    async def sheet(self, sku: str) -> SkuSheet | None: ...
    async def display(self, sku: str) -> Display: ...


class SkuStates(Protocol):
    """Each active sku's state, and its idleness (gateway.postgres.inventory.Inventory)."""

    async def states(self, *, every: bool = False) -> list[SkuState]: ...
    async def mark_idle(self, sku: str, updated_at: datetime) -> bool: ...
    async def mark_active(self, sku: str) -> None: ...


class RoomSkus(Protocol):
    """The skus with a waiting room, or a bot check (gateway.postgres.inventory.Inventory)."""

    async def waiting_room_skus(self, limit: int) -> list[str]: ...
    async def bot_check_skus(self, limit: int) -> list[str]: ...


class Stamping(Protocol):
    """Which database Redis's state came from (gateway.redis.identity.IdentityStamp)."""

    async def adopt(self, identity: str) -> bool:
        """Make ``identity`` Redis's; True when state stamped by another was dropped."""
        ...


class WhichDatabase(Protocol):
    """Which database this is (gateway.postgres.identity.DatabaseIdentity)."""

    async def read(self) -> str: ...


class Pruning(Protocol):
    """The pass pruning what traffic writes (gateway.postgres.retention.Retention)."""

    async def prune(self) -> object: ...


class RebuildLeases(Protocol):
    """The lease of a sku's hashes rebuilt from PostgreSQL
    (gateway.redis.rebuild_lease.RebuildLease)."""

    async def rebuilding(self, sku: str) -> bool: ...
    async def take(self, sku: str, owner: str, lease_ms: int) -> bool: ...
    async def write(self, sku: str, owner: str, lease_ms: int, fields: Sequence[str]) -> bool: ...
    async def finish(self, sku: str, owner: str) -> bool: ...


class ConfirmedIdsScan(Protocol):
    """A sku's confirmed request ids in Redis (gateway.redis.confirmed_scan.ConfirmedScan)."""

    async def count(self, sku: str) -> int: ...
    def ids(self, sku: str) -> AsyncIterator[list[str]]: ...


class SaleGateCall(Protocol):
    """``sale_gate()`` in PostgreSQL (gateway.postgres.sale_gate.PostgresSaleGate)."""

    async def check(
        self, purchase: Purchase, user: Bucket | None, client: Bucket | None
    ) -> GateAnswer: ...


class QueuedStatus(Protocol):
    """Where a queued request id stands (gateway.redis.streams.Streams)."""

    def group_of(self, sku: str) -> str | None: ...
    async def status(self, request_id: str, user_id: str) -> tuple[str | None, Verdict | None]: ...
