"""The relay and its outbox on a real PostgreSQL (issue 32), each test on a
database of its own: two relays share the work without sending an event twice
in one pass; retries keep each order's versions in order; an event past its
sink's max age is dead-lettered, listed by ``flashsale-gateway events`` and
delivered once replayed; pruning keeps what is owed; and the stream sink never
trims past an event still owed to the webhook."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import hiredis
import pytest
from redis.asyncio import Redis
from redis.backoff import ConstantBackoff

from gateway.domain.events import OrderEvent, SinkName
from gateway.postgres.outbox import CLAIM, REFUSED_FROM_BATCH, STATS, Outbox
from gateway.postgres.retention import Retention
from gateway.redis.event_stream import SKEW_MARGIN_S, EventStream
from gateway.settings import Settings
from gateway.usecases.relay import Relay
from testkit.commands import run_events
from testkit.order_events import WRITE_EVENTS, Observed, order_event, order_events

# Events a test writes as a status change of each order would: version 1..3.
VERSIONS = 3


class Recorder:
    """A sink that records what it was handed, pass by pass, and refuses what
    ``refuse`` says (an event's seq and its attempt, from 1)."""

    def __init__(
        self,
        name: SinkName = SinkName.STREAM,
        max_age_s: float | None = None,
        taken: list[OrderEvent] | None = None,
    ) -> None:
        self.name, self.max_age_s = name, max_age_s
        # Takes events as their fields (OrderEvent.payload and friends read them).
        self.packed = False
        self.passes: list[list[OrderEvent]] = []
        # What the sink took, in order (shared by the sinks of relays side by side).
        self.taken: list[OrderEvent] = [] if taken is None else taken
        self.tries: dict[int, int] = defaultdict(int)
        self.refuse: Callable[[OrderEvent, int], bool] = lambda event, attempt: False
        self.barrier: asyncio.Barrier | None = None
        # Events handed over before the version below them was taken.
        self.early: list[OrderEvent] = []

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]:
        """Record, wait a while for the other relay's pass when asked to, answer."""
        self.passes.append(list(events))
        below = {(e.order_id, e.version) for e in self.taken}
        self.early += [
            e for e in events if e.version > 1 and (e.order_id, e.version - 1) not in below
        ]
        if self.barrier is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.barrier.wait(), timeout=1)
        answers: list[str | None] = []
        for event in events:
            self.tries[event.seq] += 1
            if self.refuse(event, self.tries[event.seq]):
                answers.append("refused")
            else:
                self.taken.append(event)
                answers.append(None)
        return answers


@pytest.fixture
async def pool(events_db: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the test's database."""
    p = await asyncpg.create_pool(events_db, min_size=1, max_size=6)
    assert p is not None
    yield p
    await p.close()


def relay(pool: asyncpg.Pool, sink: Recorder, batch: int = 10) -> Relay:
    """A relay to ``sink`` retrying at once (the backoff is not under test here)."""
    return Relay(
        outbox=Outbox(pool),
        sinks=[sink],
        observer=Observed(),
        batch=batch,
        poll_s=0.01,
        backoff=ConstantBackoff(0),
    )


def in_order(taken: Sequence[OrderEvent]) -> bool:
    """Each order's versions were taken 1, 2, 3, ... in that order."""
    seen: dict[str, int] = defaultdict(int)
    for event in taken:
        if event.version != seen[event.order_id] + 1:
            return False
        seen[event.order_id] = event.version
    return True


async def drain(r: Relay, sink: Recorder, passes: int = 100) -> None:
    """Passes of ``r`` until one claims nothing, at most ``passes``."""
    for _ in range(passes):
        if not await r.relay_once(sink):
            return
    raise AssertionError(f"still claiming after {passes} passes")


class TestSharing:
    """Two relays on one outbox."""

    async def test_two_relays_never_send_one_event_in_the_same_pass(
        self, pool: asyncpg.Pool
    ) -> None:
        """Passes run side by side, each holding its batch until the other
        claimed too: the two batches of a pass are disjoint, every event is
        taken exactly once, none of an order before the version below it."""
        taken: list[OrderEvent] = []
        a, b = Recorder(taken=taken), Recorder(taken=taken)
        relay_a, relay_b = relay(pool, a), relay(pool, b)
        await relay_a.register()
        await pool.execute(WRITE_EVENTS, 30, VERSIONS)
        both = 0
        for _ in range(100):
            a.barrier = b.barrier = asyncio.Barrier(2)
            got = await asyncio.gather(relay_a.relay_once(a), relay_b.relay_once(b))
            if not any(got):
                break
            if all(got):
                both += 1
                assert not {e.seq for e in a.passes[-1]} & {e.seq for e in b.passes[-1]}
        handed = [e.seq for p in a.passes + b.passes for e in p]
        assert len(handed) == len(set(handed)) == len(taken) == 30 * VERSIONS
        assert both >= 3, "the relays never claimed side by side"
        assert not a.early and not b.early and in_order(taken)
        assert await pool.fetchval("SELECT count(*) FROM events_owed") == 0


class TestClaims:
    """What one claim takes (sql/functions/claim_events.sql)."""

    async def test_a_claim_never_holds_more_than_its_limit(self, pool: asyncpg.Pool) -> None:
        """Batches of 3, 5, 4 and 10 events (one statement each): claims of 8, 2,
        8 and 8 take 3+5, then 2 of the 4 (the batch split, its rest left a batch
        of its own), then those 2 and 6 of the 10, then the last 4; then nothing.
        Every event once, each claim's in the order they were written."""
        await Outbox(pool).register("stream")
        for size in (3, 5, 4, 10):
            await pool.execute(WRITE_EVENTS, size, 1)
        outbox, sizes, seen = Outbox(pool), [], []
        for limit in (8, 2, 8, 8, 8):
            async with outbox.claim("stream", limit, packed=False) as claim:
                seqs = [e.seq for e in claim.events]
                assert seqs == sorted(seqs)
                sizes.append(len(seqs))
                seen += seqs
                await claim.record(seqs, [])
        assert sizes == [8, 2, 8, 4, 0]
        assert seen == sorted(set(seen)) and len(seen) == 22
        assert await pool.fetchval("SELECT count(*) FROM events_owed") == 0

    async def test_one_statement_of_many_orders_is_claimed_in_pieces(
        self, pool: asyncpg.Pool
    ) -> None:
        """One statement writes 1,000 first versions and then their second
        versions (a bulk change): claims of 256 take 256, 256, 256 and 232 of
        the batch, never more; each second version comes only after its first
        was delivered."""
        sink = Recorder()
        r = relay(pool, sink, batch=256)
        await r.register()
        await pool.execute(WRITE_EVENTS, 1000, 2)
        await drain(r, sink)
        assert [len(p) for p in sink.passes][:4] == [256, 256, 256, 232]
        assert max(len(p) for p in sink.passes) <= 256
        assert len(sink.taken) == 2000 and in_order(sink.taken) and not sink.early
        assert await pool.fetchval("SELECT count(*) FROM events_owed") == 0

    async def test_a_claim_reads_its_events_by_key_not_the_whole_outbox(
        self, pool: asyncpg.Pool
    ) -> None:
        """A sale's outbox grows under a relay that has claimed since it was
        small: its connection claims 10 times while the outbox holds a few
        events (PostgreSQL then keeps a generic plan of the claim), then the
        outbox grows to 6,000 (statements of 60, as flushes write them, half of
        them delivered). A claim of 256, the refusal of its events and the
        backlog's sample on that connection read order_events by its key alone:
        no sequential scan. Given the seqs as an array, the cached plan scanned
        the whole table on every claim (the stack bench: 82 µs an event)."""
        await Outbox(pool).register("stream")
        await pool.execute("ALTER TABLE order_events SET (autovacuum_enabled = off)")
        async with pool.acquire() as con:
            for _ in range(10):
                await con.execute(WRITE_EVENTS, 6, 1)
                async with con.transaction():
                    assert len(await con.fetch(CLAIM, "stream", 256, True)) == 6
            start = await con.fetchval("SELECT max(seq) FROM order_events")
            for _ in range(100):
                await con.execute(WRITE_EVENTS, 60, 1)
            await con.execute("DELETE FROM event_batches WHERE first_seq <= $1", start + 3000)
            async with con.transaction():
                rows = await con.fetch(CLAIM, "stream", 256, True)
                seqs = [r["seq"] for r in rows]
                await con.execute(REFUSED_FROM_BATCH, "stream", seqs, [1.0] * 256, ["down"] * 256)
                (stats,) = await con.fetch(STATS)
                scans = await con.fetchrow(
                    "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables"
                    " WHERE relname = 'order_events'"
                )
        assert len(seqs) == 256 and seqs == sorted(seqs) and seqs[0] > start + 3000
        assert (stats["depth"], stats["dead"]) == (3000, 0)
        assert scans is not None
        assert scans["seq_scan"] == 0 and scans["idx_scan"] > 0, dict(scans)


# Events of one order whose text tests the packing: every optional field, a
# reason of several lines with RESP's own characters, and letters beyond ASCII
# (RESP counts bytes, not characters).
WRITE_AWKWARD_EVENTS = """
INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status,
    payment_id, pay_by, reason, cause)
VALUES (gen_random_uuid(), 1, 'order.pending_payment', 'rq-ü', 'skü-é', 'ü1', 12,
        'pending_payment', NULL, now(), NULL, NULL),
    (gen_random_uuid(), 1, 'order.refunded', 'rq-2', 'sku', 'u2', 3, 'refunded', 'pay_ü',
        now(), E'raison ç\r\n$3\r\n*1', 'admin')
"""


class TestPacked:
    """Events packed by PostgreSQL for the stream (sql/functions/event_packed.sql)."""

    async def test_a_packed_event_is_its_count_and_fields_as_hiredis_packs_them(
        self, pool: asyncpg.Pool
    ) -> None:
        """For events with and without every optional field, with CRLF, "$" and
        "*" in a value and letters beyond ASCII: the packed text is, byte for
        byte, what hiredis packs of the number of fields and the fields."""
        await pool.execute(WRITE_EVENTS, 3, 2)
        await pool.execute(WRITE_AWKWARD_EVENTS)
        rows = await pool.fetch("SELECT event_fields(e), event_packed(e) FROM order_events e")
        assert len(rows) == 8
        for fields, packed in rows:
            command = hiredis.pack_command((len(fields), *fields))
            assert packed.encode() == command[command.index(b"\r\n") + 2 :], fields

    async def test_the_stream_gets_each_event_as_its_fields(
        self, pool: asyncpg.Pool, redis: Redis, key_prefix: str
    ) -> None:
        """The relay of the stream on one Redis claims its events packed and
        appends them in one round trip: each entry is exactly its event's fields,
        in seq order (an order's versions in order), the awkward ones too."""
        key = f"{key_prefix}:events"
        stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
        assert stream.packed
        r = Relay(outbox=Outbox(pool), sinks=[stream], observer=Observed(), batch=7, poll_s=0.01)
        await r.register()
        await pool.execute(WRITE_EVENTS, 10, 2)
        await pool.execute(WRITE_AWKWARD_EVENTS)
        for _ in range(20):
            if not await r.relay_once(stream):
                break
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
        got = [[x.decode() for kv in fields.items() for x in kv] for _, fields in entries]
        rows = await pool.fetch("SELECT event_fields(e) FROM order_events e ORDER BY seq")
        want = [list(row[0]) for row in rows]
        assert sorted(map(tuple, got)) == sorted(map(tuple, want)) and len(got) == 22
        versions = [
            (f["order_id"], int(f["version"]))
            for f in (dict(zip(g[::2], g[1::2], strict=True)) for g in got)
        ]
        assert all(v == 1 or (o, v - 1) in versions[:i] for i, (o, v) in enumerate(versions)), (
            "a version before the one below it"
        )

    async def test_a_packed_append_waits_for_its_replicas(
        self, pool: asyncpg.Pool, redis: Redis, key_prefix: str
    ) -> None:
        """Packed, the append is followed by its WAIT on the same connection: on a
        Redis with no replica, a sink asking for one gets the event appended and
        refused as short of replicas (to be sent again), as with fields."""
        key = f"{key_prefix}:events"
        stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None, replicas=1)
        await Outbox(pool).register("stream")
        await pool.execute(WRITE_EVENTS, 2, 1)
        async with Outbox(pool).claim("stream", 10, packed=True) as claim:
            assert all(e.packed and not e.fields for e in claim.events)
            answers = await stream.deliver(claim.events)
        assert answers == ["redis: on 0 of 1 replicas after 1000 ms"] * 2
        assert await redis.xlen(key) == 2

    async def test_an_append_redis_refuses_leaves_the_others_appended(
        self, redis: Redis, key_prefix: str
    ) -> None:
        """The middle one of three packed events lost its last field, an odd
        number Redis's XADD refuses: it alone is answered with Redis's error (to
        be retried), and the other two are on the stream, in order."""
        key = f"{key_prefix}:events"
        stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
        events = order_events(3)
        broken = packed_as_postgres(OrderEvent(events[1].seq, events[1].fields[:-1]))
        sending = [packed_as_postgres(events[0]), broken, packed_as_postgres(events[2])]
        answers = await stream.deliver(sending)
        assert answers[0] is None and answers[2] is None
        assert answers[1] is not None and "wrong number of arguments" in answers[1]
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
        got = [[x.decode() for kv in fields.items() for x in kv] for _, fields in entries]
        assert got == [list(events[0].fields), list(events[2].fields)]


class TestLags:
    """The delivery lag each delivered event is observed with."""

    async def test_a_lag_runs_from_occurred_at_to_the_delivery(self, pool: asyncpg.Pool) -> None:
        """Events that occurred 30 s ago (by PostgreSQL's clock), first versions
        from a batch and later ones owed one by one, handed to a sink that takes
        0.2 s: each is observed 30.2 s late or more, and no later than the
        test's own clock allows; what was owed one by one is forgotten."""

        class Slow(Recorder):
            async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]:
                await asyncio.sleep(0.2)  # the sink's own time, part of the lag
                return await super().deliver(events)

        sink = Slow()
        observed = Observed()
        r = Relay(outbox=Outbox(pool), sinks=[sink], observer=observed, batch=50, poll_s=0.01)
        await r.register()
        await pool.execute(WRITE_EVENTS, 10, 2)
        await pool.execute("UPDATE order_events SET occurred_at = occurred_at - interval '30 s'")
        started = asyncio.get_running_loop().time()
        await drain(r, sink)
        took = asyncio.get_running_loop().time() - started
        assert len(observed.lags) == len(sink.taken) == 20
        assert {e.version for e in sink.taken} == {1, 2}
        assert all(30.2 <= lag <= 30 + took + 1 for lag in observed.lags), observed.lags
        assert await pool.fetchval("SELECT count(*) FROM events_owed") == 0


class TestRetries:
    """A sink that refuses some first attempts."""

    async def test_per_order_order_is_kept_under_retries(self, pool: asyncpg.Pool) -> None:
        """Every version 1 and 2 of every other order is refused once: each order's
        versions still reach the sink 1, 2, 3, none before the one below it was
        delivered, and the refusals are counted and recorded."""
        sink = Recorder()
        r = relay(pool, sink, batch=7)
        await r.register()
        await pool.execute(WRITE_EVENTS, 20, VERSIONS)
        odd = {
            row["order_id"]
            for row in await pool.fetch("SELECT DISTINCT order_id::text FROM order_events")
        }
        refused = set(sorted(odd)[::2])
        sink.refuse = lambda e, attempt: e.order_id in refused and e.version < 3 and attempt == 1
        await drain(r, sink)
        assert len(sink.taken) == 20 * VERSIONS
        assert in_order(sink.taken) and not sink.early
        assert sum(sink.tries.values()) == 20 * VERSIONS + len(refused) * 2
        assert await pool.fetchval("SELECT count(*) FROM events_owed") == 0


class TestDeadLetters:
    """A sink with a max age, refusing everything for a while."""

    async def test_an_old_event_is_dead_lettered_listed_and_replayed(
        self, pool: asyncpg.Pool, events_db: str, make_settings: Callable[..., Settings]
    ) -> None:
        """Owed past the sink's max age, an event is dead-lettered by the upkeep
        and no longer tried; ``events`` lists it and exits 1; ``--replay`` (the
        alias of ``--redeliver``) makes it due again, and once the sink takes it
        ``events`` lists nothing, exit 0; an event id the outbox does not hold is
        exit 1."""
        sink = Recorder(name=SinkName.WEBHOOK, max_age_s=0.2)
        sink.refuse = lambda e, attempt: True
        r = relay(pool, sink)
        await r.register()
        await pool.execute(WRITE_EVENTS, 1, 1)
        event_id = await pool.fetchval("SELECT event_id::text FROM order_events")
        assert await r.relay_once(sink) == 1
        await pool.execute("UPDATE event_deliveries SET owed_since = now() - interval '1 s'")
        await r.upkeep()
        assert await r.relay_once(sink) == 0
        settings = make_settings(database_url=events_db)
        code, out, _ = await run_events(settings)
        assert code == 1 and f"webhook\tdead\t{event_id}" in out, out
        assert "sink webhook: 0 owed, 1 dead" in out
        code, out, _ = await run_events(settings, "--replay", event_id)
        assert code == 0 and "redelivered 1" in out, out
        sink.refuse = lambda e, attempt: False
        await drain(r, sink)
        assert [e.event_id for e in sink.taken] == [event_id]
        code, out, _ = await run_events(settings)
        assert code == 0 and event_id not in out, out
        # An event the outbox does not hold (never written, or pruned): nothing to redeliver.
        code, _, err = await run_events(settings, "--replay", str(uuid.uuid4()))
        assert code == 1
        code, _, err = await run_events(settings, "--replay-since", "yesterday")
        assert code == 2 and "events" in err


class TestPruning:
    """The reconciler's pruning pass over the outbox."""

    async def test_pruning_keeps_owed_events_and_deletes_delivered_old_ones(
        self, pool: asyncpg.Pool
    ) -> None:
        """Of events older than the retention, the delivered ones go and the one
        still owed stays; younger delivered ones stay too."""
        sink = Recorder()
        r = relay(pool, sink)
        await r.register()
        await pool.execute(WRITE_EVENTS, 4, 1)
        owed = await pool.fetchval("SELECT min(seq) FROM order_events")
        sink.refuse = lambda e, attempt: e.seq == owed
        await r.relay_once(sink)
        await pool.execute("UPDATE event_deliveries SET due_at = now() + interval '1 hour'")
        await pool.execute(WRITE_EVENTS, 2, 1)
        await drain(r, sink)
        # The first four are an hour old; the owed one (still refused) among them.
        await pool.execute(
            "UPDATE order_events SET occurred_at = now() - interval '1 hour' WHERE seq <= $1",
            owed + 3,
        )
        pruned = await Retention(pool, 3600, events_retention_s=60).prune()
        assert pruned.order_events == 3
        left = {r["seq"] for r in await pool.fetch("SELECT seq FROM order_events")}
        assert left == {owed, owed + 4, owed + 5}


class TestStreamTrim:
    """The event stream's trim, with a webhook still owed events."""

    async def test_the_trim_never_passes_an_event_owed_to_the_webhook(
        self, redis: Redis, key_prefix: str
    ) -> None:
        """Trimmed by age to about the newest entry, the stream keeps every entry
        from the skew margin before the oldest event owed to the webhook, while
        older ones go; with nothing owed, those go too."""
        key = f"{key_prefix}:events"
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
        owed: list[datetime | None] = [datetime.now(UTC) - timedelta(seconds=5)]

        async def oldest() -> datetime | None:
            return owed[0]

        stream = EventStream(redis, key, max_len=0, max_age_s=0.001, webhook_owed=oldest)
        old = [f"{now_ms - 3_600_000 + i}-0" for i in range(250)]
        guarded = [f"{now_ms - int(SKEW_MARGIN_S * 1000) + 1_000 + i}-0" for i in range(50)]
        for entry_id in old + guarded:
            await redis.xadd(key, {"n": "1"}, id=entry_id)
        # The first batch learns the newest id; the second trims back from it.
        for n in range(2):
            assert await stream.deliver([order_event(n)]) == [None]
        ids = await entry_ids(redis, key)
        assert set(guarded) <= ids
        assert len(ids & set(old)) < 250, "nothing was trimmed"
        owed[0] = None
        await stream.deliver([order_event(2)])
        ids = await entry_ids(redis, key)
        assert not set(guarded) <= ids

    @pytest.mark.parametrize("packed", [False, True], ids=["fields", "packed"])
    async def test_a_length_trim_keeps_the_newest_entries_whole_and_in_order(
        self, redis: Redis, key_prefix: str, packed: bool
    ) -> None:
        """Appended in one round trip per batch, with a length trim of 10 on
        its last XADD, as fields or packed: the stream ends with the last
        events, each entry exactly its event's fields, in the batch's order,
        and about 10 entries are kept (whole macro nodes, at most 100 by
        default)."""
        key = f"{key_prefix}:events"
        stream = EventStream(redis, key, max_len=10, max_age_s=0, webhook_owed=None)
        events = order_events(600)
        sending = [packed_as_postgres(e) for e in events] if packed else events
        for first in range(0, len(events), 200):
            assert await stream.deliver(sending[first : first + 200]) == [None] * 200
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
        assert 10 <= len(entries) <= 110, len(entries)
        kept = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
        sent = [dict(zip(e.fields[::2], e.fields[1::2], strict=True)) for e in events]
        assert kept == sent[-len(kept) :]


def packed_as_postgres(event: OrderEvent) -> OrderEvent:
    """``event`` as a packed claim has it: its number of fields, then its
    fields, as hiredis packs them (``TestPacked``: the bytes event_packed renders)."""
    command = hiredis.pack_command((len(event.fields), *event.fields))  # type: ignore[arg-type]
    return OrderEvent(event.seq, (), command[command.index(b"\r\n") + 2 :].decode())


async def entry_ids(redis: Redis, key: str) -> set[str]:
    """The ids of the stream's entries."""
    entries: list[tuple[bytes, Any]] = await redis.xrange(key)  # type: ignore[assignment]
    return {entry_id.decode() for entry_id, _ in entries}
