"""The flush bench's figures (``loadtests.bench_flush``): one :class:`Drain` per
measured drain, summed up per lock mode and batch size, and printed as tables.

Pure arithmetic, no I/O: the bench measures, this says what the measurements mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# How the flush lock is taken, in the order the tables show them:
# per-batch: acquired and released around every batch (Flusher.flush, then
#   Flusher.emptied: a backlog that runs empty after each flush, or a lock handed to
#   another instance after every batch);
# slice: the Flusher's own rule under a backlog, the lock kept across
#   back-to-back flushes for HOLD_SLICE_S, then released and taken again;
# none: GATEWAY_FLUSH_LOCK=none, the row lock alone (the row's own time).
MODES = ("per-batch", "slice", "none")


@dataclass(frozen=True, slots=True)
class Drain:
    """One drain of ``batches`` batches of ``batch`` purchases, back to back.

    Seconds in all: ``wall_s`` from the first flush to the last; ``lock_s``,
    ``sql_s`` and ``settle_s`` the flush lock's acquisitions and releases, the
    ``flush_batch()`` calls and the ``settle.lua`` calls within it; ``cpu_s``
    the bench process's CPU and ``queued_s`` its time waiting for a core;
    ``pg_cpu_s`` the CPU of the database's backends and ``redis_cpu_s`` of the
    Redis server (shared: others' commands count too), None when not readable.
    """

    mode: str
    batch: int
    round: int
    batches: int
    wall_s: float
    lock_s: float
    sql_s: float
    settle_s: float
    cpu_s: float
    queued_s: float
    pg_cpu_s: float | None
    redis_cpu_s: float | None

    @property
    def orders(self) -> int:
        """Orders this drain committed."""
        return self.batch * self.batches

    @property
    def per_s(self) -> float:
        """Orders committed per second of wall time."""
        return self.orders / self.wall_s


@dataclass(frozen=True, slots=True)
class Row:
    """One (mode, batch size) over the rounds: orders/s median, min and max, and
    the medians over the rounds of the time per batch (ms), of its parts, and of
    the CPU per order (µs) of the bench, PostgreSQL and Redis."""

    mode: str
    batch: int
    rounds: int
    per_s: float
    per_s_min: float
    per_s_max: float
    batch_ms: float
    lock_ms: float
    sql_ms: float
    settle_ms: float
    queued_ms: float
    cpu_us: float
    pg_cpu_us: float | None
    redis_cpu_us: float | None

    @property
    def other_ms(self) -> float:
        """Time per batch outside the lock, the SQL and the settle: the Flusher's
        own Python and the event loop's turns between the awaits."""
        return max(self.batch_ms - self.lock_ms - self.sql_ms - self.settle_ms, 0.0)

    @property
    def row_us(self) -> float:
        """The ``flush_batch()`` call's time per order: the row's time, plus one
        round trip and the pool's check-out per batch."""
        return self.sql_ms * 1000 / self.batch


def schedule(
    round_: int, rounds: int, modes: Sequence[str], sizes: Sequence[int]
) -> list[tuple[str, int]]:
    """The (mode, batch size) drains of one round in their order: every size with
    every mode, the list shifted by an equal share each round, so that no drain
    always runs first or last (the orders table grows as the rounds go)."""
    cells = [(mode, size) for size in sizes for mode in modes]
    shift = round_ * len(cells) // max(rounds, 1)
    return cells[shift:] + cells[:shift]


def summarize(drains: Iterable[Drain]) -> list[Row]:
    """One row per (mode, batch size), modes in :data:`MODES` order, sizes ascending."""
    groups: dict[tuple[str, int], list[Drain]] = {}
    for drain in drains:
        groups.setdefault((drain.mode, drain.batch), []).append(drain)
    order = {mode: i for i, mode in enumerate(MODES)}
    rows = []
    for (mode, batch), found in sorted(groups.items(), key=lambda g: (order[g[0][0]], g[0][1])):
        rates = [d.per_s for d in found]
        rows.append(
            Row(
                mode=mode,
                batch=batch,
                rounds=len(found),
                per_s=statistics.median(rates),
                per_s_min=min(rates),
                per_s_max=max(rates),
                batch_ms=_median(d.wall_s / d.batches * 1000 for d in found),
                lock_ms=_median(d.lock_s / d.batches * 1000 for d in found),
                sql_ms=_median(d.sql_s / d.batches * 1000 for d in found),
                settle_ms=_median(d.settle_s / d.batches * 1000 for d in found),
                queued_ms=_median(d.queued_s / d.batches * 1000 for d in found),
                cpu_us=_median(d.cpu_s / d.orders * 1e6 for d in found),
                pg_cpu_us=_per_order([(d.pg_cpu_s, d.orders) for d in found]),
                redis_cpu_us=_per_order([(d.redis_cpu_s, d.orders) for d in found]),
            )
        )
    return rows


def best(rows: Sequence[Row], mode: str) -> Row | None:
    """The batch size of ``mode`` with the highest median orders/s."""
    found = [r for r in rows if r.mode == mode]
    return max(found, key=lambda r: r.per_s) if found else None


def throughput_table(rows: Sequence[Row]) -> str:
    """Orders/s, median (min-max), a column per mode and a row per batch size, with
    what the lock costs: the lockless median over each locked mode's."""
    modes = [m for m in MODES if any(r.mode == m for r in rows)]
    by = {(r.mode, r.batch): r for r in rows}
    locked = [m for m in modes if m != "none"]
    head = ["batch", *(f"{m} orders/s" for m in modes)]
    if "none" in modes:
        head += [f"none / {m}" for m in locked]
    lines = [_cells(head), _cells(["--:"] * len(head))]
    for batch in sorted({r.batch for r in rows}):
        cells = [str(batch)]
        for mode in modes:
            row = by.get((mode, batch))
            cells.append("-" if row is None else _rate(row))
        if "none" in modes:
            for mode in locked:
                a, b = by.get(("none", batch)), by.get((mode, batch))
                cells.append("-" if a is None or b is None else f"{a.per_s / b.per_s:.2f}x")
        lines.append(_cells(cells))
    return "\n".join(lines)


def split_table(rows: Sequence[Row]) -> str:
    """Per mode and batch size: the time per batch and its parts (ms), the row time
    per order and the CPU per order of each process (µs), medians over the rounds."""
    head = [
        "mode",
        "batch",
        "batch ms",
        "lock",
        "SQL",
        "settle",
        "other",
        "queued",
        "SQL µs/order",
        "CPU µs/order: bench",
        "PostgreSQL",
        "Redis",
    ]
    lines = [_cells(head), _cells(["---", *["--:"] * (len(head) - 1)])]
    for r in rows:
        lines.append(
            _cells(
                [
                    r.mode,
                    str(r.batch),
                    f"{r.batch_ms:.2f}",
                    f"{r.lock_ms:.2f}",
                    f"{r.sql_ms:.2f}",
                    f"{r.settle_ms:.2f}",
                    f"{r.other_ms:.2f}",
                    f"{r.queued_ms:.2f}",
                    f"{r.row_us:.1f}",
                    f"{r.cpu_us:.1f}",
                    _optional(r.pg_cpu_us),
                    _optional(r.redis_cpu_us),
                ]
            )
        )
    return "\n".join(lines)


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _per_order(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    """The median µs per order, or None when any drain could not read that CPU."""
    if any(cpu is None for cpu, _ in pairs):
        return None
    return statistics.median((cpu or 0.0) / orders * 1e6 for cpu, orders in pairs)


def _rate(row: Row) -> str:
    return f"{row.per_s:,.0f} ({row.per_s_min:,.0f}-{row.per_s_max:,.0f})"


def _optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cells(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
