"""What this instance cannot serve of the skus configured, and why.

A setting can leave a configured sku unservable: a waiting room's admission
tokens are signed with ``GATEWAY_ADMISSION_SECRET``. Such a configuration is
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
from gateway.postgres.inventory import Inventory
from gateway.settings import Settings

# Skus listed in /readyz at most: a few name the mistake; thousands would cost every probe.
SHOWN = 20
NO_SECRET = "waiting room: GATEWAY_ADMISSION_SECRET is not set on this instance"

log = structlog.get_logger(__name__)


class Servability:
    """Checks sku configurations against this instance's settings."""

    def __init__(self, settings: Settings, inventory: Inventory) -> None:
        self._signs = settings.admission_secret is not None
        self._inventory = inventory

    def check(self, room: WaitingRoom | None) -> None:
        """Refuse a sku configuration this instance could not serve; raises
        :class:`NotConfigured`."""
        if room is not None and not self._signs:
            raise NotConfigured(f"{NO_SECRET}: its admission tokens could not be signed")

    async def unservable(self) -> dict[str, str]:
        """The configured skus this instance cannot serve (at most ``SHOWN``), with
        why; no I/O when it can serve any. Empty when PostgreSQL cannot say: the
        readiness probe's own ping reports that."""
        if self._signs:
            return {}
        try:
            skus = await self._inventory.waiting_room_skus(SHOWN)
        except PostgresUnavailable:
            return {}
        return dict.fromkeys(skus, NO_SECRET)

    async def report(self) -> None:
        """Log each configured sku this instance cannot serve as an error (at start-up)."""
        for sku, reason in (await self.unservable()).items():
            log.error("sku_unservable", sku=sku, reason=reason)
