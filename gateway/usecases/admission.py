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
purchase that then fails in a way the buyer may retry (503, 400, 422) gives the
token back (compare-and-delete on the request id); a replay of the same request
id finds its own id on the token and gets the first outcome, even after expiry.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NoReturn, Protocol

from gateway.domain.errors import (
    AdmissionInvalid,
    AdmissionRequired,
    GatewayError,
    NoWaitingRoom,
    Unavailable,
    UnknownTicket,
)
from gateway.domain.model import Purchase, Result, SkuInfo, WaitingRoom
from gateway.redis.rooms import Rooms, Standing
from gateway.usecases.admission_tokens import Refusal, Signer
from gateway.usecases.catalog import Catalog
from gateway.usecases.purchases import Purchases
from gateway.usecases.sold_out import SoldOut

# Clients are told to come back no sooner than this, and no later.
MIN_POLL_S, MAX_POLL_S = 1, 30


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


class AdmissionObserver(Protocol):
    """What the metrics want to know of the waiting rooms (see gateway.ops.metrics)."""

    def room_seen(self, sku: str, waiting: int, admitted_now: int) -> None: ...
    def admission_refused(self, reason: str) -> None: ...


class Admissions:
    """The waiting-room use cases, in front of :class:`Purchases`."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        soldout: SoldOut,
        purchases: Purchases,
        rooms: Rooms,
        signer: Signer | None,
        observer: AdmissionObserver | None = None,
    ) -> None:
        self._catalog = catalog
        self._soldout = soldout
        self._purchases = purchases
        self._rooms = rooms
        self._signer = signer
        self._observer = observer

    async def join(self, sku: str, user_id: str) -> Ticket | None:
        """Put ``user_id`` in the sku's room (or find their ticket): the ticket,
        None when sold out.

        Raises :class:`UnknownSku` or :class:`NoWaitingRoom`."""
        info, room, _ = await self._room(sku)
        starts_ms = _ms(info.rules.starts_at)
        ttl_ms = room.token_ttl_s * 1000
        fresh = secrets.token_hex(8)
        standing = await self._rooms.join(sku, user_id, fresh, starts_ms, ttl_ms)
        if standing.status == "sold_out" and await self._purchases.holding(info):
            # Units held for payment may come back: the line stays.
            standing = await self._rooms.join(sku, user_id, fresh, starts_ms, ttl_ms, held=True)
        if standing.status == "sold_out":
            return None
        self._seen(sku, standing)
        return Ticket(standing.ticket, _place(standing.position, room, starts_ms))

    async def poll(self, sku: str, ticket: str) -> Place | Admitted | None:
        """Where ``ticket`` stands: its place while waiting, its admission once
        admitted, None when sold out.

        Raises :class:`UnknownSku`, :class:`NoWaitingRoom` or :class:`UnknownTicket`."""
        info, room, signer = await self._room(sku)
        starts_ms = _ms(info.rules.starts_at)
        pace = (room.admit_per_s, starts_ms, room.shuffle_at_start)
        standing = await self._rooms.poll(sku, ticket, *pace)
        if standing.status == "sold_out" and await self._purchases.holding(info):
            # Units held for payment may come back: the line stays, let in
            # only while there is stock.
            standing = await self._rooms.poll(sku, ticket, *pace, held=True)
        if standing.status == "unknown":
            raise UnknownTicket(f"no ticket {ticket!r} for sku {sku!r}")
        if standing.status == "sold_out":
            return None
        self._seen(sku, standing)
        if standing.status == "waiting":
            return _place(standing.position, room, starts_ms)
        # Signed from Redis's admission time, so every poll gets the same token.
        expires_ms = standing.admitted_ms + room.token_ttl_s * 1000
        # The user the token is for, echoed: a client that follows the poll (the
        # schema's BuyAdmitted link, the waiting page) then needs nothing else.
        return Admitted(
            signer.sign(sku, standing.user_id, ticket, expires_ms),
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
        self, purchase: Purchase, token: str | None, client: Callable[[], str | None] | None = None
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
        ticket = await self._spend(purchase, token or "")
        try:
            return await self._purchases.purchase(purchase, client)
        except GatewayError:
            # Nothing was bought: the token may buy on the buyer's retry.
            await self._rooms.give_back(purchase.sku, ticket, purchase.request_id)
            raise

    async def _spend(self, purchase: Purchase, token: str) -> str:
        """Check the token's signature and spend it on this request; its ticket."""
        signer = self._require_signer()
        admission = signer.verify(token, purchase.sku, purchase.user_id)
        if admission is None:
            self._refuse(Refusal.FORGED)
        ttl_ms = admission.expires_ms - _now_ms()
        if ttl_ms <= 0:
            # Expired: only the request that spent it in time may come back for its outcome.
            holder = await self._rooms.spent_by(purchase.sku, admission.ticket)
            if holder != purchase.request_id:
                self._refuse(Refusal.EXPIRED)
            return admission.ticket
        holder = await self._rooms.spend(
            purchase.sku, admission.ticket, purchase.request_id, ttl_ms
        )
        if holder is not None and holder != purchase.request_id:
            self._refuse(Refusal.USED)
        return admission.ticket

    async def _room(self, sku: str) -> tuple[SkuInfo, WaitingRoom, Signer]:
        info = await self._catalog.get(sku)
        if info.waiting_room is None:
            raise NoWaitingRoom(f"sku {sku!r} has no waiting room")
        return info, info.waiting_room, self._require_signer()

    def _require_signer(self) -> Signer:
        if self._signer is None:
            raise Unavailable("waiting room: GATEWAY_ADMISSION_SECRET is not set", retry_after=5)
        return self._signer

    def _refuse(self, reason: Refusal) -> NoReturn:
        if self._observer is not None:
            self._observer.admission_refused(reason.value)
        if reason is Refusal.MISSING:
            raise AdmissionRequired("this sku is bought through its waiting room")
        raise AdmissionInvalid(f"admission token {reason.value}")

    def _seen(self, sku: str, standing: Standing) -> None:
        if self._observer is not None:
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
