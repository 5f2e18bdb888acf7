"""The Redis layout: every key name, channel and record format the gateway uses.

A sku's keys share the ``{sku}`` hash tag, so a script that touches them all
touches one cluster slot. A sku in a limit group tags them with its group
instead, ``<prefix>:{g:<group>}:<sku>:...`` (the **group slot**), so that
``reserve.lua`` sees every sku of the group in one call (:class:`KeyTags`,
``gateway.usecases.group_tags``); the flush lock keeps ``{sku}``. The Lua
scripts in ``lua/`` receive these keys through KEYS and write the records
below; their contracts point here.

``<prefix>:{<sku>}:stock``    string  units not yet reserved
``<prefix>:{<sku>}:buyers``   hash    user_id -> request_id of that user's reservation or order
``<prefix>:{<sku>}:pending``  hash    request_id -> ledger record ``user_id|qty|reserved_at_ms``
``<prefix>:{<sku>}:done``     hash    request_id -> confirmed record ``order_id|user_id|qty``
``<prefix>:{<sku>}:returned`` hash    request_id -> ``1`` for every closed order (cancelled,
                              expired) whose units were returned (return_units.lua)
``<prefix>:{<sku>}:rebuild``  string  ``owner|lease_until_ms`` while buyers and done are
                              rebuilt from PostgreSQL after Redis lost the sale
                              (``gateway.usecases.rebuilds``); reservations trust the two
                              hashes only once it is gone
``<prefix>:{<sku>}:lock``     the sku's flush lock (see ``gateway.lock``), expiring with
                              its lease; ``...:lock:fence`` its fencing tokens,
                              expiring ``GATEWAY_SALE_RETENTION_S`` after the last
                              acquisition
``<prefix>:{<sku>}:stream``   stream  queue strategy: reserved purchases waiting for a
                              writer, entry fields ``rid``, ``user``, ``qty``, ``at``
                              (request id, user id, qty, reserved_at_ms); consumer
                              group ``writers``; an entry is deleted once acknowledged
``<prefix>:{<sku>}:rejected`` hash    queue strategy: request_id -> verdict letter of a
                              queued purchase the database refused (S, D, R or X)
``<prefix>:request:{<rid>}``  string  queue strategy: ``sku|user_id``, the sku a request id
                              was queued for and its buyer, so ``GET /v1/orders/{rid}``
                              finds its state for that buyer alone
``<prefix>:{<sku>}:rl:u:<user_id>``  string  a user's token bucket ``tokens|at_ms`` for
``<prefix>:{<sku>}:rl:c:<address>``  string  the sku, and a client address's (reserve.lua);
                              each expires once it would be full again
``<prefix>:{<sku>}:call:<id>``  string  the replies (JSON) of a reserve.lua call that
                              reserved, for the call sent again; expires after 30 s
                              (or the retention, if shorter)
``<prefix>:events``           channel of sku changes: ``avail:<sku>`` (stock came back),
                              ``meta:<sku>`` (an admin changed the sku) and ``reset:*``
                              (every sku's state was dropped)
``<prefix>:db``               the identity of the database this state came from

Every key but ``<prefix>:db`` expires: the four keys of a sku
``GATEWAY_SALE_RETENTION_S`` after the last write (a reservation, a settle, a
reload; the scripts renew them together), the stream, the rejections, a
request's sku and a room's keys as long after their last write, a rate bucket
once it would be full again. ``docs/operations.md`` lists each with its
retention, and ``tests/integration/test_soak.py`` checks that they all go.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.domain.model import Order
from gateway.domain.stock import Pending

SEPARATOR = "|"


@dataclass(frozen=True, slots=True)
class SkuKeys:
    """The Redis keys of one sku, in the order the stock scripts take them, and
    the key flagging their rebuild."""

    stock: str
    buyers: str
    pending: str
    done: str
    rebuild: str
    returned: str

    @classmethod
    def of(cls, prefix: str, sku: str, group: str | None = None) -> SkuKeys:
        """The keys of ``sku`` under ``prefix``, all in the ``{sku}`` slot, or
        in ``group``'s slot for a sku in that limit group."""
        base = sku_base(prefix, sku, group)
        return cls(
            f"{base}:stock",
            f"{base}:buyers",
            f"{base}:pending",
            f"{base}:done",
            f"{base}:rebuild",
            f"{base}:returned",
        )

    def all(self) -> tuple[str, str, str, str]:
        """The four keys in script order."""
        return (self.stock, self.buyers, self.pending, self.done)


def sku_base(prefix: str, sku: str, group: str | None = None) -> str:
    """The common, hash-tagged start of every key of ``sku``: ``{sku}``, or for a
    sku in a limit group the group's tag followed by the sku."""
    if group is None:
        return f"{prefix}:{{{sku}}}"
    return f"{prefix}:{{g:{group}}}:{sku}"


class KeyTags:
    """Which limit group each grouped sku's keys are tagged with; a sku not
    named here is in no group (its keys carry ``{sku}``). One per process,
    shared by every Redis adapter that builds a sku's keys, and set by
    ``gateway.usecases.group_tags`` from PostgreSQL."""

    def __init__(self, groups: dict[str, str] | None = None) -> None:
        self._groups: dict[str, str] = dict(groups or {})

    def group_of(self, sku: str) -> str | None:
        """The limit group of ``sku``, None when it is in none."""
        return self._groups.get(sku)

    def set(self, sku: str, group: str | None) -> None:
        """``sku`` is in ``group`` now (None: in none)."""
        if group is None:
            self._groups.pop(sku, None)
        else:
            self._groups[sku] = group

    def replace(self, groups: dict[str, str]) -> None:
        """Every grouped sku's group, as PostgreSQL says now."""
        self._groups = dict(groups)

    def base(self, prefix: str, sku: str) -> str:
        """:func:`sku_base` of ``sku`` with its group."""
        return sku_base(prefix, sku, self._groups.get(sku))


def lock_key(prefix: str, sku: str) -> str:
    """The key of ``sku``'s flush lock, in the sku's slot."""
    return f"{sku_base(prefix, sku)}:lock"


def user_bucket_key(prefix: str, sku: str, user_id: str, group: str | None = None) -> str:
    """The key of a user's rate-limit bucket for ``sku``, in the sku's slot."""
    return f"{sku_base(prefix, sku, group)}:rl:u:{user_id}"


def client_bucket_key(prefix: str, sku: str, address: str, group: str | None = None) -> str:
    """The key of a client address's rate-limit bucket for ``sku``, in the sku's slot."""
    return f"{sku_base(prefix, sku, group)}:rl:c:{address}"


def call_key(prefix: str, sku: str, call_id: str, group: str | None = None) -> str:
    """The key holding the replies of one reservation call that reserved, in the
    sku's slot: a client library that sends the call again (after a timeout, or
    a cluster pipeline retried whole) gets the same replies back."""
    return f"{sku_base(prefix, sku, group)}:call:{call_id}"


def identity_key(prefix: str) -> str:
    """The key naming the database the state under ``prefix`` came from."""
    return f"{prefix}:db"


def sku_state_pattern(prefix: str) -> str:
    """A SCAN pattern matching the keys of every sku under ``prefix`` (and their locks)."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}:{{*}}:*"


STATE_SUFFIXES = (":stock", ":buyers", ":pending", ":done", ":rebuild", ":returned")


def channel(prefix: str) -> str:
    """The pub/sub channel on which sku changes are announced."""
    return f"{prefix}:events"


class Change(StrEnum):
    """What an announcement on the channel says happened to a sku."""

    AVAILABLE = "avail"  # stock came back: sold-out marks are stale
    META = "meta"  # an admin changed the sku: its catalog entry is stale too
    RESET = "reset"  # every sku's state was dropped (another database): all is stale


def parse_change(message: str) -> tuple[Change | None, str]:
    """``(change, sku)`` of an announcement; change is None for an unknown kind."""
    kind, _, sku = message.partition(":")
    try:
        return Change(kind), sku
    except ValueError:
        return None, sku


def encode_pending(entry: Pending) -> str:
    """The ledger record of a reservation (what reserve.lua writes)."""
    return SEPARATOR.join((entry.user_id, str(entry.qty), str(entry.reserved_at_ms)))


def decode_pending(request_id: str, record: str) -> Pending:
    """A ledger record back into a :class:`Pending`; ValueError when malformed."""
    user, qty, at = record.split(SEPARATOR)
    return Pending(request_id, user, int(qty), int(at))


def ledger(raw: dict[str, str]) -> list[Pending]:
    """A whole pending hash (request_id -> record) as entries."""
    return [decode_pending(rid, record) for rid, record in raw.items()]


def encode_confirmed(order: Order) -> str:
    """The done-hash record of a confirmed order (what settle.lua writes, and
    ``gateway.postgres.orders.ORDER_PAGE`` reads for a rebuild)."""
    return SEPARATOR.join((order.order_id, order.user_id, str(order.qty)))


def decode_confirmed(sku: str, request_id: str, record: str) -> Order:
    """A done-hash record back into its :class:`Order`."""
    order_id, user, qty = record.split(SEPARATOR)
    return Order(order_id, request_id, sku, user, int(qty))


def encode_queued(sku: str, user_id: str) -> str:
    """The request key's record of a queued purchase: ``sku|user_id``."""
    return SEPARATOR.join((sku, user_id))


def queued_by(record: str, user_id: str) -> str | None:
    """The sku of a request key's record if ``user_id`` queued it, else None
    (also for a record written before the buyer was kept: it names none)."""
    sku, _, buyer = record.partition(SEPARATOR)
    return sku if buyer == user_id else None


@dataclass(frozen=True, slots=True)
class RoomKeys:
    """The Redis keys of one sku's waiting room (``gateway.redis.rooms``), in its slot.

    ``...:q:wait``     zset    ticket -> join sequence: who waits, in order
    ``...:q:users``    hash    user_id -> ticket (joining twice finds it)
    ``...:q:tickets``  hash    ticket -> ``user_id`` while waiting, ``user_id|admitted_ms`` after
    ``...:q:recent``   zset    ticket -> admitted_ms of the admissions of the last second
    ``...:q:seq``      string  the last join sequence given out
    ``...:q:early``    string  the last join sequence given out before the sale's start
    ``...:q:shuffled`` string  set once the early arrivals were shuffled at the start
    ``...:q:used:<ticket>``  string  the request id that spent the ticket's token
    ``...:q:bot:<digest>``   string  ``1``: a bot token (by its SHA-256, hex) that
                             made a ticket here; SET NX PX by room_join.lua,
                             kept 300 s (as long as a Turnstile token is valid)

    The ``q`` is the room's former name (queue), kept in the keys: renamed, they
    would strand the rooms of a sale in progress across a rolling upgrade.
    """

    wait: str
    users: str
    tickets: str
    recent: str
    seq: str
    early: str
    shuffled: str

    @classmethod
    def of(cls, prefix: str, sku: str, group: str | None = None) -> RoomKeys:
        """The waiting-room keys of ``sku`` under ``prefix`` (in its group's slot
        for a sku in a limit group, as its stock keys are)."""
        base = f"{sku_base(prefix, sku, group)}:q"
        names = ("wait", "users", "tickets", "recent", "seq", "early", "shuffled")
        return cls(*(f"{base}:{name}" for name in names))

    def used(self, ticket: str) -> str:
        """The key recording which request spent ``ticket``'s admission token."""
        return f"{self.wait.removesuffix(':wait')}:used:{ticket}"

    def bot(self, digest: str) -> str:
        """The key recording that the bot token of SHA-256 ``digest`` (hex) was
        used here: in the sku's slot, so the join script claims it with the ticket."""
        return f"{self.wait.removesuffix(':wait')}:bot:{digest}"


# The consumer group of the queue strategy's writers, on every sku's stream.
WRITERS_GROUP = "writers"


def stream_key(prefix: str, sku: str, group: str | None = None) -> str:
    """The queue strategy's stream of ``sku``, in the sku's slot."""
    return f"{sku_base(prefix, sku, group)}:stream"


def rejected_key(prefix: str, sku: str, group: str | None = None) -> str:
    """The hash of ``sku``'s queued purchases the database refused, in the sku's slot."""
    return f"{sku_base(prefix, sku, group)}:rejected"


def request_key(prefix: str, request_id: str) -> str:
    """The key naming the sku a request id was queued for (its own slot)."""
    return f"{prefix}:request:{{{request_id}}}"
