"""Pure domain types: purchases, orders and their outcomes. No I/O here."""

from __future__ import annotations

import uuid
from dataclasses import KW_ONLY, dataclass, replace
from datetime import datetime
from enum import StrEnum

from gateway.domain.rules import NO_RULES, Rate, SaleRules


class Outcome(StrEnum):
    """What a purchase ended as; the value is the ``status`` the client sees."""

    CONFIRMED = "confirmed"
    SOLD_OUT = "sold_out"
    DUPLICATE = "duplicate"
    IN_PROGRESS = "in_progress"
    # Queue strategy: the purchase is in the sku's durable stream, not yet decided.
    ACCEPTED = "accepted"


@dataclass(frozen=True, slots=True)
class Purchase:
    """A validated purchase request; ``request_id`` is empty until one is generated."""

    sku: str
    user_id: str
    qty: int
    request_id: str
    # When Redis reserved it (ms since the epoch): names this reservation of the
    # request id, apart from an earlier one the reconciler released.
    reserved_at_ms: int = 0

    def identified(self) -> Purchase:
        """This purchase with a request id, generated if the client gave none."""
        if self.request_id:
            return self
        return Purchase(self.sku, self.user_id, self.qty, uuid.uuid4().hex, self.reserved_at_ms)

    def stamped(self, reserved_at_ms: int) -> Purchase:
        """This purchase as Redis reserved it at ``reserved_at_ms``.

        Built, not ``dataclasses.replace``d: every in-stock purchase takes this
        path, and replace costs 1.7 µs against 0.6 (it reads the fields and
        calls the constructor by keyword).
        """
        return Purchase(self.sku, self.user_id, self.qty, self.request_id, reserved_at_ms)


class OrderStatus(StrEnum):
    """Where an order stands after its 201 (``orders.status``)."""

    CONFIRMED = "confirmed"  # no payment window: final at its 201
    PENDING_PAYMENT = "pending_payment"  # holds its units until pay_by
    PAID = "paid"
    CANCELLED = "cancelled"  # its units went back on sale
    EXPIRED = "expired"  # not paid by pay_by: its units went back on sale
    REFUNDED = "refunded"  # paid (or confirmed), then refunded; restocked or not


# The statuses an order may be refunded from.
REFUNDABLE = frozenset({OrderStatus.PAID, OrderStatus.CONFIRMED})


class Cause(StrEnum):
    """Who made an order's change (``orders.cause``, an event's ``cause``)."""

    BUYER = "buyer"  # the purchase, or a cancel with the payment token
    PAYMENT = "payment"  # a pay, or a refund with the payment token
    SWEEP = "sweep"  # an expiry at pay_by
    ADMIN = "admin"  # a cancel or a refund with the admin token


# An expiry's reason, as its event carries it.
WINDOW_ELAPSED = "payment_window_elapsed"


@dataclass(frozen=True, slots=True)
class Order:
    """A committed order row."""

    order_id: str
    request_id: str
    sku: str
    user_id: str
    qty: int
    status: str = OrderStatus.CONFIRMED
    # The payment deadline (RFC 3339, PostgreSQL's clock); None without a window.
    pay_by: str | None = None

    def as_first_answered(self) -> Order:
        """The order as its 201 showed it, whatever became of it since: a replay
        answers that (``GET /v1/orders/{request_id}`` tells the status now)."""
        first = OrderStatus.CONFIRMED if self.pay_by is None else OrderStatus.PENDING_PAYMENT
        return self if self.status == first else replace(self, status=first)

    def as_json(self) -> dict[str, str | int | None]:
        """The order as the API shows it."""
        return {
            "status": self.status,
            "order_id": self.order_id,
            "request_id": self.request_id,
            "sku": self.sku,
            "user_id": self.user_id,
            "qty": self.qty,
            "pay_by": self.pay_by,
        }


@dataclass(frozen=True, slots=True)
class Closed:
    """An order a cancel, an expiry or a refund closed. ``owed``: its return is
    still to be given to Redis; ``units``: what that return puts back on sale
    (its qty, or 0 for a refund without restock, which only frees its buyer)."""

    order: Order
    # Named at every construction: two positional values would read as one flag.
    _: KW_ONLY
    owed: bool
    units: int
    # The payment of a refunded order (None if it had none: confirmed).
    payment_id: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """A purchase's outcome, with its order when confirmed."""

    outcome: Outcome
    order: Order | None = None
    # The request id an ACCEPTED purchase is followed by (GET /v1/orders/{id}).
    request_id: str = ""
    # SOLD_OUT while units are held for payment: how many, and the seconds to
    # the earliest deadline (Retry-After).
    held: int = 0
    retry_after_s: int = 0


class Verdict(StrEnum):
    """The database's decision on one reserved purchase of a flushed batch.

    The value is the letter ``flush_batch()`` (``sql/``) returns and
    ``lua/settle.lua`` reads: one vocabulary from PostgreSQL through Python to Redis.
    """

    CONFIRMED = "C"  # granted now, or a replay of this buyer's own order
    RELEASED = "R"  # goes back: the request id holds another purchase's order
    SOLD_OUT = "S"  # too little stock in the database: Redis ran ahead of it
    DUPLICATE = "D"  # the buyer already holds an order of this sku
    EXPIRED = "X"  # released before the flush: the reconciler, or a sold out arbitrated
    GROUP_LIMIT = "L"  # the buyer holds the limit of the sku's limit group

    @property
    def settled_as(self) -> Verdict:
        """The verdict Redis settles the reservation with (settle.lua knows no X
        nor L: an expired reservation was already given back, so releasing it is
        a no-op; one past its group's limit goes back, stock and buyer, as a
        released one does)."""
        return Verdict.RELEASED if self in _SETTLED_AS_RELEASED else self


_SETTLED_AS_RELEASED = frozenset({Verdict.EXPIRED, Verdict.GROUP_LIMIT})

SOLD_OUT = Result(Outcome.SOLD_OUT)
DUPLICATE = Result(Outcome.DUPLICATE)
IN_PROGRESS = Result(Outcome.IN_PROGRESS)


@dataclass(frozen=True, slots=True)
class WaitingRoom:
    """A sku's waiting room: how many people a second are let through, how long
    their admission token lasts, and whether early arrivals are shuffled."""

    admit_per_s: int
    token_ttl_s: int
    shuffle_at_start: bool = False
    # A join needs a bot token the provider vouches for (gateway.usecases.admission).
    bot_check: bool = False

    def as_json(self) -> dict[str, int | bool]:
        """The waiting room as the admin API shows it (``bot_check`` only when on,
        so a room without it is answered as before it existed)."""
        shown: dict[str, int | bool] = {
            "admit_per_s": self.admit_per_s,
            "token_ttl_s": self.token_ttl_s,
            "shuffle_at_start": self.shuffle_at_start,
        }
        if self.bot_check:
            shown["bot_check"] = True
        return shown


@dataclass(frozen=True, slots=True)
class Display:
    """A sku's display fields, the operator's own words for what is sold (the
    waiting-room page shows them); each None when not set."""

    title: str | None = None
    image_url: str | None = None
    price_text: str | None = None

    def as_json(self) -> dict[str, str]:
        """The fields set, as the APIs answer them: a field not set is absent, so
        a sku without them is answered as before they existed."""
        fields = {"title": self.title, "image_url": self.image_url, "price_text": self.price_text}
        return {name: value for name, value in fields.items() if value is not None}


NO_DISPLAY = Display()


@dataclass(frozen=True, slots=True)
class SkuInfo:
    """What the gateway needs to know of a sku before reserving it."""

    sku: str
    per_user_limit: int
    # None: anyone may buy without waiting in a room first.
    waiting_room: WaitingRoom | None = None
    # The sku's own strategy; None sells it under the gateway's GATEWAY_STRATEGY.
    strategy: Strategy | None = None
    rules: SaleRules = NO_RULES
    # Seconds a buyer has to pay; 0: none, an order is final at its 201.
    payment_window_s: int = 0
    # Not read by a purchase: cached here so GET /v1/skus/{sku} needs no query.
    display: Display = NO_DISPLAY
    # The sku's limit group, if any: its limit and every sku in it (this one too).
    group: LimitGroup | None = None


@dataclass(frozen=True, slots=True)
class LimitGroup:
    """A limit group as a purchase of one of its skus needs it: one buyer holds
    at most ``per_user_limit`` units across ``skus`` (by name, sorted)."""

    name: str
    per_user_limit: int
    skus: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        """The group as the admin API shows it."""
        return {"group": self.name, "per_user_limit": self.per_user_limit, "skus": list(self.skus)}


@dataclass(frozen=True, slots=True)
class SkuSettings:
    """What an admin sets on a sku, one attribute per field of ``PUT`` and
    ``PATCH /admin/skus/{sku}`` (a PATCH replaces the ones it names)."""

    stock: int = 0
    per_user_limit: int = 1
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    # None: the instance's default rate; "off": none for this sku.
    user_rate: Rate | str | None = None
    client_rate: Rate | str | None = None
    waiting_room: WaitingRoom | None = None
    strategy: Strategy | None = None
    payment_window_s: int = 0
    title: str | None = None
    image_url: str | None = None
    price_text: str | None = None
    # The name of the sku's limit group; None: none.
    limit_group: str | None = None

    @property
    def display(self) -> Display:
        """The display fields."""
        return Display(self.title, self.image_url, self.price_text)

    @property
    def rules(self) -> SaleRules:
        """The window and rates, as the purchases read them."""
        return SaleRules(self.starts_at, self.ends_at, self.user_rate, self.client_rate)

    def info(self, sku: str, group: LimitGroup | None = None) -> SkuInfo:
        """What the purchases need to know of ``sku`` so set, in ``group``."""
        return SkuInfo(
            sku,
            self.per_user_limit,
            self.waiting_room,
            self.strategy,
            self.rules,
            self.payment_window_s,
            self.display,
            group,
        )

    def as_json(self) -> dict[str, object]:
        """Every field as the admin API writes it."""
        return {
            "stock": self.stock,
            "per_user_limit": self.per_user_limit,
            **self.rules.window_json(),
            "user_rate": None if self.user_rate is None else str(self.user_rate),
            "client_rate": None if self.client_rate is None else str(self.client_rate),
            "waiting_room": None if self.waiting_room is None else self.waiting_room.as_json(),
            "strategy": None if self.strategy is None else self.strategy.value,
            "payment_window_s": self.payment_window_s,
            "title": self.title,
            "image_url": self.image_url,
            "price_text": self.price_text,
            "limit_group": self.limit_group,
        }


@dataclass(frozen=True, slots=True)
class StockReport:
    """Where a sku's stock stands, for the admin API and the audit."""

    sku: str
    db_stock: int
    redis_stock: int | None
    pending: int
    sold: int


class Strategy(StrEnum):
    """How a purchase takes its stock (``GATEWAY_STRATEGY``)."""

    RESERVE_BATCH = "reserve-batch"
    SQL_DIRECT = "sql-direct"
    OPTIMISTIC = "optimistic"
    PESSIMISTIC = "pessimistic"
    QUEUE = "queue"

    @property
    def reserves(self) -> bool:
        """Whether a purchase reserves in Redis first (its counter, ledger and
        hashes); the others decide in PostgreSQL alone (gateway.strategies), so
        their sku has no Redis state for the reconciler or the audit to compare."""
        return self in _RESERVING


# Read per purchase: a frozenset, not a chain of comparisons.
_RESERVING = frozenset({Strategy.RESERVE_BATCH, Strategy.QUEUE})
