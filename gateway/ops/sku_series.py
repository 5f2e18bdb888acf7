"""The series labelled by sku, kept to the active skus, and the live sale's own.

The reconciler's passes visit the active skus alone
(``gateway.postgres.inventory.ACTIVE``); whatever it no longer visits (idle
or archived) has its series removed here, so the metrics cost what the sales
being run cost, not every sku ever created.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    from gateway.domain.skus import SkuState


class SkuSeries:
    """Every series labelled by sku, kept to the active skus, and the live sale's
    own: stock on sale, held and sold per sku (set by each reconcile pass) and
    its 201s (counted as they are answered). A sku's series are removed
    (prometheus_client's ``remove``) once a pass finds it idle or archived,
    so /metrics grows with the sales being run, not with every sku ever sold.
    With several workers prometheus_client cannot remove a series from its
    shared files: there they stay until the workers restart."""

    def __init__(self, r: CollectorRegistry, *, removable: bool) -> None:
        self._removable = removable
        self.on_sale = Gauge(
            "flashsale_sku_on_sale",
            "Units of an active sku on sale: the database's stock, pending included.",
            ["sku"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.held = Gauge(
            "flashsale_sku_held",
            "Units of an active sku held for payment.",
            ["sku"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.sold = Gauge(
            "flashsale_sku_sold",
            "Units of an active sku in committed orders.",
            ["sku"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.confirmed = Counter(
            "flashsale_sku_confirmed",
            "Purchases of an active sku answered 201 (rate() gives the live sale's pace).",
            ["sku"],
            registry=r,
        )
        self._confirmed: dict[str, Counter] = {}
        self._families: list[Gauge | Counter] = [self.on_sale, self.held, self.sold, self.confirmed]
        self._skus: set[str] = set()

    def labelled(self, *families: Gauge | Counter) -> None:
        """``families`` (labelled by sku alone) are kept to the active skus too."""
        self._families.extend(families)

    def seen(self, sku: str) -> None:
        """A series of ``sku`` was written."""
        self._skus.add(sku)

    def purchase_confirmed(self, sku: str) -> None:
        """A purchase of ``sku`` was answered 201."""
        child = self._confirmed.get(sku)
        if child is None:
            child = self._confirmed[sku] = self.confirmed.labels(sku)
            self._skus.add(sku)
        child.inc()

    def sale(self, state: SkuState) -> None:
        """An active sku's stock on sale, units held and units sold."""
        self.on_sale.labels(state.sku).set(state.stock)
        self.held.labels(state.sku).set(state.held)
        self.sold.labels(state.sku).set(state.sold)
        self._skus.add(state.sku)

    def retain(self, skus: Collection[str]) -> None:
        """Remove the series of every sku but ``skus`` (the active ones)."""
        gone = self._skus.difference(skus)
        self._skus.difference_update(gone)
        for sku in gone:
            self._confirmed.pop(sku, None)
            if self._removable:
                for family in self._families:
                    family.remove(sku)
