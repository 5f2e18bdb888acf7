"""Purchases decided against fakes of their collaborators, no servers.

Each fake plays one Protocol of ``gateway.usecases.purchases``: Redis's answers
are scripted reply by reply, PostgreSQL's look-ups are dictionaries, and what
the batcher, the marking, the rebuilds and the streams were asked is recorded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gateway.domain.errors import IdempotencyMismatch, RedisUnavailable, ShuttingDown, Unavailable
from gateway.domain.model import (
    DUPLICATE,
    SOLD_OUT,
    Order,
    OrderStatus,
    Outcome,
    Purchase,
    Result,
    SkuInfo,
    Strategy,
)
from gateway.domain.stock import Prior, Reply, ReplyKind, StockLoad
from gateway.usecases.deductions import Deductions
from gateway.usecases.doubt import RedisDoubt
from gateway.usecases.lifecycle import HeldUnits, PaymentWindow
from gateway.usecases.ports import Client, Lookups
from gateway.usecases.purchases import Purchases
from gateway.usecases.sold_out import ConfirmedIds, SoldOut

SKU = "sku-1"
RID = "rid-1"
ORDER = Order("o-1", RID, SKU, "alice", 1)
CONFIRMED = Result(Outcome.CONFIRMED, ORDER)


class Catalog:
    """Every sku exists with a per-user limit of 2, on ``strategy``, with a
    payment window of ``window_s`` (0: none)."""

    def __init__(self, strategy: Strategy = Strategy.RESERVE_BATCH, window_s: int = 0) -> None:
        self.strategy_default = strategy
        self.window_s = window_s

    async def get(self, sku: str) -> SkuInfo:
        return SkuInfo(sku, per_user_limit=2, payment_window_s=self.window_s)

    def strategy_of(self, info: SkuInfo) -> Strategy:
        return info.strategy or self.strategy_default

    async def strategy(self, sku: str) -> Strategy:
        return self.strategy_of(await self.get(sku))


class Redis:
    """reserve.lua and enqueue.lua answering the scripted replies in turn, and
    the done hash's confirmed orders; records each call."""

    def __init__(self, *replies: Reply | Exception) -> None:
        self.replies: deque[Reply | Exception] = deque(replies)
        self.calls: list[tuple[str, Purchase, bool]] = []
        self.done: dict[str, Order] = {}
        self.loaded: list[tuple[str, int]] = []

    async def _answer(self, script: str, purchase: Purchase, verified: bool) -> Reply:
        self.calls.append((script, purchase, verified))
        reply = self.replies.popleft()
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def reserve(
        self, purchase: Purchase, info: SkuInfo, client: Client = None, *, verified: bool = False
    ) -> Reply:
        return await self._answer("reserve", purchase, verified)

    async def enqueue(
        self, purchase: Purchase, info: SkuInfo, client: Client = None, *, verified: bool = False
    ) -> Reply:
        return await self._answer("enqueue", purchase, verified)

    async def available(self, sku: str) -> int | None:
        return None

    async def exhausted(self, sku: str) -> bool:
        return False

    async def confirmed_order(self, sku: str, request_id: str) -> Order | None:
        return self.done.get(request_id)

    async def load_stock(self, sku: str, db_stock: int, mode: StockLoad) -> int:
        await asyncio.sleep(0)  # the requests that find it missing meanwhile wait for this one
        self.loaded.append((sku, db_stock))
        return db_stock


class Postgres:
    """The database's stock and orders, as the stock read and the three look-ups see them."""

    def __init__(self) -> None:
        self.orders: dict[str, Order] = {}
        self.buyers: set[str] = set()
        self.asked: list[str] = []
        # Units held for payment (of a sku with a payment window).
        self.held = 0

    async def stock(self, sku: str) -> int | None:
        self.asked.append("stock")
        return 10

    async def order(self, request_id: str) -> Order | None:
        self.asked.append("order")
        return self.orders.get(request_id)

    async def prior(self, sku: str, request_id: str, user_id: str) -> Prior:
        self.asked.append("prior")
        return self.orders.get(request_id), user_id in self.buyers

    async def held_of(self, sku: str) -> tuple[int, float]:
        self.asked.append("held")
        return self.held, 30.0


class Arbitrations:
    """The sold outs made final in PostgreSQL: the order if the request id made one."""

    def __init__(self, postgres: Postgres) -> None:
        self.postgres = postgres

    async def order(self, sku: str, request_id: str) -> Order | None:
        self.postgres.asked.append("arbitrate")
        return self.postgres.orders.get(request_id)


class Batcher:
    """Takes every reserved purchase and confirms it, unless closing."""

    def __init__(self) -> None:
        self.closing = False
        self.full = False
        self.submitted: list[Purchase] = []

    async def submit(self, purchase: Purchase) -> Result:
        self.submitted.append(purchase)
        if self.closing:
            raise ShuttingDown()
        order = Order("o-new", purchase.request_id, purchase.sku, purchase.user_id, purchase.qty)
        return Result(Outcome.CONFIRMED, order)


class Recorder:
    """The flusher, the marking, the rebuilds, the streams and the observer at once."""

    def __init__(self) -> None:
        self.given_back: list[Purchase] = []
        self.marked: list[tuple[str, bool]] = []
        self.rebuilt: list[str] = []
        self.remembered: list[tuple[str, str, str]] = []
        self.shed = 0
        self.reloaded = 0

    async def give_back(self, sku: str, batch: Sequence[Purchase]) -> None:
        self.given_back += batch

    def start(self, sku: str, generation: tuple[int, int], *, rebuilding: bool = False) -> None:
        self.marked.append((sku, rebuilding))

    def ensure(self, sku: str) -> None:
        self.rebuilt.append(sku)

    async def remember(self, request_id: str, sku: str, user_id: str) -> None:
        self.remembered.append((request_id, sku, user_id))

    def shed_one(self) -> None:
        self.shed += 1

    def stock_reloaded(self) -> None:
        self.reloaded += 1

    def purchase_confirmed(self, sku: str) -> None:
        """The per-sku 201s are the metrics' (tests/integration/test_active_skus.py)."""


class Strategies:
    """The strategies without Redis state: the sale gate lets all through, and
    each purchase is confirmed."""

    def __init__(self) -> None:
        self.decided: list[Purchase] = []

    async def enforce(self, purchase: Purchase, info: SkuInfo, client: Client) -> None:
        pass

    async def purchase(self, purchase: Purchase) -> Result:
        self.decided.append(purchase)
        return CONFIRMED


class World:
    """One :class:`Purchases` and the fakes it was handed."""

    def __init__(
        self,
        *replies: Reply | Exception,
        strategy: Strategy = Strategy.RESERVE_BATCH,
        window_s: int = 0,
    ):
        self.redis = Redis(*replies)
        self.postgres = Postgres()
        self.batcher = Batcher()
        self.recorder = Recorder()
        self.strategies = Strategies()
        self.soldout = SoldOut()
        self.doubt = RedisDoubt(10.0)
        deductions = Deductions(
            {Strategy.SQL_DIRECT: self.strategies},
            gate=self.strategies,
            draining=self.batcher,
            limit=10,
            observer=self.recorder,
        )
        self.purchases = Purchases(
            catalog=Catalog(strategy, window_s),
            soldout=self.soldout,
            marking=self.recorder,
            reservations=self.redis,
            stocks=self.postgres,
            lookups=Lookups(self.postgres, self.postgres, Arbitrations(self.postgres)),
            batcher=self.batcher,
            flusher=self.recorder,
            rebuilds=self.recorder,
            streams=self.recorder,
            deductions=deductions,
            doubt=self.doubt,
            window=PaymentWindow(HeldUnits(self.postgres), self.postgres),
            observer=self.recorder,
        )

    def mark_sold_out(self, *confirmed: str) -> None:
        """The sku marked sold out here, its filter holding ``confirmed``."""
        self.soldout.mark(SKU, self.soldout.generation(SKU), ConfirmedIds(1, confirmed))

    async def buy(self, request_id: str = RID, qty: int = 1) -> Result:
        return await self.purchases.purchase(Purchase(SKU, "alice", qty, request_id))


class TestInStock:
    """The in-stock path make ab measures: reserve.lua, then the batch."""

    async def test_a_reserved_purchase_goes_to_the_batch_stamped_by_redis(self) -> None:
        """In stock: one reserve.lua call, then the batch, whose answer is the
        client's (201); the purchase carries Redis's stamp, and PostgreSQL is not asked."""
        world = World(Reply(ReplyKind.OK, reserved_at_ms=123))
        result = await world.buy()
        assert result.outcome is Outcome.CONFIRMED
        [(script, _, verified)] = world.redis.calls
        assert (script, verified) == ("reserve", False)
        [batched] = world.batcher.submitted
        assert (batched.request_id, batched.reserved_at_ms) == (RID, 123)
        assert world.postgres.asked == []

    async def test_a_purchase_without_a_request_id_is_given_one(self) -> None:
        """A purchase the client sent no request id for is reserved under a new one."""
        world = World(Reply(ReplyKind.OK, reserved_at_ms=1))
        result = await world.buy(request_id="")
        assert result.order is not None and result.order.request_id
        assert world.batcher.submitted[0].request_id == result.order.request_id

    async def test_a_reservation_made_while_draining_goes_back(self) -> None:
        """Draining began while Redis reserved: the reservation is given back and
        the client told 503 (ShuttingDown)."""
        world = World(Reply(ReplyKind.OK, reserved_at_ms=1))
        world.batcher.closing = True
        with pytest.raises(ShuttingDown):
            await world.buy()
        assert world.recorder.given_back == world.batcher.submitted

    async def test_a_full_backlog_sheds_before_reserving(self) -> None:
        """A full backlog answers 503 without asking Redis, and the shed is counted."""
        world = World()
        world.batcher.full = True
        with pytest.raises(Unavailable):
            await world.buy()
        assert (world.redis.calls, world.recorder.shed) == ([], 1)


class TestSoldOut:
    """Sold out, from the in-process mark or from reserve.lua."""

    async def test_a_marked_sku_is_sold_out_without_io(self) -> None:
        """A sku marked sold out here answers sold out with no Redis or PostgreSQL
        call, with or without a request id outside its filter."""
        world = World()
        world.mark_sold_out("someone-else")
        assert await world.buy(request_id="") is SOLD_OUT
        assert await world.buy(request_id="never-seen") is SOLD_OUT
        assert (world.redis.calls, world.postgres.asked) == ([], [])

    async def test_redis_exhausted_starts_the_mark(self) -> None:
        """reserve.lua's exhausted sold out is the client's answer, and starts the
        sku's in-process mark."""
        world = World(Reply(ReplyKind.SOLD_OUT, exhausted=True))
        assert await world.buy() is SOLD_OUT
        assert world.recorder.marked == [(SKU, False)]

    async def test_sold_out_with_stock_pending_is_not_marked(self) -> None:
        """A sold out with reservations pending (they may come back) marks nothing."""
        world = World(Reply(ReplyKind.SOLD_OUT))
        assert await world.buy() is SOLD_OUT
        assert world.recorder.marked == []


class TestPaymentWindow:
    """A sku with a payment window: its answers, decided in one place."""

    async def test_a_sold_out_carries_the_units_held(self) -> None:
        """Sold out while units are held for payment: how many, and a
        Retry-After to the earliest deadline."""
        world = World(window_s=60)
        world.mark_sold_out()
        world.postgres.held = 3
        result = await world.buy(request_id="")
        assert (result.outcome, result.held, result.retry_after_s) == (Outcome.SOLD_OUT, 3, 30)

    async def test_a_replay_from_redis_is_answered_from_its_order_row(self) -> None:
        """Redis's done record has no pay_by: a replay is answered from its order
        row, as its 201 was."""
        pending = replace(ORDER, status=OrderStatus.PENDING_PAYMENT, pay_by="2030-01-01T00:01:00Z")
        world = World(Reply(ReplyKind.CONFIRMED, order=ORDER), window_s=60)
        world.postgres.orders[RID] = pending
        result = await world.buy()
        assert result.order is not None
        assert (result.order.status, result.order.pay_by) == (pending.status, pending.pay_by)

    async def test_a_flushed_purchase_and_a_sku_without_a_window_ask_nothing_more(self) -> None:
        """The batch's 201 carries its pay_by already, and a sku without a window
        is never asked about units held: no query either way."""
        world = World(Reply(ReplyKind.OK, reserved_at_ms=1), window_s=60)
        assert (await world.buy()).outcome is Outcome.CONFIRMED
        plain = World()
        plain.mark_sold_out()
        plain.postgres.held = 3
        assert await plain.buy(request_id="") is SOLD_OUT
        assert world.postgres.asked == plain.postgres.asked == []


class TestReplay:
    """A request id that already made an order gets that order again."""

    async def test_a_replay_of_a_marked_sku_gets_its_order(self) -> None:
        """A request id in a marked sku's filter is answered its order from Redis's
        done hash: the 201 again, not sold out."""
        world = World()
        world.mark_sold_out(RID)
        world.redis.done[RID] = ORDER
        assert await world.buy() == CONFIRMED
        assert world.redis.calls == []

    async def test_a_replay_naming_another_purchase_is_refused(self) -> None:
        """A replay whose request id made an order of another qty is a 422
        (IdempotencyMismatch), never that order."""
        world = World()
        world.mark_sold_out(RID)
        world.redis.done[RID] = ORDER
        with pytest.raises(IdempotencyMismatch):
            await world.buy(qty=2)

    async def test_redis_answers_a_replay_it_confirmed(self) -> None:
        """reserve.lua's "confirmed" is the replay's order, and nothing is batched."""
        world = World(Reply(ReplyKind.CONFIRMED, order=ORDER))
        assert await world.buy() == CONFIRMED
        assert world.batcher.submitted == []


class TestRebuild:
    """A sku whose Redis state was lost: reloaded, rebuilt, PostgreSQL asked meanwhile."""

    async def test_a_missing_counter_is_reloaded_once_for_all(self) -> None:
        """Two purchases that find the counter missing cost one reload from
        PostgreSQL, which starts the rebuild and is counted; then both reserve."""
        world = World(
            Reply(ReplyKind.MISSING),
            Reply(ReplyKind.MISSING),
            Reply(ReplyKind.OK, reserved_at_ms=1),
            Reply(ReplyKind.OK, reserved_at_ms=2),
        )
        results = await asyncio.gather(world.buy("r1"), world.buy("r2"))
        assert [r.outcome for r in results] == [Outcome.CONFIRMED] * 2
        assert world.redis.loaded == [(SKU, 10)]
        assert (world.recorder.rebuilt, world.recorder.reloaded) == ([SKU], 1)

    async def test_a_replay_while_rebuilt_is_answered_by_postgres(self) -> None:
        """reserve.lua says "unverified" (the hashes are rebuilt, their lease
        orphaned): the rebuild is taken over, and PostgreSQL's order answers the
        replay with no second reserve.lua call."""
        world = World(Reply(ReplyKind.UNVERIFIED, orphaned=True))
        world.postgres.orders[RID] = ORDER
        assert await world.buy() == CONFIRMED
        assert world.recorder.rebuilt == [SKU]
        assert len(world.redis.calls) == 1

    async def test_a_repeat_buyer_while_rebuilt_is_a_duplicate(self) -> None:
        """While rebuilt, a buyer PostgreSQL knows bought the sku gets "duplicate"."""
        world = World(Reply(ReplyKind.UNVERIFIED))
        world.postgres.buyers.add("alice")
        assert await world.buy() is DUPLICATE

    async def test_a_new_buyer_while_rebuilt_reserves_verified(self) -> None:
        """A new purchase while rebuilt is checked in PostgreSQL, then reserved
        verified; the next one within the recheck goes to PostgreSQL first, with
        one reserve.lua call."""
        world = World(
            Reply(ReplyKind.UNVERIFIED),
            Reply(ReplyKind.OK, reserved_at_ms=1),
            Reply(ReplyKind.OK, reserved_at_ms=2),
        )
        await world.buy("r1")
        await world.buy("r2")
        assert [(c[1].request_id, c[2]) for c in world.redis.calls] == [
            ("r1", False),
            ("r1", True),
            ("r2", True),
        ]
        assert world.postgres.asked == ["prior", "prior"]

    async def test_settled_while_rebuilt_marks_at_once_and_looks_up(self) -> None:
        """Sold out for good while rebuilt: the sku is marked at once without its
        filter, and the request id looked up in PostgreSQL's orders."""
        world = World(Reply(ReplyKind.UNVERIFIED, exhausted=True))
        assert await world.buy() is SOLD_OUT
        assert world.recorder.marked == [(SKU, True)]
        assert world.postgres.asked == ["order"]


class TestDoubt:
    """After this gateway saw Redis fail, its sold outs are checked in PostgreSQL."""

    async def test_a_redis_failure_raises_and_starts_the_doubt(self) -> None:
        """A failed reserve.lua call is a 503, and this gateway doubts Redis from then on."""
        world = World(RedisUnavailable("down"))
        with pytest.raises(RedisUnavailable):
            await world.buy()
        assert world.doubt

    async def test_a_doubted_sold_out_is_arbitrated_in_postgres(self) -> None:
        """After Redis failed, a sold out to a request id the client sent is
        arbitrated in PostgreSQL, whose order wins over Redis's sold out."""
        world = World(Reply(ReplyKind.SOLD_OUT))
        world.doubt.failed()
        world.postgres.orders[RID] = ORDER
        assert await world.buy() == CONFIRMED
        assert world.postgres.asked == ["arbitrate"]

    async def test_a_doubted_sold_out_without_a_request_id_is_final(self) -> None:
        """A purchase without a client's request id cannot be a replay: sold out,
        doubt or not, with no arbitration."""
        world = World(Reply(ReplyKind.SOLD_OUT))
        world.doubt.failed()
        assert await world.buy(request_id="") is SOLD_OUT
        assert world.postgres.asked == []

    async def test_a_doubted_mark_arbitrates_ids_outside_its_filter(self) -> None:
        """After Redis failed, a marked sku's filter may lack a lost order: a
        request id outside it is arbitrated instead of answered sold out."""
        world = World()
        world.mark_sold_out("someone-else")
        world.doubt.failed()
        world.postgres.orders[RID] = ORDER
        assert await world.buy() == CONFIRMED
        assert world.postgres.asked == ["arbitrate"]


class TestQueue:
    """The queue strategy: 202 once the purchase is in the sku's stream."""

    async def test_a_queued_purchase_is_accepted_and_remembered(self) -> None:
        """On the queue strategy a purchase goes to enqueue.lua, not to the
        batch: 202 with its request id, remembered with its buyer for its status."""
        world = World(Reply(ReplyKind.OK, reserved_at_ms=1), strategy=Strategy.QUEUE)
        result = await world.buy()
        assert result == Result(Outcome.ACCEPTED, request_id=RID)
        assert world.redis.calls[0][0] == "enqueue"
        assert world.recorder.remembered == [(RID, SKU, "alice")]
        assert world.batcher.submitted == []

    async def test_a_full_stream_is_a_counted_503(self) -> None:
        """A full stream answers 503, counted as shed, and remembers nothing."""
        world = World(Reply(ReplyKind.BUSY), strategy=Strategy.QUEUE)
        with pytest.raises(Unavailable):
            await world.buy()
        assert (world.recorder.shed, world.recorder.remembered) == (1, [])


class TestWithoutRedis:
    """The strategies that decide in PostgreSQL alone."""

    async def test_a_strategy_without_redis_state_is_handed_its_deduction(self) -> None:
        """A sku on a strategy that does not reserve in Redis goes to that
        strategy (through the sale gate), never to reserve.lua or the batch."""
        world = World(strategy=Strategy.SQL_DIRECT)
        assert await world.buy() == CONFIRMED
        assert [p.request_id for p in world.strategies.decided] == [RID]
        assert (world.redis.calls, world.batcher.submitted) == ([], [])

    async def test_a_strategy_not_served_here_is_a_503(self) -> None:
        """A strategy this gateway has no deduction for answers 503."""
        world = World(strategy=Strategy.PESSIMISTIC)
        with pytest.raises(Unavailable):
            await world.buy()

    def test_the_strategies_that_reserve_in_redis(self) -> None:
        """reserve-batch and queue reserve in Redis first; the others do not."""
        assert {s for s in Strategy if s.reserves} == {Strategy.RESERVE_BATCH, Strategy.QUEUE}
