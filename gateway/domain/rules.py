"""A sku's sale rules: its window and its rate limits. Pure: parsing and values.

The window is ``starts_at``/``ends_at`` (RFC 3339 in the API, ``timestamptz`` in
PostgreSQL, milliseconds since the epoch in ``lua/reserve.lua``, which decides
it against Redis ``TIME``: one clock for every instance). A rate is a token
bucket, written ``N/s:burst`` (``5/s:10``: five tokens a second, ten at most);
``off`` on a sku switches off the instance-wide default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import NamedTuple

# "5/s:10", "0.5/s:1": tokens per second, then the bucket's size.
_RATE = re.compile(r"(\d+(?:\.\d+)?)/s:(\d+)")
OFF = "off"


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: ``per_s`` tokens a second, at most ``burst`` saved up."""

    per_s: float
    burst: int

    def __str__(self) -> str:
        return f"{self.per_s:g}/s:{self.burst}"


def parse_rate(text: str) -> Rate:
    """``"N/s:burst"`` as a :class:`Rate`; raises ValueError on anything else."""
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ValueError("must be N/s:burst, for example 5/s:10")
    per_s, burst = float(match[1]), int(match[2])
    if not (0 < per_s < 1e6 and 1 <= burst < 1e6):
        raise ValueError("rate and burst must be positive and below a million")
    return Rate(per_s, burst)


# The instants every layer can hold, the offset applied: Python's datetime
# stops at years 1 and 9999 (an offset past either end, or a conversion to UTC
# or to the epoch, raises), PostgreSQL's timestamptz before year 1 is BC, which
# asyncpg cannot read back. A sale's window lies well inside.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
_INSTANT = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)", re.ASCII)
_RANGE = "between 2000-01-01T00:00:00Z and 9999-12-31T23:59:59Z"


def parse_instant(text: str) -> datetime:
    """An RFC 3339 date-time with its offset (``Z`` or ``+hh:mm``) as an aware
    datetime in UTC, between :data:`EARLIEST` and :data:`LATEST`; raises
    ValueError for anything else, a naive time included."""
    # RFC 3339 allows a lower-case "t"/"z" and a space for "T"; fromisoformat
    # takes all of these from Python 3.11, but not a missing offset. ASCII
    # digits only: \d would take any script's digits, which fromisoformat refuses.
    if not _INSTANT.fullmatch(text):
        raise ValueError("must be an RFC 3339 date-time with an offset")
    try:
        instant = datetime.fromisoformat(text.upper().replace(" ", "T")).astimezone(UTC)
    except (ValueError, OverflowError):
        # A date that does not exist (February 30th), or one the offset takes
        # past year 1 or 9999.
        raise ValueError(f"must be a real date-time {_RANGE}") from None
    if not EARLIEST <= instant <= LATEST:
        raise ValueError(f"must be {_RANGE}")
    return instant


def rfc3339(instant: datetime) -> str:
    """An instant as the API shows it: UTC, milliseconds, ``Z``."""
    return instant.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_ms(instant: datetime | None) -> int | None:
    """Milliseconds since the epoch (what reserve.lua compares with TIME)."""
    return None if instant is None else math.floor(instant.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class SaleRules:
    """A sku's window and its own rates: None keeps the instance's default rate,
    the string ``off`` switches it off for this sku."""

    starts_at: datetime | None = None
    ends_at: datetime | None = None
    user_rate: Rate | str | None = None
    client_rate: Rate | str | None = None

    def window_json(self) -> dict[str, str | None]:
        """The window as ``GET /v1/skus/{sku}`` shows it."""
        return {
            "starts_at": None if self.starts_at is None else rfc3339(self.starts_at),
            "ends_at": None if self.ends_at is None else rfc3339(self.ends_at),
        }


# A sku with no window and the instance's default rates.
NO_RULES = SaleRules()


def effective(own: Rate | str | None, default: Rate | None) -> Rate | None:
    """The rate that applies: the sku's own, else the default; None when off."""
    if own is None:
        return default
    return own if isinstance(own, Rate) else None


def rate_from_db(text: str | None) -> Rate | str | None:
    """A rate column back into a rule (the admin API validated it when written)."""
    if text is None or text == OFF:
        return text
    return parse_rate(text)


# What sale_gate() takes and answers (gateway.postgres.sale_gate), for the
# strategies that decide in PostgreSQL alone (gateway.usecases.sale_gate).


class Bucket(NamedTuple):
    """A rate-limit bucket as ``sale_gate()`` takes it."""

    # 'u:<user>' or 'c:<address>'.
    name: str
    per_s: float
    burst: int


class GateDecision(StrEnum):
    """What ``sale_gate()`` decided for one purchase (its ``verdict``, as the
    function spells it)."""

    PASS = "pass"
    NOT_STARTED = "not_started"
    ENDED = "ended"
    RATE_LIMITED = "rate_limited"


# sale_gate()'s raw verdict to its member: one dict lookup, no Enum call.
GATE_DECISIONS: dict[str, GateDecision] = {d.value: d for d in GateDecision}


class GateAnswer(NamedTuple):
    """What ``sale_gate()`` answered for one purchase."""

    verdict: GateDecision
    # "not_started", "rate_limited": how long until trying again makes sense.
    wait_ms: int
