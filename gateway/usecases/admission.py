"""Waiting rooms: joining, polling, and buying with an admission token.

A sku with a waiting room is bought in three steps: ``POST /v1/queue/{sku}``
gives a ticket, ``GET /v1/queue/{sku}/{ticket}`` says where it stands and,
once Redis let it through (``lua/room_poll.lua``: at most ``admit_per_s`` a
second across every instance, by Redis's clock), hands out a signed admission
token (``gateway.usecases.admission_tokens``); ``POST /v1/purchase`` with ``Admission-Token``
spends it and buys. A sku without a room is bought as before, at the cost of one
cached lookup.

A token buys once: it is spent in Redis (SET NX of the request id) before the
reservation, because ``lua/reserve.lua`` is not this module's to change. A
purchase that then fails in a way the buyer may retry (503, 400, 422) unspends
the token (compare-and-delete on the request id); a replay of the same request
id finds its own id on the token and gets the first outcome, even after expiry.

A room with ``bot_check`` lets a join make a new ticket only with a bot token
its provider vouches for (:class:`gateway.usecases.ports.BotCheck`: one
siteverify round trip), claimed in Redis with the ticket by the same join
script (one token, one ticket, whichever instance). A buyer who already holds a
checked ticket joins again without one. The verdict is in the ticket
(``admission_tokens.CHECKED``), which the admission token signs: a purchase
reads it without I/O.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NoReturn, Protocol

from gateway.domain.errors import (
    AdmissionInvalid,
    AdmissionRequired,
    BotCheckFailed,
    BotCheckUnavailable,
    GatewayError,
    NoWaitingRoom,
    Unavailable,
    UnknownTicket,
)
from gateway.domain.model import Purchase, Result, SkuInfo, WaitingRoom
from gateway.domain.rooms import Exhausted, Standing, StandingStatus
from gateway.usecases.admission_tokens import Refusal, fresh_ticket
from gateway.usecases.ports import (
    NO_ADMISSION_SECRET,
    AdmissionObserver,
    BotCheck,
    Client,
    Signing,
)
from gateway.usecases.servable import NO_BOT_CHECK
from gateway.usecases.sold_out import ConfirmedIds, UnknownIds

# Clients are told to come back no sooner than this, and no later.
MIN_POLL_S, MAX_POLL_S = 1, 30

UNKNOWN = StandingStatus.UNKNOWN
SOLD_OUT = StandingStatus.SOLD_OUT
WAITING = StandingStatus.WAITING
BOT_CHECK = StandingStatus.BOT_CHECK
REUSED = StandingStatus.REUSED


@dataclass(frozen=True, slots=True)
class Place:
    """Where a ticket stands in line: its position, the estimated wait (the
    start, if ahead, then the room's pace) and when to poll again."""

    position: int
    eta_s: int
    poll_after_s: int


@dataclass(frozen=True, slots=True)
class Ticket:
    """A ticket in a sku's waiting room, and its place in line."""

    ticket: str
    place: Place


@dataclass(frozen=True, slots=True)
class Admitted:
    """A ticket let through: the admission token, when it expires, and the user
    it is for (a purchase must name the same user)."""

    token: str
    expires_at: datetime
    user_id: str


class RoomStore(Protocol):
    """The rooms' Redis records (gateway.redis.rooms.Rooms)."""

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
    ) -> Standing: ...
    async def poll(
        self,
        sku: str,
        ticket: str,
        room: WaitingRoom,
        starts_ms: int,
        *,
        exhausted: Exhausted = Exhausted.SOLD_OUT,
    ) -> Standing: ...
    async def spend(self, sku: str, ticket: str, request_id: str, ttl_ms: int) -> str | None: ...
    async def spent_by(self, sku: str, ticket: str) -> str | None: ...
    async def unspend(self, sku: str, ticket: str, request_id: str) -> bool: ...


class RoomCatalog(Protocol):
    """What the rooms know of each sku (gateway.usecases.catalog.Catalog)."""

    async def get(self, sku: str) -> SkuInfo: ...
    def cached(self, sku: str) -> SkuInfo | None: ...


class Buying(Protocol):
    """The purchases behind the rooms (gateway.usecases.purchases.Purchases)."""

    async def purchase(self, purchase: Purchase, client: Client = None) -> Result: ...
    async def exhausted(self, info: SkuInfo) -> bool: ...


class Holding(Protocol):
    """Whether a sku's units are held for payment (gateway.usecases.lifecycle.PaymentWindow)."""

    async def holding(self, info: SkuInfo) -> bool: ...


class SoldOutMarks(Protocol):
    """The in-process sold-out marks (gateway.usecases.sold_out.SoldOut)."""

    def lookup(self, sku: str) -> ConfirmedIds | UnknownIds | None: ...


# Why a join of a room that checks for bots is refused when it needs a new ticket.
NO_BOT_TOKEN = "this waiting room needs a bot_token"
BOT_TOKEN_REFUSED = "the bot check did not pass"
BOT_TOKEN_USED = "this bot_token was already used"

# A bot token's verdict at a join: the SHA-256 (hex) of a token that passed
# (its key in Redis), else what to answer should the join need a new ticket.
Verdict = str | BotCheckFailed | BotCheckUnavailable


class Admissions:
    """The waiting-room use cases, in front of :class:`Purchases`."""

    def __init__(
        self,
        *,
        catalog: RoomCatalog,
        soldout: SoldOutMarks,
        purchases: Buying,
        window: Holding,
        rooms: RoomStore,
        signer: Signing,
        bot_check: BotCheck,
        observer: AdmissionObserver,
    ) -> None:
        self._catalog = catalog
        self._soldout = soldout
        self._purchases = purchases
        self._window = window
        self._rooms = rooms
        self._signer = signer
        self._bot_check = bot_check
        self._observer = observer

    async def join(
        self, sku: str, user_id: str, bot_token: str | None = None, client: Client = None
    ) -> Ticket | None:
        """Put ``user_id`` in the sku's room (or find their ticket): the ticket,
        None when sold out. In a room that checks for bots a new ticket needs
        ``bot_token``, verified with its provider (``client`` names the buyer's
        address, sent along); a buyer who holds a checked ticket needs none.

        Raises :class:`UnknownSku`, :class:`NoWaitingRoom`,
        :class:`BotCheckFailed` (403) or :class:`BotCheckUnavailable` (503)."""
        info, room = await self._room(sku)
        if room.bot_check and not self._bot_check.configured:
            raise Unavailable(NO_BOT_CHECK, retry_after=5)
        verdict: Verdict = BotCheckFailed(NO_BOT_TOKEN)
        asked = False
        # A sku marked sold out is answered without asking the provider: the
        # join script says sold out, and nobody waits on a round trip for it.
        if room.bot_check and bot_token is not None and self._soldout.lookup(sku) is None:
            verdict, asked = await self._verdict(bot_token, client), True
        standing = await self._enter(info, room, user_id, verdict)
        if standing.status is BOT_CHECK and bot_token is not None and not asked:
            # Marked sold out, yet the line stays (units held for payment).
            verdict = await self._verdict(bot_token, client)
            standing = await self._enter(info, room, user_id, verdict)
        if standing.status is SOLD_OUT:
            return None
        if standing.status is BOT_CHECK:
            raise BotCheckFailed(NO_BOT_TOKEN) if isinstance(verdict, str) else verdict
        if standing.status is REUSED:
            raise BotCheckFailed(BOT_TOKEN_USED)
        self._seen(sku, standing)
        starts_ms = _ms(info.rules.starts_at)
        return Ticket(standing.ticket, _place(standing.position, room, starts_ms))

    async def _enter(
        self, info: SkuInfo, room: WaitingRoom, user_id: str, verdict: Verdict
    ) -> Standing:
        """The join script's answer for ``user_id``, given the bot token's verdict."""
        passed = verdict if isinstance(verdict, str) else None
        fresh = fresh_ticket(checked=passed is not None)
        starts_ms, ttl_ms = _ms(info.rules.starts_at), room.token_ttl_s * 1000
        args = (info.sku, user_id, fresh, starts_ms, ttl_ms)
        check, rooms = room.bot_check, self._rooms
        standing = await rooms.join(*args, bot_check=check, bot_passed=passed)
        if standing.status is SOLD_OUT and await self._window.holding(info):
            # Units held for payment may come back: the line stays.
            held = Exhausted.HELD
            standing = await rooms.join(*args, exhausted=held, bot_check=check, bot_passed=passed)
        return standing

    async def _verdict(self, token: str, client: Client) -> Verdict:
        """Ask the provider about ``token``: its digest when it passed, else the
        refusal a join that needs a new ticket answers."""
        try:
            passed = await self._bot_check.passes(token, None if client is None else client())
        except BotCheckUnavailable as exc:
            return exc
        if not passed:
            return BotCheckFailed(BOT_TOKEN_REFUSED)
        return hashlib.sha256(token.encode()).hexdigest()

    async def poll(self, sku: str, ticket: str) -> Place | Admitted | None:
        """Where ``ticket`` stands: its place while waiting, its admission once
        admitted, None when sold out.

        Raises :class:`UnknownSku`, :class:`NoWaitingRoom` or :class:`UnknownTicket`."""
        info, room = await self._room(sku)
        starts_ms = _ms(info.rules.starts_at)
        standing = await self._rooms.poll(sku, ticket, room, starts_ms)
        if standing.status is SOLD_OUT and await self._window.holding(info):
            # Units held for payment may come back: the line stays, let in
            # only while there is stock.
            held = Exhausted.HELD
            standing = await self._rooms.poll(sku, ticket, room, starts_ms, exhausted=held)
        if standing.status is UNKNOWN:
            raise UnknownTicket(f"no ticket {ticket!r} for sku {sku!r}")
        if standing.status is SOLD_OUT:
            return None
        self._seen(sku, standing)
        if standing.status is WAITING:
            return _place(standing.position, room, starts_ms)
        # Signed from Redis's admission time, so every poll gets the same token.
        expires_ms = standing.admitted_ms + room.token_ttl_s * 1000
        # The user the token is for, echoed: a client that follows the poll (the
        # schema's BuyAdmitted link, the waiting page) then needs nothing else.
        return Admitted(
            self._signer.sign(sku, standing.user_id, ticket, expires_ms),
            datetime.fromtimestamp(expires_ms / 1000, UTC),
            standing.user_id,
        )

    async def has_room(self, sku: str) -> bool:
        """Whether ``sku`` is sold through a waiting room; raises :class:`UnknownSku`."""
        return (await self._catalog.get(sku)).waiting_room is not None

    def open_door(self, sku: str) -> bool:
        """Whether ``sku`` is known, without I/O, to have no waiting room: then the
        caller buys through :class:`Purchases` directly, and the sold-out path
        pays one dict lookup for the waiting rooms, not a coroutine."""
        info = self._catalog.cached(sku)
        return info is not None and info.waiting_room is None

    async def purchase(
        self, purchase: Purchase, token: str | None, client: Client = None
    ) -> Result:
        """Decide a purchase, spending its admission token when the sku has a room.

        Raises :class:`AdmissionRequired` (428) or :class:`AdmissionInvalid` (403),
        and whatever :meth:`Purchases.purchase` raises."""
        info = await self._catalog.get(purchase.sku)
        if info.waiting_room is None:
            return await self._purchases.purchase(purchase, client)
        if token is None:
            # Sold out is the answer, token or not (replays included): from the
            # in-process mark without I/O, else from the stock's own store.
            marked = self._soldout.lookup(purchase.sku) is not None
            if marked or await self._purchases.exhausted(info):
                return await self._purchases.purchase(purchase, client)
            self._refuse(Refusal.MISSING)
        purchase = purchase.identified()
        ticket = await self._spend(purchase, token or "", info.waiting_room)
        try:
            return await self._purchases.purchase(purchase, client)
        except GatewayError:
            # Nothing was bought: the token may buy on the buyer's retry.
            await self._rooms.unspend(purchase.sku, ticket, purchase.request_id)
            raise

    async def _spend(self, purchase: Purchase, token: str, room: WaitingRoom) -> str:
        """Check the token's signature (and, in a room that checks for bots, its
        ticket's verdict) and spend it on this request; its ticket."""
        admission = self._signer.verify(token, purchase.sku, purchase.user_id)
        if admission is None:
            self._refuse(Refusal.FORGED)
        if room.bot_check and not admission.bot_checked:
            # Only a replay of a purchase made before the room checked goes on.
            spender = await self._rooms.spent_by(purchase.sku, admission.ticket)
            if spender != purchase.request_id:
                self._refuse(Refusal.UNCHECKED)
            return admission.ticket
        ttl_ms = admission.expires_ms - _now_ms()
        if ttl_ms <= 0:
            # Expired: only the request that spent it in time may come back for its outcome.
            spender = await self._rooms.spent_by(purchase.sku, admission.ticket)
            if spender != purchase.request_id:
                self._refuse(Refusal.EXPIRED)
            return admission.ticket
        spender = await self._rooms.spend(
            purchase.sku, admission.ticket, purchase.request_id, ttl_ms
        )
        if spender is not None and spender != purchase.request_id:
            self._refuse(Refusal.USED)
        return admission.ticket

    async def _room(self, sku: str) -> tuple[SkuInfo, WaitingRoom]:
        info = await self._catalog.get(sku)
        if info.waiting_room is None:
            raise NoWaitingRoom(f"sku {sku!r} has no waiting room")
        if not self._signer.configured:
            raise Unavailable(NO_ADMISSION_SECRET, retry_after=5)
        return info, info.waiting_room

    def _refuse(self, reason: Refusal) -> NoReturn:
        self._observer.admission_refused(reason.value)
        if reason is Refusal.MISSING:
            raise AdmissionRequired("this sku is bought through its waiting room")
        raise AdmissionInvalid(f"admission token {reason.value}")

    def _seen(self, sku: str, standing: Standing) -> None:
        self._observer.room_seen(sku, standing.waiting, standing.admitted_now)


def _place(position: int, room: WaitingRoom, starts_ms: int) -> Place:
    """The place of a ticket at ``position`` in line."""
    until_start_s = max(0, math.ceil((starts_ms - _now_ms()) / 1000))
    eta_s = until_start_s + math.ceil(position / room.admit_per_s)
    return Place(position, eta_s, min(MAX_POLL_S, max(MIN_POLL_S, eta_s // 2)))


def _ms(moment: datetime | None) -> int:
    """A start as ms since the epoch, 0 for none (what the room scripts take)."""
    return 0 if moment is None else int(moment.timestamp() * 1000)


def _now_ms() -> int:
    return int(time.time() * 1000)
