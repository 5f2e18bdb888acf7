"""A sku as the reconciler, the metrics and the admin routes see it, beside
its settings (:class:`gateway.domain.model.SkuSettings`): what the inventory
rows say (``gateway.postgres.inventory`` reads them). No I/O here."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import NamedTuple

from gateway.domain.model import SkuSettings


class SkuState(NamedTuple):
    """A sku as the reconciler and the per-sku metrics see it (``SKU_STATE``)."""

    sku: str
    stock: int  # units on sale (the database's)
    held: int  # units held for payment
    sold: int  # units in committed orders
    updated_at: datetime  # the row's last change, which idleness is tied to
    archived: bool
    active: bool


class SkuListing(NamedTuple):
    """One sku of ``GET /admin/skus``."""

    sku: str
    stock: int
    archived_at: datetime | None
    active: bool

    @property
    def status(self) -> str:
        """``archived``, else ``active`` or ``idle``."""
        if self.archived_at is not None:
            return "archived"
        return "active" if self.active else "idle"


class SkuSheet(NamedTuple):
    """A sku as ``GET /admin/skus/{sku}`` shows it: its settings, its status,
    the units of its live orders by status, and those refunded without restock."""

    settings: SkuSettings
    listing: SkuListing
    confirmed: int  # units of orders final at their 201 (no payment window)
    paid: int
    held: int  # units of orders pending payment
    # Units of orders refunded without restock: out of stock for good, in no
    # live order (the audit counts them with the sold).
    refunded_not_restocked: int


class IfMissing(Enum):
    """What an admin change does with a sku that is not there: ``PUT`` creates
    it (and lists an archived one again), ``PATCH`` refuses (``UnknownSku``)."""

    CREATE = "create"
    REFUSE = "refuse"


class SkuChange(NamedTuple):
    """A sku's settings before and after an admin change."""

    # None for a sku created by the change.
    before: SkuSettings | None
    after: SkuSettings
    # A PUT listed an archived sku again.
    unarchived: bool = False
