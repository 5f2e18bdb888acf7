"""Where a waiting room's ticket stands, as the room's scripts answer it
(``gateway.redis.rooms``) and the admissions decide on it. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum


class StandingStatus(StrEnum):
    """Where a ticket stands: a room script's answer's first element, as written
    in ``lua/room_join.lua`` and ``lua/room_poll.lua``."""

    UNKNOWN = "unknown"  # poll: no such ticket (or it expired)
    SOLD_OUT = "sold_out"  # the sku is exhausted
    WAITING = "waiting"
    ADMITTED = "admitted"  # poll: let in; its admission token may be signed
    BOT_CHECK = "bot_check"  # join: a new ticket needs a bot token that passed
    REUSED = "reused"  # join: that bot token made a ticket before


# The script's raw status to its member: one dict lookup, no Enum call.
STANDING_STATUSES: dict[str, StandingStatus] = {status.value: status for status in StandingStatus}


class Exhausted(Enum):
    """What a join or poll makes of an exhausted sku (no stock, nothing pending);
    the value is the room script's ARGV."""

    # Sold out: the join or poll answers SOLD_OUT.
    SOLD_OUT = 0
    # Units are held for payment and may come back: the line stays, and is let
    # in only while there is stock.
    HELD = 1


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a ticket stands: waiting at ``position`` (1 is next), or admitted at
    ``admitted_ms`` (Redis time); ``admitted_now`` people were let in by this call."""

    status: StandingStatus
    ticket: str = ""
    user_id: str = ""
    position: int = 0
    admitted_ms: int = 0
    admitted_now: int = 0
    waiting: int = 0
