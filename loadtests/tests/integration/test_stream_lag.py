"""The stack bench's delivery lags, read from a real stream after the window:
each entry's id (Redis's clock at the append) less its ``occurred_at``, only
the window's events, every entry read whatever the stream's length."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.typing import EncodableT, FieldT

from loadtests.lib import stream_lag
from testkit.services import REDIS_URL

# 2026-12-07T12:00:00Z in epoch ms: the entries' ids count from here.
T0_MS = 1_796_644_800_000


def _iso(ms: int) -> str:
    """``occurred_at`` as the events carry it (RFC 3339, milliseconds, UTC)."""
    seconds, milli = divmod(ms - T0_MS, 1000)
    return f"2026-12-07T12:{seconds // 60:02d}:{seconds % 60:02d}.{milli:03d}Z"


@pytest.fixture
def stream() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(REDIS_URL)
    key = f"tlag{uuid.uuid4().hex[:8]}:events"
    yield client, key
    client.delete(key)
    client.close()


def test_each_lag_is_the_entry_ids_ms_less_its_occurred_at(
    stream: tuple[redis.Redis, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up's entry and one after the window are left out, an entry without
    ``occurred_at`` too; the window's lags are exact to the ms, read in calls of
    two entries."""
    client, key = stream
    monkeypatch.setattr(stream_lag, "READ_COUNT", 2)
    appended = [
        (T0_MS + 5, T0_MS + 1),  # occurred before the window: a warm-up's
        (T0_MS + 1_020, T0_MS + 1_000),
        (T0_MS + 1_031, T0_MS + 1_030),
        (T0_MS + 1_500, T0_MS + 1_250),
        (T0_MS + 1_600, None),
        (T0_MS + 2_040, T0_MS + 2_000),
        (T0_MS + 9_000, T0_MS + 8_000),  # occurred after the window
    ]
    for id_ms, occurred_ms in appended:
        fields: dict[FieldT, EncodableT] = (
            {"event_id": "e"} if occurred_ms is None else {"occurred_at": _iso(occurred_ms)}
        )
        client.xadd(key, fields, id=f"{id_ms}-0")
    lags = stream_lag.read_lags(REDIS_URL, key, (T0_MS + 1_000) / 1000, (T0_MS + 5_000) / 1000)
    assert sorted(lags) == [1.0, 20.0, 40.0, 250.0]


def test_a_stream_that_is_not_there_has_no_lags(stream: tuple[redis.Redis, str]) -> None:
    """A round that appended nothing reads nothing."""
    _client, key = stream
    assert stream_lag.read_lags(REDIS_URL, key, T0_MS / 1000, T0_MS / 1000 + 10) == []
