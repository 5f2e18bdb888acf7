"""Reservations in Redis: a sku's stock counter and ledger, and the only caller
of the scripts that change them (``reserve.lua``, ``enqueue.lua``,
``settle.lua``, ``load_stock.lua``, ``snapshot.lua``).

A purchase's reservation is one ``reserve.lua`` (or ``enqueue.lua``) call,
coalesced with the other purchases of its sku in the same event-loop turn
(:class:`ReserveCalls` builds the call's KEYS and ARGV from each purchase's
:class:`ReserveEntry`); its :class:`Reply` says what the script decided. A
flush's verdicts go back as ``settle.lua``'s :class:`Settlement` values. A
counter is set from the database's stock in one of four :class:`StockLoad` modes.

Beside it: the rebuild lease of a sku's hashes (``gateway.redis.rebuild_lease``),
the scan of its confirmed ids (``gateway.redis.confirmed_scan``) and the stamp
of the database the state came from (``gateway.redis.identity``).

The keys and record formats are ``gateway.redis.layout``'s; every key of a sku
carries the ``{sku}`` hash tag, so one script, pipeline or MULTI of a sku
touches one cluster slot (``gateway.redis.connections``). Driver errors become
:class:`gateway.domain.errors.RedisUnavailable` here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from gateway.domain.errors import (
    RedisUnavailable,
)
from gateway.domain.model import (
    Closed,
    Order,
    Purchase,
    SkuInfo,
)
from gateway.domain.rules import effective, epoch_ms
from gateway.domain.stock import (
    REPLY_KINDS,
    Pending,
    Reply,
    ReplyKind,
    Settlement,
    Snapshot,
    StockLoad,
)
from gateway.redis.connections import RedisClient, redis_call
from gateway.redis.layout import (
    Change,
    KeyTags,
    SkuKeys,
    call_key,
    channel,
    client_bucket_key,
    decode_confirmed,
    ledger,
    rejected_key,
    stream_key,
    user_bucket_key,
)
from gateway.redis.scripts import Script, ScriptArg, ScriptCoalescer, read_composed, read_script
from gateway.settings import Settings

# reserve.lua's answers as values (gateway.domain.stock), made once where they
# carry nothing. The script's raw kind becomes its ReplyKind by one dict lookup
# (REPLY_KINDS), then is compared by identity with these module-level names: on
# CPython 3.11 a global is several times cheaper to read than ReplyKind.OK.
OK = ReplyKind.OK
SOLD_OUT = ReplyKind.SOLD_OUT
CONFIRMED = ReplyKind.CONFIRMED
UNVERIFIED = ReplyKind.UNVERIFIED
_WAITING_KINDS = frozenset({ReplyKind.NOT_STARTED, ReplyKind.RATE_LIMITED})

_SIMPLE: dict[ReplyKind, Reply] = {
    kind: Reply(kind)
    for kind in (
        ReplyKind.MISMATCH,
        ReplyKind.IN_PROGRESS,
        ReplyKind.MISSING,
        ReplyKind.DUPLICATE,
        ReplyKind.ENDED,
        ReplyKind.BUSY,
        ReplyKind.GROUP_LIMIT,
    )
}
_SOLD_OUT_REPLY = Reply(SOLD_OUT)
_EXHAUSTED_REPLY = Reply(SOLD_OUT, exhausted=True)
# UNVERIFIED, by (orphaned, exhausted).
_UNVERIFIED = {
    (orphaned, exhausted): Reply(UNVERIFIED, exhausted=exhausted, orphaned=orphaned)
    for orphaned in (False, True)
    for exhausted in (False, True)
}


def reply_of(raw: Any, purchase: Purchase) -> Reply:
    """reserve.lua's (or enqueue.lua's) raw answer for ``purchase`` as a :class:`Reply`;
    raises KeyError on a kind the scripts never answer."""
    kind = REPLY_KINDS[raw[0]]
    if kind is OK:
        return Reply(OK, reserved_at_ms=int(raw[2]))
    if kind is SOLD_OUT:
        return _EXHAUSTED_REPLY if int(raw[1]) == 1 else _SOLD_OUT_REPLY
    if kind is CONFIRMED:
        order = Order(raw[1], purchase.request_id, purchase.sku, raw[2], int(raw[3]))
        return Reply(CONFIRMED, order)
    if kind is UNVERIFIED:
        return _UNVERIFIED[int(raw[1]) == 1, int(raw[2]) == 1]
    if kind in _WAITING_KINDS:
        return Reply(kind, wait_ms=int(raw[1]))
    return _SIMPLE[kind]


# The arguments of one coalesced reserve.lua or enqueue.lua call.


# Not frozen: a frozen dataclass's __init__ costs four times as much, and one
# is made per purchase.
@dataclass(slots=True)
class ReserveEntry:
    """A purchase waiting for its sku's next reserve.lua (or enqueue.lua) call."""

    purchase: Purchase
    # The user's and the client's bucket keys; "" when that limit is off.
    user_bucket: str
    client_bucket: str
    # The sku's leading ARGV (see :meth:`ReserveCalls.head`).
    head: tuple[ScriptArg, ...]
    # What the sku's catalog entry says: its limit group's keys come from it.
    info: SkuInfo
    # PostgreSQL cleared it while the sku's hashes are rebuilt (reserve.lua's
    # "unverified"): it holds no order of its request id or buyer.
    verified: bool


class ReserveCalls:
    """Builds reserve.lua's and enqueue.lua's KEYS and ARGV for one gateway's settings."""

    def __init__(self, settings: Settings) -> None:
        self._prefix = settings.key_prefix
        self._retention_ms = max(1, round(settings.sale_retention_s * 1000))
        self._stream_max = settings.stream_max
        self._user_rate, self._client_rate = settings.user_rate, settings.client_rate
        self._heads: dict[str, tuple[SkuInfo, tuple[ScriptArg, ...]]] = {}
        # Per sku: its catalog entry, its keys, and its limit group's limit and
        # the other skus' hashes (none for a sku in no group).
        self._groups: dict[str, tuple[SkuInfo, SkuKeys, int, tuple[str, ...]]] = {}

    def group(self, info: SkuInfo) -> tuple[SkuKeys, int, tuple[str, ...]]:
        """The sku's keys (in its group's slot when it has one), its group's limit
        (0: none) and the buyers, pending and done hashes of the group's other
        skus; worked out once per catalog entry."""
        cached = self._groups.get(info.sku)
        if cached is not None and cached[0] is info:
            return cached[1:]
        group = info.group
        name = None if group is None else group.name
        keys = SkuKeys.of(self._prefix, info.sku, name)
        others: list[str] = []
        for sku in () if group is None else group.skus:
            if sku != info.sku:
                member = SkuKeys.of(self._prefix, sku, name)
                others += (member.buyers, member.pending, member.done)
        limit = 0 if group is None else group.per_user_limit
        self._groups[info.sku] = (info, keys, limit, tuple(others))
        return keys, limit, tuple(others)

    def head(self, info: SkuInfo) -> tuple[ScriptArg, ...]:
        """reserve.lua's ARGV[1..7] for a sku: retention, window, effective rates;
        worked out once per catalog entry."""
        cached = self._heads.get(info.sku)
        if cached is not None and cached[0] is info:
            return cached[1]
        rules = info.rules
        user = effective(rules.user_rate, self._user_rate)
        client = effective(rules.client_rate, self._client_rate)
        starts, ends = epoch_ms(rules.starts_at), epoch_ms(rules.ends_at)
        head: tuple[ScriptArg, ...] = (
            self._retention_ms,
            "" if starts is None else starts,
            "" if ends is None else ends,
            0 if user is None else user.per_s,
            0 if user is None else user.burst,
            0 if client is None else client.per_s,
            0 if client is None else client.burst,
        )
        self._heads[info.sku] = (info, head)
        return head

    def reserve(self, entries: list[ReserveEntry]) -> tuple[list[str], list[ScriptArg]]:
        """One reserve.lua call for a sku's waiting purchases: its four keys, the
        call's own key (a fresh id, so a call sent again is recognised), the
        rebuild key and the bucket keys (each once), the sku's head (the newest
        entry's), then six args per purchase."""
        sku = entries[0].purchase.sku
        sku_keys, limit, others = self.group(entries[-1].info)
        group = entries[-1].info.group
        name = None if group is None else group.name
        call = call_key(self._prefix, sku, uuid.uuid4().hex, name)
        keys: list[str] = [*sku_keys.all(), call, sku_keys.rebuild]
        index: dict[str, int] = {}
        args: list[ScriptArg] = [*entries[-1].head, limit, 0]
        for entry in entries:
            purchase = entry.purchase
            verified = 1 if entry.verified else 0
            if not (entry.user_bucket or entry.client_bucket):
                # No rate limit applies (the usual sale): no bucket index to find.
                args += (purchase.request_id, purchase.user_id, purchase.qty, 0, 0, verified)
                continue
            args += (purchase.request_id, purchase.user_id, purchase.qty)
            for bucket in (entry.user_bucket, entry.client_bucket):
                if not bucket:
                    args.append(0)
                    continue
                at = index.get(bucket)
                if at is None:
                    keys.append(bucket)
                    at = index[bucket] = len(keys)
                args.append(at)
            args.append(verified)
        args[8] = len(keys) + 1
        keys += others
        return keys, args

    def enqueue(self, entries: list[ReserveEntry]) -> tuple[list[str], list[ScriptArg]]:
        """One enqueue.lua call: reserve.lua's, then the stream and rejections
        keys last and the stream's bound as the last argument."""
        keys, args = self.reserve(entries)
        sku = entries[0].purchase.sku
        group = entries[-1].info.group
        name = None if group is None else group.name
        keys += (stream_key(self._prefix, sku, name), rejected_key(self._prefix, sku, name))
        args.append(self._stream_max)
        return keys, args


class Reservations:
    """Reservations, settlement and stock counters of every sku in Redis."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        on_noscript: Callable[[str], None] | None = None,
        tags: KeyTags | None = None,
    ) -> None:
        self.redis = redis
        self._prefix = settings.key_prefix
        # Each sku's limit group, which tags its keys (gateway.redis.layout).
        self.tags = KeyTags() if tags is None else tags
        self._channel = channel(settings.key_prefix)
        self._retention_ms = max(1, round(settings.sale_retention_s * 1000))
        self._keys: dict[str, tuple[str | None, SkuKeys]] = {}
        self._reserve = read_script("reserve")
        self._settle = read_script("settle")
        self._load_stock = read_script("load_stock")
        self._snapshot = read_script("snapshot")
        self._return_units = read_script("return_units")
        self._enqueue = read_composed("enqueue", "reserve")
        for script in self.scripts:
            script.on_reload = on_noscript
        self._calls = ReserveCalls(settings)
        # The one call made per purchase goes out coalesced: one per sku and turn.
        self._reserve_many = ScriptCoalescer(redis, self._reserve, self._calls.reserve)
        self._enqueue_many = ScriptCoalescer(redis, self._enqueue, self._calls.enqueue)

    @property
    def scripts(self) -> tuple[Script, ...]:
        """The scripts this adapter calls."""
        return (
            self._reserve,
            self._settle,
            self._load_stock,
            self._enqueue,
            self._snapshot,
            self._return_units,
        )

    def keys(self, sku: str) -> SkuKeys:
        """The (cached) keys of a sku, in its limit group's slot if it has one."""
        group = self.tags.group_of(sku)
        cached = self._keys.get(sku)
        if cached is None or cached[0] != group:
            cached = self._keys[sku] = (group, SkuKeys.of(self._prefix, sku, group))
        return cached[1]

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script; a syntax error raises here, at start-up."""
        for script in self.scripts:
            await script.load(self.redis)

    def on_the_way(self, sku: str) -> list[asyncio.Task[None]] | None:
        """The reserve calls of ``sku`` in flight, whose purchases will reach the
        batcher once Redis answers (see ScriptCoalescer.on_the_way)."""
        return self._reserve_many.on_the_way(sku)

    async def reserve(
        self,
        purchase: Purchase,
        info: SkuInfo,
        client: Callable[[], str | None] | None = None,
        *,
        verified: bool = False,
    ) -> Reply:
        """Reserve stock for one purchase (reserve.lua, with the sku's window and
        rate limits from ``info``); ``client`` names the client address, asked
        only when a client rate applies. ``verified``: PostgreSQL holds no order
        of its request id or buyer, so it may go on while the sku is rebuilt."""
        return await self._reserve_with(
            self._reserve_many, purchase, info, client, verified=verified
        )

    async def enqueue(
        self,
        purchase: Purchase,
        info: SkuInfo,
        client: Callable[[], str | None] | None = None,
        *,
        verified: bool = False,
    ) -> Reply:
        """Reserve stock for one purchase as :meth:`reserve` does and queue it in
        the sku's stream, in one script (enqueue.lua); "busy" when the stream is
        full."""
        return await self._reserve_with(
            self._enqueue_many, purchase, info, client, verified=verified
        )

    async def _reserve_with(
        self,
        calls: ScriptCoalescer[ReserveEntry],
        purchase: Purchase,
        info: SkuInfo,
        client: Callable[[], str | None] | None,
        *,
        verified: bool,
    ) -> Reply:
        head = self._calls.head(info)
        user_key = client_key = ""
        group = None if info.group is None else info.group.name
        if head[3]:
            user_key = user_bucket_key(self._prefix, purchase.sku, purchase.user_id, group)
        if head[5]:
            address = None if client is None else client()
            if address is not None:
                client_key = client_bucket_key(self._prefix, purchase.sku, address, group)
        try:
            raw = await calls(
                purchase.sku, ReserveEntry(purchase, user_key, client_key, head, info, verified)
            )
        except RedisError as exc:
            raise RedisUnavailable(f"redis: {type(exc).__name__}") from exc
        return reply_of(raw, purchase)

    async def settle(
        self, sku: str, settlements: Iterable[Settlement], db_stock_after: int | None
    ) -> int:
        """Apply a batch's verdicts (settle.lua); returns stock left, -1 if missing."""
        args: list[str | int] = [
            self._channel,
            sku,
            -1 if db_stock_after is None else db_stock_after,
            self._retention_ms,
        ]
        for s in settlements:
            args += (s.request_id, s.verdict.settled_as.value, s.user_id, s.qty, s.order_id)
        keys = self.keys(sku)
        return int(await self._call(self._settle, (*keys.all(), keys.rebuild), args))

    async def return_units(self, sku: str, closed: Iterable[Closed]) -> int:
        """Return closed orders' units to the sale and free their buyers, each
        order once (return_units.lua); how many were returned now."""
        args: list[str | int] = [self._channel, sku, self._retention_ms]
        for c in closed:
            args += (c.order.request_id, c.order.user_id, c.units)
        keys = self.keys(sku)
        return int(
            await self._call(self._return_units, (keys.stock, keys.buyers, keys.returned), args)
        )

    async def load_stock(self, sku: str, db_stock: int, mode: StockLoad) -> int:
        """Set Redis stock from database stock minus the ledger (load_stock.lua),
        as ``mode`` says; returns the stock now."""
        args = (mode.value, db_stock, self._channel, sku, self._retention_ms)
        keys = self.keys(sku)
        raw = await self._call(self._load_stock, (*keys.all(), keys.rebuild), args)
        return int(raw[1])

    async def forget_stock(self, sku: str) -> None:
        """Delete a sku's stock counter and announce the change (``meta:<sku>``): its
        strategy keeps no Redis stock now. The ledger stays, for the flushes still
        on their way; a later reserve-batch purchase or reset finds the counter
        missing and loads it from the database."""
        await redis_call(self.redis.delete(self.keys(sku).stock))
        await redis_call(self.redis.publish(self._channel, f"{Change.META}:{sku}"))

    async def announce(self, sku: str) -> None:
        """Announce that an admin changed ``sku`` (``meta:<sku>``): every instance
        drops its catalog entry and marks."""
        await redis_call(self.redis.publish(self._channel, f"{Change.META}:{sku}"))

    async def drop_state(self, sku: str) -> None:
        """Delete the sku's counter, hashes and rebuild flag where its keys are
        now (its group moves them: the next load starts them in the new slot)."""
        keys = self.keys(sku)
        await redis_call(self.redis.delete(*keys.all(), keys.rebuild, keys.returned))

    async def available(self, sku: str) -> int | None:
        """Unreserved stock in Redis, or None when the key is missing."""
        raw = await redis_call(self.redis.get(self.keys(sku).stock))
        return None if raw is None else int(raw)

    async def pending(self, sku: str) -> list[Pending]:
        """The ledger of a sku: reservations not yet settled."""
        raw: dict[str, str] = await redis_call(self.redis.hgetall(self.keys(sku).pending))
        return ledger(raw)

    async def snapshot(self, sku: str) -> Snapshot:
        """Stock and ledger read in one script (snapshot.lua), so no reservation
        falls between them."""
        keys = self.keys(sku)
        stock, flat = await self._call(self._snapshot, (keys.stock, keys.pending), ())
        entries = dict(zip(flat[::2], flat[1::2], strict=True))
        return Snapshot(None if stock is None else int(stock), ledger(entries))

    async def returns_given(self, sku: str) -> int:
        """How many orders return_units.lua has returned to the sale (it only
        adds to that count, so an unchanged count means no return in between)."""
        count: int = await redis_call(self.redis.hlen(self.keys(sku).returned))
        return count

    async def returned(self, sku: str, request_ids: Sequence[str]) -> set[str]:
        """Which of ``request_ids`` return_units.lua has returned to the sale."""
        if not request_ids:
            return set()
        marks = await redis_call(self.redis.hmget(self.keys(sku).returned, list(request_ids)))
        return {rid for rid, mark in zip(request_ids, marks, strict=True) if mark is not None}

    async def exhausted(self, sku: str) -> bool:
        """Whether the sku's counter is 0 with nothing pending (as the waiting-room
        scripts decide it); a missing counter is not sold out."""
        stock, pending = await self.snapshot(sku)
        return stock is not None and stock <= 0 and not pending

    async def confirmed_order(self, sku: str, request_id: str) -> Order | None:
        """The order Redis knows as confirmed for ``request_id``, if any."""
        record = await redis_call(self.redis.hget(self.keys(sku).done, request_id))
        return None if record is None else decode_confirmed(sku, request_id, record)

    async def ping(self) -> bool:
        """Whether Redis answers."""
        try:
            return bool(await self.redis.ping())
        except RedisError:
            return False

    async def _call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await redis_call(script(self.redis, keys, args))
