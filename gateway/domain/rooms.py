"""Where a waiting room's ticket stands, as the room's scripts answer it
(``gateway.redis.rooms``) and the admissions decide on it. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["unknown", "sold_out", "waiting", "admitted", "bot_check", "reused"]


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a ticket stands: waiting at ``position`` (1 is next), or admitted at
    ``admitted_ms`` (Redis time); ``admitted_now`` people were let in by this call."""

    status: Status
    ticket: str = ""
    user_id: str = ""
    position: int = 0
    admitted_ms: int = 0
    admitted_now: int = 0
    waiting: int = 0
