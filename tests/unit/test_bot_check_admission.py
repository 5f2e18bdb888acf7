"""The bot check at a waiting room's door, decided against fakes, no servers.

:class:`Admissions` is handed a fake verifier (the ``BotCheck`` port) and a
fake room store that plays ``lua/room_join.lua``'s part in a few lines (one
ticket per user; a new one in a checking room only with a bot token that
passed, claimed once); the script itself is run on Redis by
``tests/integration/test_bot_check.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.domain.errors import (
    AdmissionInvalid,
    BotCheckFailed,
    BotCheckUnavailable,
    Unavailable,
)
from gateway.domain.model import Outcome, Purchase, Result, SkuInfo, WaitingRoom
from gateway.domain.rooms import Exhausted, Standing, StandingStatus
from gateway.usecases.admission import Admissions
from gateway.usecases.admission_tokens import CHECKED, Signer
from gateway.usecases.ports import (
    NO_BOT_CHECK,
    NO_SIGNER,
    UNOBSERVED,
    AdmissionObserver,
    BotCheck,
    Client,
    Signing,
)
from gateway.usecases.sold_out import ConfirmedIds, UnknownIds

SKU = "drop"
SECRET = "unit-admission-secret-0123"
CHECKING = WaitingRoom(admit_per_s=10, token_ttl_s=60, bot_check=True)
OPEN = WaitingRoom(admit_per_s=10, token_ttl_s=60)
SIGNER = Signer(SECRET)


class Verifier:
    """The provider: tokens starting ``ok`` pass, ``down`` raise, others fail;
    every question recorded."""

    configured = True

    def __init__(self) -> None:
        self.asked: list[tuple[str, str | None]] = []

    async def passes(self, token: str, remote_ip: str | None) -> bool:
        self.asked.append((token, remote_ip))
        if token.startswith("down"):
            raise BotCheckUnavailable("bot check: no answer within 2s")
        return token.startswith("ok")

    async def close(self) -> None:
        """Nothing held."""


@dataclass
class Store:
    """room_join.lua's decisions in Python; records each join's bot arguments."""

    tickets: dict[str, str] = field(default_factory=dict)
    claimed: set[str] = field(default_factory=set)
    sold_out: bool = False
    joins: list[tuple[bool, str | None]] = field(default_factory=list)
    spent: dict[str, str] = field(default_factory=dict)

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
        self.joins.append((bot_check, bot_passed))
        if self.sold_out:
            return Standing(StandingStatus.SOLD_OUT)
        ticket = self.tickets.get(user_id)
        if ticket is not None and bot_check and not ticket.startswith(CHECKED):
            ticket = None
        if ticket is None:
            if bot_check and bot_passed is None:
                return Standing(StandingStatus.BOT_CHECK)
            if bot_check and bot_passed is not None:
                if bot_passed in self.claimed:
                    return Standing(StandingStatus.REUSED)
                self.claimed.add(bot_passed)
            ticket = self.tickets[user_id] = fresh_ticket
        return Standing(StandingStatus.WAITING, ticket, user_id, position=len(self.tickets))

    async def poll(
        self,
        sku: str,
        ticket: str,
        room: WaitingRoom,
        starts_ms: int,
        *,
        exhausted: Exhausted = Exhausted.SOLD_OUT,
    ) -> Standing:
        raise AssertionError("not polled here")

    async def spend(self, sku: str, ticket: str, request_id: str, ttl_ms: int) -> str | None:
        holder = self.spent.get(ticket)
        self.spent.setdefault(ticket, request_id)
        return holder

    async def spent_by(self, sku: str, ticket: str) -> str | None:
        return self.spent.get(ticket)

    async def unspend(self, sku: str, ticket: str, request_id: str) -> bool:
        return self.spent.pop(ticket, None) is not None


class Catalog:
    """One sku, with ``room``."""

    def __init__(self, room: WaitingRoom) -> None:
        self.info = SkuInfo(SKU, per_user_limit=1, waiting_room=room)

    async def get(self, sku: str) -> SkuInfo:
        return self.info

    def cached(self, sku: str) -> SkuInfo | None:
        return self.info


class Buying:
    """Every purchase confirmed; no units held."""

    def __init__(self) -> None:
        self.bought: list[Purchase] = []

    async def purchase(self, purchase: Purchase, client: Client = None) -> Result:
        self.bought.append(purchase)
        return Result(Outcome.CONFIRMED, None, purchase.request_id)

    async def holding(self, info: SkuInfo) -> bool:
        return False

    async def exhausted(self, info: SkuInfo) -> bool:
        return False


class Marks:
    """The sold-out marks: ``sold_out`` or none."""

    def __init__(self, marked: bool = False) -> None:
        self.marked = marked

    def lookup(self, sku: str) -> ConfirmedIds | UnknownIds | None:
        return ConfirmedIds(0) if self.marked else None


class Counted:
    """The metrics: every room seen and every refusal, recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []
        self.refused: list[str] = []

    def room_seen(self, sku: str, waiting: int, admitted_now: int) -> None:
        self.seen.append((sku, waiting, admitted_now))

    def admission_refused(self, reason: str) -> None:
        self.refused.append(reason)


def admissions(
    room: WaitingRoom = CHECKING,
    verifier: BotCheck | None = None,
    store: Store | None = None,
    marked: bool = False,
    signer: Signing = SIGNER,
    observer: AdmissionObserver = UNOBSERVED,
) -> tuple[Admissions, Store, Buying]:
    """Admissions for one sku with ``room``, the given verifier, store, signer
    and observer."""
    store = store or Store()
    buying = Buying()
    made = Admissions(
        catalog=Catalog(room),
        soldout=Marks(marked),
        purchases=buying,
        window=buying,
        rooms=store,
        signer=signer,
        bot_check=verifier or Verifier(),
        observer=observer,
    )
    return made, store, buying


def client() -> str:
    return "203.0.113.7"


class TestJoin:
    """A join of a room that checks for bots: one question to the provider, one
    ticket per token, failing closed."""

    async def test_a_token_that_passes_makes_a_checked_ticket(self) -> None:
        """The provider is asked once, with the buyer's address; the ticket
        carries the verdict, and the script is handed the token's digest."""
        verifier = Verifier()
        rooms, store, _ = admissions(verifier=verifier)
        ticket = await rooms.join(SKU, "alice", "ok-1", client)
        assert ticket is not None and ticket.ticket.startswith(CHECKED)
        assert verifier.asked == [("ok-1", "203.0.113.7")]
        assert store.joins == [(True, store.joins[0][1])]
        assert store.joins[0][1] is not None and "ok-1" not in store.joins[0][1]

    @pytest.mark.parametrize(
        ("token", "error", "detail"),
        [
            (None, BotCheckFailed, "this waiting room needs a bot_token"),
            ("bad-1", BotCheckFailed, "the bot check did not pass"),
            ("down-1", BotCheckUnavailable, "bot check: no answer within 2s"),
        ],
    )
    async def test_no_ticket_without_a_pass(
        self, token: str | None, error: type[Exception], detail: str
    ) -> None:
        """Missing or refused: 403; the provider down: 503. Nobody is let in."""
        rooms, store, _ = admissions()
        with pytest.raises(error) as raised:
            await rooms.join(SKU, "alice", token, client)
        assert str(raised.value) == detail
        assert store.tickets == {}

    async def test_a_token_makes_one_ticket(self) -> None:
        """The same token for a second buyer: 403, however the provider answers."""
        rooms, store, _ = admissions()
        await rooms.join(SKU, "alice", "ok-1", client)
        with pytest.raises(BotCheckFailed, match="already used"):
            await rooms.join(SKU, "bob", "ok-1", client)
        assert list(store.tickets) == ["alice"]

    async def test_a_buyer_in_line_joins_again_without_a_token(self) -> None:
        """A checked ticket is found again with no token, a spent one or a bad
        one, and the provider is not asked without one."""
        verifier = Verifier()
        rooms, _, _ = admissions(verifier=verifier)
        first = await rooms.join(SKU, "alice", "ok-1", client)
        again = [await rooms.join(SKU, "alice", t, client) for t in (None, "ok-1", "bad-1")]
        assert first is not None and {a.ticket for a in again if a} == {first.ticket}
        assert [token for token, _ in verifier.asked] == ["ok-1", "ok-1", "bad-1"]

    async def test_a_room_without_the_check_never_asks(self) -> None:
        """bot_token is ignored by a room without bot_check: no question, an
        unchecked ticket."""
        verifier = Verifier()
        rooms, _, _ = admissions(OPEN, verifier=verifier)
        ticket = await rooms.join(SKU, "alice", "bad-1", client)
        assert ticket is not None and not ticket.ticket.startswith(CHECKED)
        assert verifier.asked == []

    async def test_a_marked_sold_out_sku_is_answered_without_asking(self) -> None:
        """Sold out is the fastest answer: no round trip to the provider first."""
        verifier = Verifier()
        rooms, _, _ = admissions(verifier=verifier, store=Store(sold_out=True), marked=True)
        assert await rooms.join(SKU, "alice", "ok-1", client) is None
        assert verifier.asked == []

    async def test_an_instance_without_the_settings_fails_closed(self) -> None:
        """A checking room on an instance without GATEWAY_BOT_CHECK_URL: 503,
        nobody joins."""
        rooms, store, _ = admissions(verifier=NO_BOT_CHECK)
        with pytest.raises(Unavailable, match="GATEWAY_BOT_CHECK_URL"):
            await rooms.join(SKU, "alice", "ok-1", client)
        assert store.joins == []


class TestPurchase:
    """The verdict travels in the signed admission token: a purchase asks nobody."""

    async def test_a_checked_ticket_buys(self) -> None:
        """An admission token of a checked ticket buys in a checking room."""
        verifier = Verifier()
        rooms, _, buying = admissions(verifier=verifier)
        token = Signer(SECRET).sign(SKU, "alice", f"{CHECKED}0123abcd", 2**42)
        result = await rooms.purchase(Purchase(SKU, "alice", 1, "r-1"), token)
        assert result.outcome is Outcome.CONFIRMED and len(buying.bought) == 1
        assert verifier.asked == []

    async def test_an_unchecked_ticket_does_not(self) -> None:
        """A token whose ticket was made without the check: 403 admission_invalid,
        nothing bought, the refusal counted by its reason."""
        counted = Counted()
        rooms, _, buying = admissions(observer=counted)
        token = Signer(SECRET).sign(SKU, "alice", "0123abcd", 2**42)
        with pytest.raises(AdmissionInvalid, match="unchecked"):
            await rooms.purchase(Purchase(SKU, "alice", 1, "r-1"), token)
        assert buying.bought == []
        assert counted.refused == ["unchecked"]


class TestWithoutASecret:
    """An instance without GATEWAY_ADMISSION_SECRET (the NO_SIGNER port): its
    waiting rooms answer 503, and nobody joins or buys through them."""

    async def test_a_join_is_unavailable(self) -> None:
        """No ticket is made: the room is refused before the store is asked."""
        rooms, store, _ = admissions(OPEN, signer=NO_SIGNER)
        with pytest.raises(Unavailable, match="GATEWAY_ADMISSION_SECRET"):
            await rooms.join(SKU, "alice", None, client)
        assert store.joins == []

    async def test_a_purchase_is_unavailable(self) -> None:
        """A token, even one another instance signed, buys nothing here."""
        rooms, store, buying = admissions(OPEN, signer=NO_SIGNER)
        token = Signer(SECRET).sign(SKU, "alice", "0123abcd", 2**42)
        with pytest.raises(Unavailable, match="GATEWAY_ADMISSION_SECRET"):
            await rooms.purchase(Purchase(SKU, "alice", 1, "r-1"), token)
        assert buying.bought == [] and store.spent == {}
