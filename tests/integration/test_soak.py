"""Every table and every Redis key the gateway writes is bounded: a soak.

One gateway, retentions of a second, runs many short sales back to back on a
database of its own: each round restocks five skus (``reserve-batch``,
``queue``, ``sql-direct``, one behind a waiting room, and one whose counter is
garbled so that the gateway doubts Redis) and sends each buyer's purchase, a
second click (rate limited, or sold out), a replay, and purchases after the
sale sold out (checked in PostgreSQL under the doubt, so released there).

The tables are found in ``information_schema``, not listed here: a table added
later is counted too unless it is one of the books below, with its reason.
Then every count must come back to where it started, and Redis's keys under
the test's prefix too, within a bound; a failure names what stayed. Every
table, and every key seen meanwhile, must be a row of the retention table of
``docs/operations.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.lock.tasks import rest
from gateway.ops.audit import audit
from gateway.redis.layout import SkuKeys
from gateway.settings import Settings
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, RESENDS, Client, buy, buy_resending
from testkit.rooms import SECRET, admitted_token, buy_with, join
from testkit.services import create_database, drop_database
from tests import summary

# Tables kept for good, and why; every other table must shrink back.
BOOKS = {
    "orders": "what was sold: replays and repeat buyers are decided from it for good",
    "stock_movements": "every stock provided or taken away: with orders, the audit's books",
}

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
RETENTION_HEADING = "## What is kept, where, and for how long"

# A second for everything that has a setting; the reconciler, which prunes
# PostgreSQL, every 2 s: a pass takes the lock of each sku it visits, so
# between passes a sku's fencing counter expires too.
SOAK = {
    "sale_retention_s": 1.0,
    "release_retention_s": 1.0,
    "reservation_timeout_s": 1.0,
    "reconcile_interval_s": 2.0,
    "admission_secret": SECRET,
    "writer_block_ms": 100,
    "events_retention_s": 1.0,
}
ROUNDS = 6
STOCK = 3
BUYERS = 5  # per sku and round: more than the stock, so each sale sells out
LATE = 2  # purchases after the sale sold out, per sku and round
RULES = {"user_rate": "1/s:1", "client_rate": "1000/s:1000"}
STRATEGIES = {"batch": "reserve-batch", "queue": "queue", "sql": "sql-direct"}


# A documented Redis key pattern, and what it matches after the prefix.
Patterns = dict[str, re.Pattern[str]]


def documented() -> tuple[set[str], Patterns]:
    """What the retention table of docs/operations.md names: every word in
    backticks, and the Redis key patterns among them with their regular
    expressions (``<prefix>`` and ``{sku}`` as written, ``<name>`` any text)."""
    text = OPERATIONS.read_text()
    section = text[text.index(RETENTION_HEADING) :].split("\n## ", 1)[0]
    rows = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    words = set(re.findall(r"`([^`]+)`", rows))
    patterns = {}
    for word in sorted(w for w in words if w.startswith("<prefix>:")):
        regex = re.escape(word.removeprefix("<prefix>"))
        regex = re.sub(r"\\\{[a-z]+\\\}", r"\\{[^}]*\\}", regex)
        regex = re.sub(r"<[a-z]+>", ".+", regex)
        patterns[word] = re.compile(regex)
    return words, patterns


def pattern_of(key: str, prefix: str, patterns: Patterns) -> str | None:
    """The documented pattern ``key`` matches, or None."""
    rest = key.removeprefix(prefix)
    return next((word for word, regex in patterns.items() if regex.fullmatch(rest)), None)


async def tables(con: asyncpg.Connection) -> list[str]:
    """Every table of the database's public schema."""
    rows = await con.fetch(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY table_name"
    )
    return [r["table_name"] for r in rows]


async def counts(con: asyncpg.Connection) -> dict[str, int]:
    """The row count of every table but the books."""
    found = {}
    for table in await tables(con):
        if table not in BOOKS:
            quoted = await con.fetchval("SELECT quote_ident($1)", table)
            found[table] = await con.fetchval(f"SELECT count(*) FROM {quoted}")
    return found


async def keys_under(redis: Redis, prefix: str) -> set[str]:
    """Every key under the test's prefix."""
    return {k.decode() async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)}


class Watch:
    """What the soak wrote at its peak: every key seen, the most rows of each table."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.most: dict[str, int] = {}

    async def run(self, redis: Redis, prefix: str, con: asyncpg.Connection) -> None:
        """Look every 0.1 s until cancelled (a cancel redis-py swallows included:
        gateway.lock.tasks.rest)."""
        while True:
            self.keys |= await keys_under(redis, prefix)
            for table, n in (await counts(con)).items():
                self.most[table] = max(n, self.most.get(table, 0))
            await rest(0.1)


@contextlib.asynccontextmanager
async def watching(redis: Redis, prefix: str, database_url: str) -> AsyncIterator[Watch]:
    """A :class:`Watch` running in the background for the block."""
    watch, con = Watch(), await asyncpg.connect(database_url)
    task = asyncio.create_task(watch.run(redis, prefix, con))
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await con.close()


async def put(client: Client, sku: str, **body: Any) -> None:
    """Create or restock a sku with its rules (asserts a 200)."""
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def final(client: Client, request_id: str, user: str) -> tuple[int, dict[str, Any]]:
    """A queued purchase's answer to its buyer once final (long polls while it is 202)."""

    async def answered() -> tuple[int, dict[str, Any]] | None:
        params = {"wait": "5", "user_id": user}
        resp = await client.get(f"/v1/orders/{request_id}", params=params)
        return None if resp.status == 202 else (resp.status, await resp.json())

    return await wait_for(answered, within=30, what=f"final answer of {request_id}")


async def sale(client: Client, sku: str, kind: str, r: int) -> int:
    """One short sale of ``sku``: every buyer clicks twice, replays the first
    click, and late buyers come after it sold out; the units sold."""
    users = [f"r{r}u{i}" for i in range(BUYERS)]
    first = await asyncio.gather(*(buy_resending(client, sku, u, f"r{r}-{u}") for u in users))
    confirmed = 201
    if kind == "queue":
        # Queued, then followed to the order (200) or the writer's refusal.
        first = [
            await final(client, f"{sku}.r{r}-{u}", u) if status == 202 else (status, body)
            for u, (status, body) in zip(users, first, strict=True)
        ]
        confirmed = 200
    sold = {
        u: body["order_id"] for u, (s, body) in zip(users, first, strict=True) if s == confirmed
    }
    second = await asyncio.gather(*(buy(client, sku, u, f"r{r}-{u}-again") for u in users))
    if kind == "queue":
        # A loaded machine can take over a second to get here: the user's rate
        # bucket has a token again, and the queue takes the click (202); its
        # writer then refuses it, which is what the buyer sees.
        second = [
            await final(client, f"{sku}.r{r}-{u}-again", u) if status == 202 else (status, body)
            for u, (status, body) in zip(users, second, strict=True)
        ]
    assert {body.get("status", body.get("error")) for _, body in second} <= {
        "rate_limited",
        "sold_out",
        "duplicate",
    }, second
    for u, order_id in sold.items():
        status, body = await buy(client, sku, u, f"r{r}-{u}")
        assert (status, body.get("order_id")) == (201, order_id), "a replay changed"
    for i in range(LATE):
        status, body = await buy(client, sku, f"r{r}late{i}", f"r{r}-late{i}")
        assert (status, body.get("status")) == (409, "sold_out"), body
    return len(sold)


async def room_sale(client: Client, sku: str, r: int) -> int:
    """One short sale behind the waiting room: join, be let in, buy with the
    token, replay it; the units sold."""
    sold = 0
    for i in range(BUYERS):
        user = f"r{r}u{i}"
        status, joined = await join(client, sku, user)
        if joined.get("status") == "sold_out":
            continue
        assert status == 200, joined
        token = await admitted_token(client, sku, joined["ticket"])
        for _ in range(RESENDS):
            status, body = await buy_with(client, sku, user, token, f"r{r}-{user}")
            if status != 503:
                break
        if status == 201:
            sold += 1
            assert await buy_with(client, sku, user, token, f"r{r}-{user}") == (201, body)
    return sold


async def doubt(client: Client, redis: Redis, prefix: str, sku: str) -> None:
    """Make the gateway doubt Redis: a reservation fails on a garbled counter
    (as on a dead node), answered 503; the counter then goes, to be reloaded."""
    stock = SkuKeys.of(prefix, sku).stock
    await redis.set(stock, "garbled", px=10_000)
    assert (await buy(client, sku, "nobody", f"doubt-{uuid.uuid4().hex[:6]}"))[0] == 503
    await redis.delete(stock)


async def back_to(baseline: Callable[[], Awaitable[str | None]], within: float, what: str) -> None:
    """Wait until ``baseline()`` finds nothing left (it says what is left)."""

    async def check() -> bool:
        left = await baseline()
        if left is not None:
            raise AssertionError(left)
        return True

    await wait_for(check, within=within, what=what)


@pytest.fixture
async def soak_database() -> AsyncIterator[str]:
    """A database of the soak's own: no other test's rows in its counts."""
    name = f"flashsale_soak_{uuid.uuid4().hex[:8]}"
    url = await create_database(name)
    yield url
    await drop_database(name)


class TestSoak:
    """Sales back to back leave nothing behind but the books."""

    async def test_every_table_and_key_returns_to_its_baseline(
        self,
        soak_database: str,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        redis: Redis,
        key_prefix: str,
        request: pytest.FixtureRequest,
    ) -> None:
        """Six rounds of five short sales, with replays, rate limits, a waiting
        room, the queue and a doubt window: each sale sells exactly its stock
        and the audit is clean; PostgreSQL wrote rate buckets and releases, and
        Redis every kind of key. Then every table but the books comes back to
        its count after the skus were created, and the keys under the prefix to
        the ones there at the gateway's start, within the retentions; every
        table and key met is in docs/operations.md's retention table."""
        # The event stream is kept, trimmed, for good: outside the prefix the
        # soak counts (the redis fixture still deletes it).
        events = f"{key_prefix}-events"
        client = await start_gateway(database_url=soak_database, events_stream=events, **SOAK)
        skus = {kind: f"{sku}-{kind}" for kind in (*STRATEGIES, "room", "doubt")}
        keys_at_start = await keys_under(redis, key_prefix)
        con = await asyncpg.connect(soak_database)
        try:
            await put(client, skus["doubt"], stock=1)
            for kind, strategy in STRATEGIES.items():
                await put(client, skus[kind], stock=0, strategy=strategy, **RULES)
            room = {"admit_per_s": 100, "token_ttl_s": 3}
            await put(client, skus["room"], stock=0, waiting_room=room)
            rows_at_start = await counts(con)

            async with watching(redis, key_prefix, soak_database) as watch:
                for r in range(ROUNDS):
                    await doubt(client, redis, key_prefix, skus["doubt"])
                    for kind, strategy in STRATEGIES.items():
                        await put(client, skus[kind], stock=STOCK, strategy=strategy, **RULES)
                        assert await sale(client, skus[kind], kind, r) == STOCK, (kind, r)
                    await put(client, skus["room"], stock=STOCK, waiting_room=room)
                    assert await room_sale(client, skus["room"], r) == STOCK, ("room", r)
            for row in await audit(make_settings(database_url=soak_database)):
                assert not row.failed, row

            words, patterns = documented()
            assert watch.most["rate_buckets"] > 0 and watch.most["released_reservations"] > 0
            undocumented = {k for k in watch.keys if not pattern_of(k, key_prefix, patterns)}
            assert not undocumented, f"keys not in docs/operations.md: {sorted(undocumented)}"
            seen = {pattern_of(k, key_prefix, patterns) for k in watch.keys}
            for part in ("rl:u:", "rl:c:", "call:", "stream", "request:", "q:used:", "fence"):
                assert any(part in str(p) for p in seen), f"the soak wrote no {part} key"
            unlisted = set(await tables(con)) - words
            assert not unlisted, f"tables not in docs/operations.md: {sorted(unlisted)}"

            async def rows_left() -> str | None:
                now = await counts(con)
                left = {t: n for t, n in now.items() if n != rows_at_start.get(t, 0)}
                return f"rows (table: now, at the start): {left}" if left else None

            async def keys_left() -> str | None:
                extra = await keys_under(redis, key_prefix) - keys_at_start
                named = sorted({pattern_of(k, key_prefix, patterns) or k for k in extra})
                return f"{len(extra)} keys left, of {named}" if extra else None

            await back_to(rows_left, within=20, what="every table but the books at its start")
            await back_to(keys_left, within=20, what="the keys under the prefix at the start")
            most = ", ".join(f"{t} {n}" for t, n in sorted(watch.most.items()))
            line = (
                f"{ROUNDS * 4} sales: at most {most} rows; {len(watch.keys)} keys seen"
                f" ({len(seen)} patterns); all back to where they started"
            )
            summary.add_line(request, "retention soak", line)
        finally:
            await con.close()
