"""An order's life after its 201: pay, cancel, and the expiry sweep.

PostgreSQL decides every transition (``gateway.postgres.lifecycle``); this
module answers with what it decided and returns the units of a cancelled or
expired order to Redis. That return comes after the commit, so a crash
between the two would lose it: the order stays owed (``synced_at`` NULL) until
``lua/return_units.lua`` ran, and every gateway's sweep finishes the owed ones
it finds, each given once whoever gives it. Between the script and its record
Redis has the units while PostgreSQL still counts them owed: the reconciler
tells such a return from drift by the sku's ``returned`` hash
(``gateway.usecases.reconciler``), so the return path takes no lock.

The order row is the timer. Each gateway runs :meth:`OrderLifecycle.run`, no
leader: it expires what is due with ``FOR UPDATE SKIP LOCKED`` (two sweeps
share the work), sleeps until the earliest deadline or
``GATEWAY_EXPIRY_SWEEP_S``, whichever comes first, and survives restarts
since the deadlines live in PostgreSQL.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol

import structlog

from gateway.domain.errors import (
    MAX_RETRY_AFTER_S,
    AlreadyPaid,
    GatewayError,
    NoPaymentWindow,
    NotFound,
    OrderCancelled,
    OrderExpired,
    OrderNotPaid,
    OrderPaid,
    OrderRefunded,
    PaymentIdTaken,
    Unavailable,
    UnknownSku,
)
from gateway.domain.model import (
    SOLD_OUT,
    Cause,
    Closed,
    Order,
    OrderStatus,
    Outcome,
    Purchase,
    Result,
    SkuInfo,
)
from gateway.domain.payments import BuyerOrder, LatePayment, LateStatus, OrderCursor, Page
from gateway.domain.stock import replayed
from gateway.lock.tasks import rest, stop_if_cancelled
from gateway.usecases.ports import (
    HeldCounts,
    Listings,
    OrderLookup,
    Returns,
    SkuCatalog,
    Sweeps,
    Transitions,
    TurnEnds,
)

log = structlog.get_logger(__name__)

# Orders a sweep expires per transaction; a longer list is the next pass's.
SWEEP_BATCH = 500
# A return is owed this long after its commit before a sweep takes it over
# from the gateway that committed it (which normally gives it within ms).
OWED_GRACE_S = 2.0
# How often the sweep samples the orders and units held.
SAMPLE_EVERY_S = 5.0
# A pending order past its deadline is expired by the payment that found it,
# then looked at again: twice is enough, the second look sees it closed.
_LOOKS = 3

# A payment of an order closed so: refused, and recorded for a refund.
_CLOSED_AS: dict[str, type[GatewayError]] = {
    OrderStatus.EXPIRED: OrderExpired,
    OrderStatus.CANCELLED: OrderCancelled,
    OrderStatus.REFUNDED: OrderRefunded,
}
# A cancel of an order that is not pending.
_NOT_CANCELLED: dict[str, type[GatewayError]] = {
    OrderStatus.PAID: OrderPaid,
    OrderStatus.EXPIRED: OrderExpired,
    OrderStatus.REFUNDED: OrderRefunded,
    OrderStatus.CONFIRMED: NoPaymentWindow,
}


class LifecycleObserver(Protocol):
    """What the lifecycle reports (gateway.ops.lifecycle_metrics)."""

    def closed(self, status: str, count: int = 1) -> None:
        """``count`` orders left pending_payment as ``status``."""

    def late_payment(self) -> None:
        """A payment came after its order closed."""

    def late_refunded(self) -> None:
        """A late payment was marked refunded."""

    def sample(self, pending: int, units: int) -> None:
        """Orders pending payment now, and the units they hold."""

    def returned(self, lag_s: float) -> None:
        """An expired order's units are back on sale ``lag_s`` after its deadline."""


class OrderLifecycle:
    """Pays and cancels orders, and sweeps the expired ones back on sale."""

    def __init__(
        self,
        *,
        transitions: Transitions,
        sweeps: Sweeps,
        listings: Listings,
        returns: Returns,
        rooms: TurnEnds,
        catalog: SkuCatalog,
        metrics: LifecycleObserver,
        sweep_s: float,
    ) -> None:
        self._db = transitions
        self._sweeps = sweeps
        self._listings = listings
        self._returns = returns
        self._rooms = rooms
        self._catalog = catalog
        self._metrics = metrics
        self._sweep_s = sweep_s

    async def pay(self, request_id: str, payment_id: str) -> Order:
        """Pay the order: the order, paid (again, for the same ``payment_id``).

        Raises :class:`NotFound`, :class:`AlreadyPaid` (paid with another id),
        :class:`OrderExpired` / :class:`OrderCancelled` / :class:`OrderRefunded`
        (a payment other than the refunded one is recorded for a refund),
        :class:`NoPaymentWindow`, :class:`PaymentIdTaken` (the id is another
        order's, paid or refused late, whatever this order's state)."""
        for _ in range(_LOOKS):
            found = await self._db.pay(request_id, payment_id)
            if found is None:
                raise NotFound(f"no order for request {request_id!r}")
            if found.taken:
                raise PaymentIdTaken(f"payment {payment_id!r} is another order's")
            order = found.order
            if order.status == OrderStatus.PAID:
                if found.payment_id != payment_id:
                    raise AlreadyPaid(f"paid by payment {found.payment_id!r}")
                if found.won:
                    self._metrics.closed(OrderStatus.PAID)
                return order
            if order.status != OrderStatus.PENDING_PAYMENT:
                await self._refuse_payment(order, found.payment_id, payment_id)
            # Pending past its deadline: no sweep took it yet. Expire it here.
            await self._return_units(await self._expired(request_id))
        raise Unavailable("the order kept changing; retry")

    async def _refuse_payment(self, order: Order, paid_by: str | None, payment_id: str) -> None:
        """Refuse a payment of an order that takes none: a payment of a closed
        order (but the one a refund returned) is recorded for a refund."""
        if order.status == OrderStatus.CONFIRMED:
            raise NoPaymentWindow("the order was final at its 201")
        if order.status == OrderStatus.REFUNDED and paid_by == payment_id:
            raise OrderRefunded("the order was refunded, this payment with it")
        if await self._db.record_late(payment_id, order):
            self._metrics.late_payment()
        raise _CLOSED_AS[order.status](
            f"the order is {order.status}; payment recorded for a refund"
        )

    async def cancel(self, request_id: str, *, reason: str | None, cause: Cause) -> Order:
        """Cancel the order, its units back on sale: the order, cancelled (again,
        for a cancel sent again). Raises :class:`NotFound`, :class:`OrderPaid`,
        :class:`OrderExpired`, :class:`OrderRefunded`, :class:`NoPaymentWindow`."""
        for _ in range(_LOOKS):
            closed = await self._db.cancel(request_id, reason, cause)
            if closed is not None:
                self._metrics.closed(OrderStatus.CANCELLED)
                await self._return_units([closed])
                return closed.order
            found = await self._db.order(request_id)
            if found is None:
                raise NotFound(f"no order for request {request_id!r}")
            if found.order.status == OrderStatus.CANCELLED:
                return found.order
            refused = _NOT_CANCELLED.get(found.order.status)
            if refused is not None:
                raise refused(f"the order is {found.order.status}")
            await self._return_units(await self._expired(request_id))
        raise Unavailable("the order kept changing; retry")

    async def refund(
        self, request_id: str, *, restock: bool, reason: str | None, cause: Cause
    ) -> Closed:
        """Refund a paid order (or a confirmed one, without a window): with
        ``restock`` its units go back on sale as a cancel's do, exactly once.
        A refund sent again answers the refunded order as it stands. Raises
        :class:`NotFound`, :class:`OrderNotPaid` (pending, cancelled, expired)."""
        closed = await self._db.refund(request_id, restock=restock, reason=reason, cause=cause)
        if closed is not None:
            self._metrics.closed(OrderStatus.REFUNDED)
            await self._return_units([closed])
            return closed
        found = await self._db.order(request_id)
        if found is None:
            raise NotFound(f"no order for request {request_id!r}")
        if found.order.status != OrderStatus.REFUNDED:
            raise OrderNotPaid(f"the order is {found.order.status}")
        return Closed(found.order, owed=False, units=0, payment_id=found.payment_id)

    async def late_payments(self, status: LateStatus, after: int, limit: int) -> Page[LatePayment]:
        """A page of the late payments of ``status``, oldest first, after the
        cursor ``after`` (0: from the first), and the next page's cursor."""
        found = await self._listings.late_payments(status, after, limit + 1)
        page = found[:limit]
        return Page(page, str(page[-1].seq) if len(found) > limit else None)

    async def refund_late(self, payment_id: str) -> LatePayment:
        """Mark a late payment refunded (again: as it stands); raises :class:`NotFound`."""
        found = await self._listings.refund_late(payment_id)
        if found is None:
            raise NotFound(f"no late payment {payment_id!r}")
        late, now = found
        if now:
            self._metrics.late_refunded()
        return late

    async def buyer_orders(
        self,
        user_id: str,
        *,
        sku: str | None,
        status: OrderStatus | None,
        before: OrderCursor | None,
        limit: int,
    ) -> Page[BuyerOrder]:
        """A page of a buyer's orders, newest first, and the next page's cursor."""
        found = await self._listings.buyer_orders(
            user_id, sku=sku, status=status, before=before, limit=limit + 1
        )
        page = found[:limit]
        return Page(page, str(page[-1].cursor) if len(found) > limit else None)

    async def _expired(self, request_id: str) -> list[Closed]:
        closed = await self._db.expire(request_id)
        if closed is None:
            return []
        self._metrics.closed(OrderStatus.EXPIRED)
        return [closed]

    async def sweep(self) -> int:
        """Expire every order due now and give its units back, then finish the
        returns owed for a while; returns how many orders this pass expired."""
        expired = 0
        while True:
            closed = await self._sweeps.expire_due(SWEEP_BATCH)
            expired += len(closed)
            self._metrics.closed(OrderStatus.EXPIRED, len(closed))
            await self._return_units(closed)
            if len(closed) < SWEEP_BATCH:
                break
        owed = await self._sweeps.owed(OWED_GRACE_S, SWEEP_BATCH)
        if owed:
            log.warning("returns_finished", count=len(owed))
            await self._return_units(owed)
        return expired

    async def run(self) -> None:
        """Sweep until cancelled: at each deadline, or every ``GATEWAY_EXPIRY_SWEEP_S``;
        a failed pass is logged and the next one tries again, so the task never
        dies quietly (the deadlines wait in PostgreSQL meanwhile)."""
        sampled = 0.0
        while True:
            wait = self._sweep_s
            try:
                await self.sweep()
                if time.monotonic() - sampled >= SAMPLE_EVERY_S:
                    sampled = time.monotonic()
                    pending, units = await self._sweeps.held()
                    self._metrics.sample(pending, units)
                due_in = await self._sweeps.next_deadline_s()
                if due_in is not None:
                    wait = min(wait, max(due_in, 0.0))
            except Unavailable as exc:
                stop_if_cancelled(exc)
                log.warning("expiry_sweep_failed", error=str(exc))
            except Exception as exc:
                stop_if_cancelled(exc)
                log.exception("expiry_sweep_failed")
            await rest(wait)

    async def _return_units(self, closed: Iterable[Closed]) -> None:
        """Put closed orders' units back on sale in Redis (those owed to it), then
        record it, and end the waiting-room turns they spent. A failure leaves
        them owed: a later sweep returns them."""
        closed = list(closed)
        by_sku: dict[str, list[Closed]] = defaultdict(list)
        for c in closed:
            if c.owed:
                by_sku[c.order.sku].append(c)
            else:
                self._observe(c.order)
        for sku, owed in by_sku.items():
            try:
                await self._returns.return_units(sku, owed)
                for c in owed:
                    self._observe(c.order)
                await self._sweeps.mark_synced([c.order.request_id for c in owed])
            except Unavailable as exc:
                log.warning("return_owed", sku=sku, count=len(owed), error=str(exc))
        await self._end_turns(closed)

    async def _end_turns(self, closed: Sequence[Closed]) -> None:
        """A buyer whose order closed joins the waiting room again at the back, at
        once: the unit went back to the next ticket in line, and a turn kept
        would let a buyer who let it lapse take the unit again, ahead of that
        line. Not done (Redis failed): they join again once the token's
        lifetime passed, as a buyer who let an admission lapse."""
        by_sku: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for c in closed:
            by_sku[c.order.sku].append((c.order.user_id, c.order.request_id))
        for sku, spent in by_sku.items():
            try:
                if (await self._catalog.get(sku)).waiting_room is not None:
                    await self._rooms.end_turns(sku, spent)
            except UnknownSku:
                # Archived: its line is closed to everyone, so no turn is left to end.
                continue
            except Unavailable as exc:
                log.warning("room_turns_kept", sku=sku, count=len(spent), error=str(exc))

    def _observe(self, order: Order) -> None:
        """The lag from an expired order's deadline to its units back on sale."""
        if order.status == OrderStatus.EXPIRED and order.pay_by is not None:
            lag = time.time() - datetime.fromisoformat(order.pay_by).timestamp()
            self._metrics.returned(max(lag, 0.0))


# How long a sku's held units are known without asking again: a storm of
# sold-out answers costs a query a quarter second per sku and instance.
HELD_KNOWN_S = 0.25


class HeldUnits:
    """A sold-out answer of a sku with a payment window: while units are held
    for payment, it says how many and when the earliest deadline is."""

    def __init__(self, counts: HeldCounts) -> None:
        self._db = counts
        # sku -> (known until, units held, earliest deadline), time.monotonic().
        self._known: dict[str, tuple[float, int, float]] = {}

    async def sold_out(self, sku: str, *, fresh: bool = False) -> Result:
        """SOLD_OUT, with ``held`` and the seconds to the earliest deadline
        while units are held; ``fresh``: asked of PostgreSQL now."""
        now = time.monotonic()
        known = self._known.get(sku)
        if fresh or known is None or known[0] <= now:
            held, due_in = await self._db.held_of(sku)
            known = self._known[sku] = (now + HELD_KNOWN_S, held, now + due_in)
        _, held, due = known
        if not held:
            return SOLD_OUT
        retry_after_s = min(MAX_RETRY_AFTER_S, max(1, math.ceil(due - now)))
        return Result(Outcome.SOLD_OUT, held=held, retry_after_s=retry_after_s)


class PaymentWindow:
    """What a sku's payment window changes in a purchase's answer, decided here
    alone (:meth:`Purchases.purchase` asks it for the skus with one only, so a
    sku without one pays no await for it)."""

    def __init__(self, held: HeldUnits, orders: OrderLookup) -> None:
        self._held = held
        self._orders = orders

    async def answer(self, result: Result, purchase: Purchase, info: SkuInfo) -> Result:
        """``result``, as a sku with a payment window answers it: a sold out
        carries the units held for payment and a Retry-After to the earliest
        deadline, while there are any; a replay answered from Redis's done
        record, which has no pay_by, is answered from its order row, as its
        201 was."""
        if result is SOLD_OUT:
            return await self._held.sold_out(info.sku)
        order = result.order
        if order is not None and order.pay_by is None:
            found = await self._orders.order(order.request_id)
            if found is not None:
                return replayed(found, purchase)
        return result

    async def holding(self, info: SkuInfo) -> bool:
        """Whether units of the sku are held for orders pending payment (and may
        come back on sale): the waiting room keeps its line meanwhile."""
        if not info.payment_window_s:
            return False
        return (await self._held.sold_out(info.sku, fresh=True)).held > 0
