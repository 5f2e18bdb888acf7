"""The waiting rooms' Redis adapter: the only caller of the ``lua/room_*`` scripts.

A sku's room lives in the sku's slot (``gateway.redis.layout.RoomKeys``), beside its
stock, so joining and polling read "exhausted" in the same script. Who
is let in, and when, is decided in Redis by Redis's clock, so every instance
shares one pace. Driver errors become :class:`gateway.domain.errors.RedisUnavailable`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

from gateway.domain.model import WaitingRoom
from gateway.domain.rooms import STANDING_STATUSES, Exhausted, Standing, StandingStatus
from gateway.redis.connections import RedisClient, redis_call
from gateway.redis.layout import KeyTags, RoomKeys, SkuKeys
from gateway.redis.scripts import Script, read_script
from gateway.settings import Settings

# How long a bot token that made a ticket is remembered: a Turnstile token is
# valid 300 s, so one kept as long cannot make a second ticket.
BOT_TOKEN_KEPT_MS = 300_000


UNKNOWN = StandingStatus.UNKNOWN
SOLD_OUT = StandingStatus.SOLD_OUT
WAITING = StandingStatus.WAITING
ADMITTED = StandingStatus.ADMITTED
# The standings that carry nothing but their status, made once.
_BARE = {status: Standing(status) for status in StandingStatus}
# room_join.lua's refusals by its raw answer; anything else is "joined".
_JOIN_REFUSALS = {
    status.value: _BARE[status]
    for status in (StandingStatus.SOLD_OUT, StandingStatus.BOT_CHECK, StandingStatus.REUSED)
}


class Rooms:
    """Joins, polls and token spending of every sku's waiting room."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        on_noscript: Callable[[str], None] | None = None,
        tags: KeyTags | None = None,
    ) -> None:
        self._redis = redis
        # Each sku's limit group, which tags its keys (gateway.redis.layout).
        self._tags = KeyTags() if tags is None else tags
        self._prefix = settings.key_prefix
        self._retention_ms = max(1, round(settings.sale_retention_s * 1000))
        self._join = read_script("room_join")
        self._poll = read_script("room_poll")
        self._unspend = read_script("room_unspend")
        self._leave = read_script("room_leave")
        for script in self.scripts:
            script.on_reload = on_noscript

    @property
    def scripts(self) -> tuple[Script, ...]:
        """The scripts this adapter calls."""
        return (self._join, self._poll, self._unspend, self._leave)

    def _room(self, sku: str) -> RoomKeys:
        """The sku's room keys, in its limit group's slot when it has one."""
        return RoomKeys.of(self._prefix, sku, self._tags.group_of(sku))

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script; a syntax error raises here, at start-up."""
        for script in self.scripts:
            await script.load(self._redis)

    async def join(
        self,
        sku: str,
        user_id: str,
        fresh_ticket: str,
        starts_ms: int,
        token_ttl_ms: int,
        *,
        exhausted: Exhausted = Exhausted.SOLD_OUT,
        bot_check: bool = False,
        bot_passed: str | None = None,
    ) -> Standing:
        """Put ``user_id`` in ``sku``'s room with ``fresh_ticket``, or find the ticket
        they already hold (unless its admission is older than ``token_ttl_ms``:
        then the fresh ticket, at the back); ``SOLD_OUT`` when the sku is exhausted,
        unless ``exhausted`` is ``Exhausted.HELD`` (units are held for payment, so
        the sku is not sold out yet). ``starts_ms`` is the sale's start (0: none),
        to tell early arrivals apart. With ``bot_check`` a new ticket needs
        ``bot_passed``, the SHA-256 (hex) of a bot token that passed its check,
        claimed with the ticket (``BOT_CHECK`` without it, ``REUSED`` when it made
        one before)."""
        group = self._tags.group_of(sku)
        q, s = RoomKeys.of(self._prefix, sku, group), SkuKeys.of(self._prefix, sku, group)
        bot_key = q.bot(bot_passed or "-")
        keys = (q.wait, q.users, q.tickets, q.seq, s.stock, s.pending, q.early, bot_key)
        args = (user_id, fresh_ticket, self._retention_ms, starts_ms, token_ttl_ms, exhausted.value)
        checks = (int(bot_check), int(bot_passed is not None), BOT_TOKEN_KEPT_MS)
        raw = await redis_call(self._join(self._redis, keys, args + checks))
        refused = _JOIN_REFUSALS.get(raw[0])
        if refused is not None:
            return refused
        return Standing(WAITING, raw[1], user_id, int(raw[2]), waiting=int(raw[3]))

    async def poll(
        self,
        sku: str,
        ticket: str,
        room: WaitingRoom,
        starts_ms: int,
        *,
        exhausted: Exhausted = Exhausted.SOLD_OUT,
    ) -> Standing:
        """Let the next people in if the sale has started and ``room``'s pace allows
        (the early arrivals shuffled first, once, if it shuffles them), then where
        ``ticket`` stands. An exhausted sku is ``SOLD_OUT``; with ``Exhausted.HELD``
        (units are held for payment) the line is kept, and let in only while
        there is stock."""
        q, s = (
            self._room(sku),
            SkuKeys.of(self._prefix, sku, self._tags.group_of(sku)),
        )
        keys = (q.wait, q.tickets, q.recent, s.stock, s.pending, q.early, q.shuffled)
        salt = secrets.token_hex(8)
        pace = (room.admit_per_s, self._retention_ms, starts_ms, int(room.shuffle_at_start))
        args = (ticket, *pace, salt, exhausted.value)
        raw = await redis_call(self._poll(self._redis, keys, args))
        status = STANDING_STATUSES[raw[0]]
        if status is UNKNOWN or status is SOLD_OUT:
            return _BARE[status]
        admitted_now, waiting = int(raw[3]), int(raw[4])
        if status is ADMITTED:
            return Standing(ADMITTED, ticket, raw[1], 0, int(raw[2]), admitted_now, waiting)
        return Standing(WAITING, ticket, raw[1], int(raw[2]), 0, admitted_now, waiting)

    async def spend(self, sku: str, ticket: str, request_id: str, ttl_ms: int) -> str | None:
        """Spend ``ticket``'s token on ``request_id`` (SET NX), kept ``ttl_ms`` plus
        the sale's retention; the request id that had already spent it, else None."""
        key = self._room(sku).used(ticket)
        px = max(1, ttl_ms) + self._retention_ms
        # SET NX GET: one round trip both claims the token and names its spender.
        spender = await redis_call(self._redis.set(key, request_id, nx=True, get=True, px=px))
        return None if spender is None else str(spender)

    async def spent_by(self, sku: str, ticket: str) -> str | None:
        """The request id that spent ``ticket``'s token, if any."""
        spender = await redis_call(self._redis.get(self._room(sku).used(ticket)))
        return None if spender is None else str(spender)

    async def unspend(self, sku: str, ticket: str, request_id: str) -> bool:
        """Unspend ``ticket``'s token if ``request_id`` spent it; whether it did."""
        key = self._room(sku).used(ticket)
        return bool(await redis_call(self._unspend(self._redis, (key,), (request_id,))))

    async def end_turns(self, sku: str, spent: Sequence[tuple[str, str]]) -> int:
        """End the turns spent on closed orders, ``(user_id, request_id)`` each,
        so their buyers join again at the back (room_leave.lua); how many ended."""
        q = self._room(sku)
        tickets = await redis_call(self._redis.hmget(q.users, [user for user, _ in spent]))
        ended = 0
        for (user, request_id), ticket in zip(spent, tickets, strict=True):
            if ticket is not None:
                keys, args = (q.users, q.used(ticket)), (user, ticket, request_id)
                ended += int(await redis_call(self._leave(self._redis, keys, args)))
        return ended
