"""The purchase use case: sold-out check, reservation, then the batch.

A request walks: the catalog (the sku exists, the quantity is allowed), the
in-process sold-out mark, ``reserve.lua`` in Redis (``Reservations.reserve``), then
the batcher, whose flusher commits it in PostgreSQL. A stock key Redis lost is
reloaded from PostgreSQL once for all the requests that find it missing; its
hashes are rebuilt in the background (``gateway.usecases.rebuilds``).

That is the ``reserve-batch`` strategy, and ``queue``'s until the stream. A
sku on a strategy that does not reserve in Redis (``Strategy.reserves``) is
handed to its :class:`Deduction` right after the catalog
(``gateway.usecases.deductions``).

Each collaborator is a small Protocol (``gateway.usecases.ports``), all required, wired in
``gateway.app``: ``tests/unit/test_purchases.py`` decides purchases against
fakes of them.

Every strategy passes through :meth:`Purchases.purchase`, and so through the
sale rules in one place: the per-user limit here; the window and both rate
limits inside the reservation call for the strategies that reserve in Redis
(``lua/reserve.lua``, no extra round trip), through :class:`SaleGate` in
PostgreSQL for the others (``gateway.usecases.sale_gate``). The waiting room is in
front of this, in ``gateway.usecases.admission``, for every strategy alike.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from gateway.domain.errors import (
    InvalidRequest,
    RedisUnavailable,
    ShuttingDown,
    Unavailable,
)
from gateway.domain.model import (
    DUPLICATE,
    SOLD_OUT,
    Outcome,
    Purchase,
    Result,
    SkuInfo,
    Strategy,
)
from gateway.domain.stock import Reply, ReplyKind, StockLoad, outcome_of, replayed
from gateway.usecases.doubt import RedisDoubt
from gateway.usecases.ports import (
    UNOBSERVED,
    Batching,
    Client,
    Deducting,
    GivingBack,
    Lookups,
    Marking,
    PaymentWindows,
    PurchaseObserver,
    QueuedIds,
    Rebuilding,
    Reserve,
    Reserving,
    SkuCatalog,
    Stocks,
)
from gateway.usecases.sold_out import UNBUILT, ConfirmedIds, SoldOut, UnknownIds

log = structlog.get_logger(__name__)

# How long after reserve.lua answered UNVERIFIED this gateway checks a sku's
# purchases in PostgreSQL before its one reserve.lua call, instead of learning
# again from a first call each time. Then a purchase asks Redis first again:
# whether the rebuild ended, settled or its lease ran out (to take it over,
# well within the lease's 10 s).
RECHECK_S = 1.0

# reserve.lua's reply kinds, compared by identity: on CPython 3.11 a module
# global is several times cheaper to read than ReplyKind.OK on the hot path.
OK = ReplyKind.OK
MISSING = ReplyKind.MISSING
UNVERIFIED = ReplyKind.UNVERIFIED
SOLD_OUT_KIND = ReplyKind.SOLD_OUT
BUSY = ReplyKind.BUSY
IN_PROGRESS = ReplyKind.IN_PROGRESS


class Purchases:
    """Decides purchases; the batcher and its flusher commit the survivors."""

    def __init__(
        self,
        *,
        catalog: SkuCatalog,
        soldout: SoldOut,
        marking: Marking,
        reservations: Reserving,
        stocks: Stocks,
        lookups: Lookups,
        batcher: Batching,
        flusher: GivingBack,
        rebuilds: Rebuilding,
        streams: QueuedIds,
        deductions: Deducting,
        doubt: RedisDoubt,
        window: PaymentWindows,
        observer: PurchaseObserver = UNOBSERVED,
    ) -> None:
        self._catalog = catalog
        self._soldout = soldout
        self._marking = marking
        self._reservations = reservations
        self._stocks = stocks
        self._orders = lookups.orders
        self._priors = lookups.priors
        self._arbitrations = lookups.arbitrations
        self._batcher = batcher
        self._flusher = flusher
        self._rebuilds = rebuilds
        self._streams = streams
        self._deductions = deductions
        # Set when this gateway saw Redis fail lately: its sold-out answers to
        # request ids are checked in PostgreSQL (gateway.usecases.doubt).
        self._doubt = doubt
        self._observer = observer
        # What a sku's payment window changes in an answer (gateway.usecases.lifecycle).
        self._window = window
        self._reloads: dict[str, asyncio.Future[None]] = {}
        # The skus reserve.lua said are rebuilt, until when (time.monotonic()).
        self._rebuilding: dict[str, float] = {}

    def answered_confirmed(self, sku: str) -> None:
        """Count a purchase of ``sku`` answered 201 (the live sale's pace, per sku),
        whichever way it came in (a waiting room's, too)."""
        self._observer.purchase_confirmed(sku)

    async def purchase(self, purchase: Purchase, client: Client = None) -> Result:
        """Decide one purchase; ``client`` names the client's address (asked only
        when a client rate limit applies). Raises a :class:`GatewayError` for
        4xx/503 answers (not_started, ended and rate_limited included)."""
        info = await self._catalog.get(purchase.sku)
        if purchase.qty > info.per_user_limit:
            raise InvalidRequest(f"qty exceeds the per-user limit of {info.per_user_limit}")
        # The one place the strategy is chosen: the sku's own, else the gateway's.
        strategy = self._catalog.strategy_of(info)
        if not strategy.reserves:
            result = await self._deductions.purchase(strategy, purchase, info, client)
        elif (confirmed := self._soldout.lookup(purchase.sku)) is not None:
            result = await self._marked(purchase, confirmed)
        else:
            # A request id the client sent may be a replay; one made here is not.
            replayable = bool(purchase.request_id)
            purchase = purchase.identified()
            structlog.contextvars.bind_contextvars(request_id=purchase.request_id, sku=purchase.sku)
            self._admit()
            generation = self._soldout.generation(purchase.sku)
            queued = strategy is Strategy.QUEUE
            arrived_ms = int(time.time() * 1000)
            try:
                reply = await self._reserve(
                    purchase, info, client, queued=queued, generation=generation
                )
            except RedisUnavailable:
                self._doubt.failed()
                raise
            if isinstance(reply, Result):
                return reply
            kind = reply.kind
            if queued and (kind is OK or kind is IN_PROGRESS or kind is BUSY):
                return await self._queued(purchase, kind, replayable=replayable)
            if kind is OK:
                # Stamped by Redis's clock, like every reservation of every
                # instance, or by this attempt's arrival if earlier: a release
                # PostgreSQL records at a moment (a sold out arbitrated after
                # Redis failed) voids every attempt of the request id that
                # arrived before it, also one whose call waited out a failover
                # and reserved afterwards, when its client had long given up
                # and its retry been told no.
                reserved_at = min(reply.reserved_at_ms, arrived_ms)
                purchase = purchase.stamped(reserved_at)
                try:
                    return await self._batcher.submit(purchase)
                except ShuttingDown:
                    # Draining began while Redis reserved: nothing will flush it here.
                    await self._flusher.give_back(purchase.sku, [purchase])
                    raise
            if kind is SOLD_OUT_KIND:
                result = await self._sold_out(purchase, reply, generation, replayable=replayable)
            else:
                result = outcome_of(reply, purchase.request_id, info)
        # The one place a payment window changes an answer (not a flush's: its
        # order carries pay_by); a sku without one pays no await for it.
        windowed = info.payment_window_s
        return await self._window.answer(result, purchase, info) if windowed else result

    async def _marked(self, purchase: Purchase, confirmed: ConfirmedIds | UnknownIds) -> Result:
        """The answer of a sku marked sold out here: without a request id, or with
        one that has no order, sold out with no I/O; unless Redis failed lately,
        when its done hash, which the filter came from, may have lost the order."""
        if not purchase.request_id:
            return SOLD_OUT
        if purchase.request_id not in confirmed:
            return await self._replay(purchase, UNBUILT) if self._doubt else SOLD_OUT
        return await self._replay(purchase, confirmed)

    async def _sold_out(
        self, purchase: Purchase, reply: Reply, generation: tuple[int, int], *, replayable: bool
    ) -> Result:
        """reserve.lua's sold-out answer, after marking an exhausted sku; a request id
        the client sent is looked up in PostgreSQL while Redis is doubted (it may
        have lost the order's records: gateway.usecases.doubt)."""
        if reply.exhausted:
            self._marking.start(purchase.sku, generation)
        if replayable and self._doubt:
            return await self._replay(purchase, UNBUILT)
        return SOLD_OUT

    async def _reserve(
        self,
        purchase: Purchase,
        info: SkuInfo,
        client: Client,
        *,
        queued: bool,
        generation: tuple[int, int],
    ) -> Reply | Result:
        """reserve.lua's (or enqueue.lua's) reply, after reloading a missing counter;
        while the sku is rebuilt, PostgreSQL's answer to a replay or repeat buyer,
        and a sold-out sku's answer (marked sold out here at once)."""
        reserve = self._reservations.enqueue if queued else self._reservations.reserve
        if self._rebuilding.get(purchase.sku, 0.0) > time.monotonic():
            checked = await self._reserve_checked(reserve, purchase, info, client)
            if checked is not None:
                return checked
        reply = await reserve(purchase, info, client)
        if reply.kind is MISSING:
            await self._reload_once(purchase.sku)
            reply = await reserve(purchase, info, client)
        if reply.kind is not UNVERIFIED:
            return reply
        self._rebuilding[purchase.sku] = time.monotonic() + RECHECK_S
        if reply.orphaned:
            self._rebuilds.ensure(purchase.sku)
        if reply.exhausted:
            # Sold out for good: only a replay gets anything but sold out, and the
            # requests after this one are answered in-process.
            self._marking.start(purchase.sku, generation, rebuilding=True)
            return await self._replay(purchase, UNBUILT)
        known = await self._verify(purchase)
        if known is not None:
            return known
        return await reserve(purchase, info, client, verified=True)

    async def _reserve_checked(
        self,
        reserve: Reserve,
        purchase: Purchase,
        info: SkuInfo,
        client: Client,
    ) -> Reply | Result | None:
        """For a sku known to be rebuilt: PostgreSQL's answer to a replay or a
        repeat buyer, else reserve.lua's to the purchase sent verified (one call
        instead of an UNVERIFIED one first); None when the counter is missing."""
        known = await self._verify(purchase)
        if known is not None:
            return known
        reply = await reserve(purchase, info, client, verified=True)
        if reply.kind is MISSING:
            return None
        if reply.kind is SOLD_OUT_KIND:
            # The next purchase asks Redis first: exhausted, it marks the sku.
            self._rebuilding.pop(purchase.sku, None)
        return reply

    async def available(self, sku: str) -> int:
        """Units left to reserve: Redis's count, else the database's (the only count
        of a sku whose strategy keeps no Redis state); raises UnknownSku."""
        if not (await self._catalog.strategy(sku)).reserves:
            return await self._stocks.stock(sku) or 0
        available = await self._reservations.available(sku)
        if available is None:
            available = await self._stocks.stock(sku) or 0
        return available

    async def exhausted(self, info: SkuInfo) -> bool:
        """Whether ``info``'s sku has nothing left to sell: no stock, and for a
        strategy that reserves in Redis nothing pending that could come back."""
        if not self._catalog.strategy_of(info).reserves:
            return (await self._stocks.stock(info.sku) or 0) <= 0
        return await self._reservations.exhausted(info.sku)

    async def _queued(self, purchase: Purchase, kind: ReplyKind, *, replayable: bool) -> Result:
        """The answer of the queue strategy once enqueue.lua ran: 202 as soon
        as the purchase is in the stream (now, or by an earlier request with
        this id), 503 when the stream was full; 422 at once when the client's
        request id already made another purchase's order (of another sku,
        which Redis's per-sku records cannot tell), as the other strategies
        answer it."""
        if kind is BUSY:
            self._observer.shed_one()
            raise Unavailable("queue full")
        # Already durable: a failure here is a 503 whose retry answers 202.
        # Also on a retry, in case the first request died before this.
        await self._streams.remember(purchase.request_id, purchase.sku, purchase.user_id)
        if replayable:
            await self._refuse_reused(purchase)
        return Result(Outcome.ACCEPTED, request_id=purchase.request_id)

    async def _refuse_reused(self, purchase: Purchase) -> None:
        """Raise IdempotencyMismatch when the request id already has an order
        for another purchase. The entry queued for it is refused by its flush
        (the order rows are the arbiter), which gives its units back; this
        only tells the client now instead of at its lookup. Without PostgreSQL
        the 202 stands and the lookup says it later, as before."""
        try:
            order = await self._orders.order(purchase.request_id)
        except Unavailable:
            return
        if order is not None:
            replayed(order, purchase)

    def _admit(self) -> None:
        """Refuse a purchase before reserving when draining or the backlog is full."""
        if self._batcher.closing:
            raise ShuttingDown()
        if self._batcher.full:
            self._observer.shed_one()
            raise Unavailable("gateway busy")

    async def _reload_once(self, sku: str) -> None:
        """Reload a sku's missing Redis state, once for all the requests that find it
        missing: a storm of them must cost one load, not one per request."""
        future = self._reloads.get(sku)
        if future is None:
            future = self._reloads[sku] = asyncio.ensure_future(self._reload(sku))
            future.add_done_callback(lambda _: self._reloads.pop(sku, None))
        await asyncio.shield(future)

    async def _replay(self, purchase: Purchase, confirmed: ConfirmedIds | UnknownIds) -> Result:
        """A sold-out sku's answer to a request id ``confirmed`` may hold: Redis's
        done hash, else the order rows (Redis lost or dropped the sale's state,
        or is rebuilding it, or the filter erred, about once in a thousand);
        straight to the order rows while the filter is not built (the hashes
        are being rebuilt), coalesced with the other requests'. After Redis
        failed lately, a flush of a reservation whose ledger entry Redis lost
        may still be on its way: the sold out is arbitrated with it instead."""
        rid = purchase.request_id
        order = None
        if confirmed is not UNBUILT:
            order = await self._reservations.confirmed_order(purchase.sku, rid)
        if order is None and self._doubt:
            order = await self._arbitrations.order(purchase.sku, rid)
        elif order is None:
            order = await self._orders.order(rid)
        if order is None:
            return SOLD_OUT
        return replayed(order, purchase)

    async def _verify(self, purchase: Purchase) -> Result | None:
        """While the sku is rebuilt: a replay's order, a repeat buyer's "duplicate"
        (from PostgreSQL, coalesced with the other new purchases'), else None."""
        made, bought = await self._priors.prior(purchase.sku, purchase.request_id, purchase.user_id)
        if made is not None:
            return replayed(made, purchase)
        return DUPLICATE if bought else None

    async def _reload(self, sku: str) -> None:
        # The counter comes back flagged as rebuilding (the hashes may be gone too).
        stock = await self._stocks.stock(sku)
        if stock is None:
            raise Unavailable("sku vanished")
        await self._reservations.load_stock(sku, stock, StockLoad.RELOAD)
        self._rebuilds.ensure(sku)
        self._observer.stock_reloaded()
        log.warning("stock_reloaded", sku=sku, stock=stock)
