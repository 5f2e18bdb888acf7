"""What this instance cannot serve of the skus configured, and why.

A setting can leave a configured sku unservable: a waiting room's admission
tokens are signed with ``GATEWAY_ADMISSION_SECRET``, and a room that checks
for bots asks the provider at ``GATEWAY_BOT_CHECK_URL``. Such a configuration is
refused when it is made (``PUT /admin/skus/{sku}`` answers 422
``not_configured``), not when a buyer meets it. One that reaches this instance
anyway (put through another instance, or stored before this one lost the
setting) is logged as an error at start-up and listed in ``/readyz``'s body;
its buyers get 503 with the reason.

Readiness is not refused for it. The instances of a deployment share their
settings, so a refusal would take every instance out of the balancer, and with
them every other sku, for one sku's missing setting; answering keeps the rest
selling while the log line and ``/readyz`` name the mistake. A setting that
leaves no sku servable (the ZooKeeper flush lock without kazoo, or without
hosts) stops the start instead (``gateway.settings``, ``gateway.resources``).
"""

from __future__ import annotations

import structlog

from gateway.domain.errors import NotConfigured, PostgresUnavailable
from gateway.domain.model import WaitingRoom
from gateway.settings import Settings
from gateway.usecases.ports import RoomSkus

# Skus listed in /readyz at most: a few name the mistake; thousands would cost every probe.
SHOWN = 20
NO_SECRET = "waiting room: GATEWAY_ADMISSION_SECRET is not set on this instance"
NO_PAYMENT_TOKEN = "payment window: GATEWAY_PAYMENT_TOKEN is not set on this instance"
NO_BOT_CHECK = "bot check: GATEWAY_BOT_CHECK_URL is not set on this instance"

log = structlog.get_logger(__name__)


class Servability:
    """Checks sku configurations against this instance's settings."""

    def __init__(self, settings: Settings, inventory: RoomSkus) -> None:
        self._signs = settings.admission_secret is not None
        self._pays = settings.payment_token is not None
        self._checks_bots = settings.bot_check_url is not None
        self._inventory = inventory

    def check(self, room: WaitingRoom | None, payment_window_s: int | None = None) -> None:
        """Refuse a sku configuration this instance could not serve; raises
        :class:`NotConfigured`."""
        if room is not None and not self._signs:
            raise NotConfigured(f"{NO_SECRET}: its admission tokens could not be signed")
        if room is not None and room.bot_check and not self._checks_bots:
            raise NotConfigured(f"{NO_BOT_CHECK}: nobody's bot token could be checked")
        if payment_window_s and not self._pays:
            raise NotConfigured(f"{NO_PAYMENT_TOKEN}: nobody could pay its orders")

    async def unservable(self) -> dict[str, str]:
        """The configured skus this instance cannot serve (at most ``SHOWN``), with
        why; no I/O when it has every setting a sku may need. Empty when PostgreSQL cannot say: the
        readiness probe's own ping reports that."""
        if self._signs and self._checks_bots:
            return {}
        try:
            if not self._signs:
                return dict.fromkeys(await self._inventory.waiting_room_skus(SHOWN), NO_SECRET)
            return dict.fromkeys(await self._inventory.bot_check_skus(SHOWN), NO_BOT_CHECK)
        except PostgresUnavailable:
            return {}

    async def report(self) -> None:
        """Log each configured sku this instance cannot serve as an error (at start-up)."""
        for sku, reason in (await self.unservable()).items():
            log.error("sku_unservable", sku=sku, reason=reason)
