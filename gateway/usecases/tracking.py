"""Where a purchase stands, by its request id and buyer:
``GET /v1/orders/{request_id}?user_id=U``.

Only the buyer is told: to anyone else the request id reads as unknown, and
is answered as soon as an unknown one, after the same reads (no wait).

An order row answers for every strategy. A purchase of the queue strategy is
also known before it has one: from the 202 on, Redis names the sku it was
queued for (``Streams.remember``), and once the database refused it, the
sku's rejections hold the verdict. With a wait the answer is polled until it
is final, with a backoff, for a bounded time.
"""

from __future__ import annotations

import asyncio
import itertools

from redis.backoff import ExponentialBackoff

from gateway.domain.errors import GroupLimitReached, IdempotencyMismatch, Unavailable
from gateway.domain.model import DUPLICATE, SOLD_OUT, Outcome, Result, Verdict
from gateway.usecases.ports import BuyersOrder, QueuedStatus

# The longest a client may ask to wait for a final answer.
MAX_WAIT_S = 30.0
# Pause between two looks while waiting: 20 ms, doubling to 0.5 s.
POLL_BACKOFF = ExponentialBackoff(cap=0.5, base=0.02)


class OrderTracker:
    """Answers what became of a request id."""

    def __init__(self, *, orders: BuyersOrder, streams: QueuedStatus) -> None:
        self._orders = orders
        self._streams = streams

    async def status(self, request_id: str, user_id: str, wait_s: float = 0.0) -> Result | None:
        """The outcome of ``user_id``'s purchase under the request id: CONFIRMED
        with its order, ACCEPTED while queued, SOLD_OUT or DUPLICATE once
        refused; None when unknown or another buyer's.

        With ``wait_s`` (at most :data:`MAX_WAIT_S`) an ACCEPTED answer is
        looked at again until it is final or the time is up. Raises
        :class:`IdempotencyMismatch` when the request id's queued purchase was
        refused because the id holds another purchase's order, and
        :class:`Unavailable` when it expired (its buyer may send it again).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait_s, MAX_WAIT_S)
        for looks in itertools.count():
            result = await self._look(request_id, user_id)
            remaining = deadline - loop.time()
            if result is None or result.outcome is not Outcome.ACCEPTED or remaining <= 0:
                break
            await asyncio.sleep(min(POLL_BACKOFF.compute(looks), remaining))
        return result

    async def _look(self, request_id: str, user_id: str) -> Result | None:
        # Both reads filter by the buyer, so another buyer's request id costs
        # the same reads as an unknown one.
        order = await self._orders.buyers_order(request_id, user_id)
        if order is not None:
            return Result(Outcome.CONFIRMED, order)
        sku, verdict = await self._streams.status(request_id, user_id)
        if sku is None:
            return None
        if verdict is None:
            # Queued, or committed since the order was looked up: the next look says.
            return Result(Outcome.ACCEPTED, request_id=request_id)
        if verdict is Verdict.SOLD_OUT:
            return SOLD_OUT
        if verdict is Verdict.DUPLICATE:
            return DUPLICATE
        if verdict is Verdict.RELEASED:
            raise IdempotencyMismatch(request_id)
        if verdict is Verdict.GROUP_LIMIT:
            raise GroupLimitReached(self._streams.group_of(sku) or "")
        raise Unavailable("reservation expired; send the purchase again")
