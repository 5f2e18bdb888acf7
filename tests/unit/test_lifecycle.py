"""An order's life after its 201 decided against fakes (issue 39): the use case
takes the Protocols of ``gateway.usecases.ports``, so an in-memory book that
keeps PostgreSQL's guarded transitions (pay and cancel before ``pay_by``,
expiry at or after it, refund of a paid or confirmed order; one payment id
for one order) shows what the use case makes of each outcome: the answers of
the races, the sweep's expiries and their returns to Redis, the returns owed
after a failure and finished later, and the turns of a waiting room."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import pytest
from structlog.testing import capture_logs

from gateway.domain.errors import (
    AlreadyPaid,
    NotFound,
    OrderCancelled,
    OrderExpired,
    OrderNotPaid,
    OrderPaid,
    OrderRefunded,
    PaymentIdTaken,
    RedisUnavailable,
)
from gateway.domain.model import (
    Cause,
    Closed,
    Order,
    OrderStatus,
    SkuInfo,
    Strategy,
    WaitingRoom,
)
from gateway.domain.payments import (
    BuyerOrder,
    LatePayment,
    LateStatus,
    OrderCursor,
    Paying,
)
from gateway.usecases.lifecycle import OrderLifecycle

SKU, ROOM_SKU = "sku-1", "sku-room"
LIVE = {OrderStatus.PENDING_PAYMENT, OrderStatus.PAID, OrderStatus.CONFIRMED}


@dataclass
class Row:
    """One order of the fake book."""

    order: Order
    pay_by: float | None
    payment_id: str | None = None
    closed_at: float | None = None
    synced: bool = True
    units: int = 0


@dataclass
class Book:
    """PostgreSQL's side in memory: the transitions, the sweep's reads, the
    late payments; ``now`` is the database's clock, moved by the test."""

    now: float = 0.0
    rows: dict[str, Row] = field(default_factory=dict)
    payments: dict[str, str] = field(default_factory=dict)
    late: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, rid: str, *, window_s: float | None = 60.0, sku: str = SKU) -> None:
        """An order of one unit, pending for ``window_s`` (None: confirmed)."""
        status = OrderStatus.CONFIRMED if window_s is None else OrderStatus.PENDING_PAYMENT
        order = Order(f"o-{rid}", rid, sku, f"u-{rid}", 1, status)
        self.rows[rid] = Row(order, None if window_s is None else self.now + window_s)

    def status(self, rid: str) -> str:
        return self.rows[rid].order.status

    def _set(self, rid: str, status: OrderStatus) -> Row:
        row = self.rows[rid]
        row.order = replace(row.order, status=status)
        return row

    def _closed(self, rid: str, status: OrderStatus, units: int) -> Closed:
        row = self._set(rid, status)
        row.closed_at, row.synced, row.units = self.now, False, units
        return Closed(row.order, owed=True, units=units, payment_id=row.payment_id)

    def _pending(self, rid: str) -> bool:
        row = self.rows.get(rid)
        return row is not None and row.order.status == OrderStatus.PENDING_PAYMENT

    async def pay(self, request_id: str, payment_id: str) -> Paying | None:
        row = self.rows.get(request_id)
        if row is None:
            return None
        owner = self.payments.get(payment_id)
        if self._pending(request_id) and row.pay_by is not None and row.pay_by > self.now:
            if owner not in (None, request_id):
                raise PaymentIdTaken("taken")
            self.payments[payment_id] = request_id
            row.payment_id = payment_id
            return Paying(self._set(request_id, OrderStatus.PAID).order, payment_id, won=True)
        return Paying(row.order, row.payment_id, taken=owner not in (None, request_id))

    async def cancel(self, request_id: str, reason: str | None, cause: Cause) -> Closed | None:
        row = self.rows.get(request_id)
        if self._pending(request_id) and row is not None and (row.pay_by or 0) > self.now:
            return self._closed(request_id, OrderStatus.CANCELLED, row.order.qty)
        return None

    async def expire(self, request_id: str) -> Closed | None:
        row = self.rows.get(request_id)
        if self._pending(request_id) and row is not None and (row.pay_by or 0) <= self.now:
            return self._closed(request_id, OrderStatus.EXPIRED, row.order.qty)
        return None

    async def refund(
        self, request_id: str, *, restock: bool, reason: str | None, cause: Cause
    ) -> Closed | None:
        row = self.rows.get(request_id)
        if row is None or row.order.status not in (OrderStatus.PAID, OrderStatus.CONFIRMED):
            return None
        return self._closed(request_id, OrderStatus.REFUNDED, row.order.qty if restock else 0)

    async def order(self, request_id: str) -> Paying | None:
        row = self.rows.get(request_id)
        return None if row is None else Paying(row.order, row.payment_id)

    async def record_late(self, payment_id: str, order: Order) -> bool:
        if self.payments.get(payment_id, order.request_id) != order.request_id:
            raise PaymentIdTaken("taken")
        if payment_id in self.late:
            return False
        self.payments[payment_id] = order.request_id
        self.late[payment_id] = (order.request_id, order.status)
        return True

    async def expire_due(self, limit: int) -> list[Closed]:
        due = [
            rid
            for rid, row in self.rows.items()
            if self._pending(rid) and row.pay_by is not None and row.pay_by <= self.now
        ][:limit]
        return [self._closed(rid, OrderStatus.EXPIRED, 1) for rid in due]

    async def owed(self, older_than_s: float, limit: int) -> list[Closed]:
        return [
            Closed(row.order, owed=True, units=row.units)
            for row in self.rows.values()
            if not row.synced and (row.closed_at or 0) <= self.now - older_than_s
        ][:limit]

    async def mark_synced(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self.rows[rid].synced = True

    async def next_deadline_s(self) -> float | None:
        due = [
            r.pay_by - self.now for rid, r in self.rows.items() if self._pending(rid) and r.pay_by
        ]
        return min(due, default=None)

    async def held(self) -> tuple[int, int]:
        pending = [r for rid, r in self.rows.items() if self._pending(rid)]
        return len(pending), sum(r.order.qty for r in pending)

    async def late_payments(self, status: LateStatus, after: int, limit: int) -> list[LatePayment]:
        raise AssertionError("not asked here")

    async def refund_late(self, payment_id: str) -> tuple[LatePayment, bool] | None:
        raise AssertionError("not asked here")

    async def buyer_orders(
        self,
        user_id: str,
        *,
        sku: str | None,
        status: OrderStatus | None,
        before: OrderCursor | None,
        limit: int,
    ) -> list[BuyerOrder]:
        raise AssertionError("not asked here")


@dataclass
class Redis:
    """return_units.lua and room_leave.lua: what each was given, failing while
    ``down``."""

    down: bool = False
    returned: list[tuple[str, str, int]] = field(default_factory=list)
    turns: list[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=list)

    async def return_units(self, sku: str, closed: Iterable[Closed]) -> int:
        if self.down:
            raise RedisUnavailable("down")
        given = [(sku, c.order.request_id, c.units) for c in closed]
        self.returned += given
        return len(given)

    async def end_turns(self, sku: str, spent: Sequence[tuple[str, str]]) -> int:
        if self.down:
            raise RedisUnavailable("down")
        self.turns.append((sku, tuple(spent)))
        return len(spent)


class Catalog:
    """Two skus: one plain, one behind a waiting room."""

    async def get(self, sku: str) -> SkuInfo:
        room = WaitingRoom(admit_per_s=10, token_ttl_s=60) if sku == ROOM_SKU else None
        return SkuInfo(sku, per_user_limit=1, waiting_room=room)

    def strategy_of(self, info: SkuInfo) -> Strategy:
        return Strategy.RESERVE_BATCH

    async def strategy(self, sku: str) -> Strategy:
        return Strategy.RESERVE_BATCH


@dataclass
class Metrics:
    """The observer, kept."""

    closed_as: list[str] = field(default_factory=list)
    late: int = 0
    late_refunds: int = 0
    lags: list[float] = field(default_factory=list)

    def closed(self, status: str, count: int = 1) -> None:
        self.closed_as += [status] * count

    def late_payment(self) -> None:
        self.late += 1

    def late_refunded(self) -> None:
        self.late_refunds += 1

    def sample(self, pending: int, units: int) -> None:
        """Not looked at here."""

    def returned(self, lag_s: float) -> None:
        self.lags.append(lag_s)


@dataclass
class World:
    """The use case and its fakes."""

    book: Book = field(default_factory=Book)
    redis: Redis = field(default_factory=Redis)
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def lifecycle(self) -> OrderLifecycle:
        return OrderLifecycle(
            transitions=self.book,
            sweeps=self.book,
            listings=self.book,
            returns=self.redis,
            rooms=self.redis,
            catalog=Catalog(),
            metrics=self.metrics,
            sweep_s=0.05,
        )


@pytest.fixture
def world() -> World:
    return World()


class TestRaceOutcomes:
    """What each caller is answered when another transition came first."""

    async def test_a_payment_after_a_cancel_is_recorded_late(self, world: World) -> None:
        """Cancelled first: the payment is 409 order_cancelled and recorded once
        for a refund (the same payment again records nothing more)."""
        world.book.add("a")
        assert (
            await world.lifecycle.cancel("a", reason=None, cause=Cause.BUYER)
        ).status == "cancelled"
        for _ in range(2):
            with pytest.raises(OrderCancelled):
                await world.lifecycle.pay("a", "p1")
        assert world.book.late == {"p1": ("a", "cancelled")} and world.metrics.late == 1

    async def test_a_cancel_after_a_payment_is_refused(self, world: World) -> None:
        """Paid first: the cancel is 409 order_paid; the same payment again is
        the same 200, another 409 already_paid, and no unit went back."""
        world.book.add("a")
        assert (await world.lifecycle.pay("a", "p1")).status == "paid"
        with pytest.raises(OrderPaid):
            await world.lifecycle.cancel("a", reason=None, cause=Cause.BUYER)
        assert (await world.lifecycle.pay("a", "p1")).status == "paid"
        with pytest.raises(AlreadyPaid):
            await world.lifecycle.pay("a", "p2")
        assert world.redis.returned == [] and world.metrics.closed_as == ["paid"]

    async def test_a_payment_past_the_deadline_expires_the_order_first(self, world: World) -> None:
        """No sweep came yet: the payment finds the order due, expires it (its
        unit returned), and is answered 409 order_expired, recorded late."""
        world.book.add("a", window_s=1)
        world.book.now = 5
        with pytest.raises(OrderExpired):
            await world.lifecycle.pay("a", "p1")
        assert world.book.status("a") == "expired"
        assert world.redis.returned == [(SKU, "a", 1)] and world.book.late == {
            "p1": ("a", "expired")
        }

    async def test_a_refund_decides_once_and_refuses_what_is_not_paid(self, world: World) -> None:
        """A paid order refunded twice: one transition, one return; a pending
        one: 409 order_not_paid; then a cancel and the refunded payment are
        409 order_refunded, a new payment is recorded late."""
        world.book.add("a")
        world.book.add("b")
        await world.lifecycle.pay("a", "p1")
        for _ in range(2):
            closed = await world.lifecycle.refund(
                "a", restock=True, reason="returned", cause=Cause.PAYMENT
            )
            assert (closed.order.status, closed.payment_id) == ("refunded", "p1")
        assert world.redis.returned == [(SKU, "a", 1)]
        assert world.metrics.closed_as == ["paid", "refunded"]
        with pytest.raises(OrderNotPaid):
            await world.lifecycle.refund("b", restock=True, reason=None, cause=Cause.PAYMENT)
        with pytest.raises(OrderRefunded):
            await world.lifecycle.cancel("a", reason=None, cause=Cause.BUYER)
        with pytest.raises(OrderRefunded):
            await world.lifecycle.pay("a", "p1")
        assert world.book.late == {}
        with pytest.raises(OrderRefunded):
            await world.lifecycle.pay("a", "p9")
        assert world.book.late == {"p9": ("a", "refunded")}

    async def test_a_refund_without_restock_frees_the_buyer_and_no_unit(self, world: World) -> None:
        """The return of a refund without restock carries no unit."""
        world.book.add("a", window_s=None)
        await world.lifecycle.refund("a", restock=False, reason=None, cause=Cause.ADMIN)
        assert world.redis.returned == [(SKU, "a", 0)]

    async def test_a_payment_id_of_another_order_is_taken_whatever_this_order_is(
        self, world: World
    ) -> None:
        """p1 paid a; p1 for b pending, cancelled or unknown-to-payments: 409
        payment_id_taken, never recorded for b."""
        world.book.add("a")
        world.book.add("b")
        world.book.add("c")
        await world.lifecycle.pay("a", "p1")
        await world.lifecycle.cancel("c", reason=None, cause=Cause.BUYER)
        for rid in ("b", "c"):
            with pytest.raises(PaymentIdTaken):
                await world.lifecycle.pay(rid, "p1")
        assert world.book.late == {} and world.book.status("b") == "pending_payment"

    async def test_unknown_orders_are_not_found(self, world: World) -> None:
        """Pay, cancel and refund of an unknown request id: NotFound."""
        with pytest.raises(NotFound):
            await world.lifecycle.pay("x", "p1")
        with pytest.raises(NotFound):
            await world.lifecycle.cancel("x", reason=None, cause=Cause.BUYER)
        with pytest.raises(NotFound):
            await world.lifecycle.refund("x", restock=True, reason=None, cause=Cause.PAYMENT)


class TestSweep:
    """The sweep expires what is due and gives its units back, once."""

    async def test_due_orders_expire_and_their_units_come_back(self, world: World) -> None:
        """Two orders due, one not: the sweep expires the two, returns both
        units and records them returned; the third stays pending."""
        for rid, window in (("a", 1), ("b", 2), ("c", 100)):
            world.book.add(rid, window_s=window)
        world.book.now = 10
        assert await world.lifecycle.sweep() == 2
        assert [world.book.status(r) for r in "abc"] == ["expired", "expired", "pending_payment"]
        assert sorted(world.redis.returned) == [(SKU, "a", 1), (SKU, "b", 1)]
        assert all(world.book.rows[r].synced for r in "ab")
        assert world.metrics.closed_as == ["expired", "expired"]
        assert await world.lifecycle.sweep() == 0 and len(world.redis.returned) == 2

    async def test_a_return_redis_missed_stays_owed_until_a_later_sweep(self, world: World) -> None:
        """Redis down at the expiry: the order is expired in the book, its return
        owed (logged), nothing lost; a sweep after the grace gives it back."""
        world.book.add("a", window_s=1)
        world.book.now = 2
        world.redis.down = True
        with capture_logs() as logs:
            assert await world.lifecycle.sweep() == 1
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["return_owed"]
        assert world.book.status("a") == "expired" and not world.book.rows["a"].synced
        world.redis.down = False
        assert await world.lifecycle.sweep() == 0
        assert world.redis.returned == [], "taken over before the grace was over"
        world.book.now = 10
        with capture_logs() as logs:
            await world.lifecycle.sweep()
        assert world.redis.returned == [(SKU, "a", 1)] and world.book.rows["a"].synced
        assert [e["event"] for e in logs] == ["returns_finished"]

    async def test_a_closed_order_of_a_room_ends_its_buyers_turn(self, world: World) -> None:
        """An expiry in a waiting room's sku ends the buyer's turn there; one in
        a plain sku touches no room."""
        world.book.add("a", window_s=1, sku=ROOM_SKU)
        world.book.add("b", window_s=1)
        world.book.now = 2
        await world.lifecycle.sweep()
        assert world.redis.turns == [(ROOM_SKU, (("u-a", "a"),))]
