"""The sale window and rate limits of the strategies that decide in PostgreSQL alone.

``reserve-batch`` and ``queue`` decide a sku's window and its buckets inside
their one reservation call (``lua/reserve.lua``, by Redis's clock), at no extra
round trip. ``sql-direct``, ``optimistic`` and ``pessimistic`` keep no Redis
state and sell on with Redis down, so their window and buckets are decided by
PostgreSQL, by its clock, in ``sale_gate()`` (``sql/functions/sale_gate.sql``):
the same rules in the same order, with the same answers. A sku with no window
and no rate that applies pays nothing: the gate is not called.

Why PostgreSQL and not Redis for their limits: a Redis limiter would make these
strategies depend on Redis again (fail closed: a rate-limited sku stops selling
when Redis does) or let the limits lapse exactly when Redis is down (fail
open). In PostgreSQL, the store that decides the stock, there is no third state:
with PostgreSQL down the purchase is a 503 anyway, and with Redis down the
limits hold.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.domain.errors import Ended, NotStarted, RateLimited
from gateway.domain.model import Purchase, SkuInfo
from gateway.domain.rules import Bucket, GateDecision, Rate, effective
from gateway.settings import Settings
from gateway.usecases.ports import SaleGateCall

PASS = GateDecision.PASS
NOT_STARTED = GateDecision.NOT_STARTED
ENDED = GateDecision.ENDED


class SaleGate:
    """Window and rates for a strategy without Redis state, decided in PostgreSQL."""

    def __init__(self, gate: SaleGateCall, settings: Settings) -> None:
        self._gate = gate
        self._user_rate, self._client_rate = settings.user_rate, settings.client_rate

    async def enforce(
        self, purchase: Purchase, info: SkuInfo, client: Callable[[], str | None] | None
    ) -> None:
        """Let ``purchase`` (with its request id) through, or raise
        :class:`NotStarted`, :class:`Ended` or :class:`RateLimited`; a replay of
        a request id that has an order always goes through."""
        rules = info.rules
        user_rate = effective(rules.user_rate, self._user_rate)
        client_rate = effective(rules.client_rate, self._client_rate)
        if rules.starts_at is None and rules.ends_at is None and not (user_rate or client_rate):
            return
        user = None if user_rate is None else _bucket(f"u:{purchase.user_id}", user_rate)
        address = None if client_rate is None or client is None else client()
        by_client = (
            None if address is None or client_rate is None else _bucket(f"c:{address}", client_rate)
        )
        answer = await self._gate.check(purchase, user, by_client)
        verdict = answer.verdict
        if verdict is PASS:
            return
        if verdict is NOT_STARTED:
            raise NotStarted(info.rules.window_json()["starts_at"] or "", answer.wait_ms)
        if verdict is ENDED:
            raise Ended()
        raise RateLimited(answer.wait_ms)


def _bucket(name: str, rate: Rate) -> Bucket:
    return Bucket(name, rate.per_s, rate.burst)
