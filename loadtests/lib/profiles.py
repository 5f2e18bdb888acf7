"""The Locust profiles: which user classes of ``locustfile.py`` make up each one.

Kept apart from the locustfile because importing Locust monkey-patches the
whole process with gevent; ``locust_run`` and the smoke test only need names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    """One load scenario: its user classes and how many users, how fast."""

    name: str
    user_classes: tuple[str, ...]
    users: int
    spawn_rate: float
    description: str


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "flash_crowd",
            ("FlashCrowdUser",),
            users=200,
            # Everyone within the first second: a flash sale has no ramp.
            spawn_rate=200,
            description="every user a new shopper buying the flash sku until it sells out",
        ),
        Profile(
            "sold_out_storm",
            ("SoldOutStormUser",),
            users=100,
            spawn_rate=100,
            description="buyers hammering a sku with no stock (409 sold_out expected)",
        ),
        Profile(
            "duplicate_clickers",
            ("DuplicateClickerUser",),
            users=50,
            spawn_rate=50,
            description="each shopper sends one request id 5 times at once: one order at most",
        ),
        Profile(
            "restock_mid_sale",
            ("RestockBuyerUser", "RestockAdminUser"),
            users=51,
            spawn_rate=51,
            description="buyers on a small stock while an admin restocks it every second",
        ),
        Profile(
            "mixed_browse_buy",
            ("MixedBrowseUser",),
            users=100,
            spawn_rate=50,
            description="GET /v1/skus/{sku} five times as often as purchases",
        ),
        Profile(
            "waiting_room",
            ("WaitingRoomUser",),
            users=200,
            spawn_rate=200,
            description="the waiting-room page's calls at its pace: page, sku, join, polls, buy",
        ),
    )
}
