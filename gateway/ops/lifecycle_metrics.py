"""Metrics of the order lifecycle after the 201 (``gateway.usecases.lifecycle``).

Kept apart from ``gateway.ops.metrics``, whose observers are the purchase's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# From a deadline to the unit back on sale: the contract is 1 s at p99.
RETURN_LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)


class LifecycleMetrics:
    """Orders closed by status, orders and units held for payment, and the return lag."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._closed = Counter(
            "flashsale_orders_closed",
            "Orders this gateway closed (out of pending_payment, or refunded), by the status"
            " they took.",
            ["status"],
            registry=r,
        )
        self._late_payments = Counter(
            "flashsale_late_payments",
            "Payments refused after their order expired or was cancelled (listed for refund).",
            registry=r,
        )
        self._late_refunded = Counter(
            "flashsale_late_payments_refunded",
            "Late payments this gateway marked refunded.",
            registry=r,
        )
        self._pending = Gauge(
            "flashsale_orders_pending_payment",
            "Orders waiting for their payment (PostgreSQL, sampled by the sweep).",
            registry=r,
            multiprocess_mode="max",
        )
        self._held = Gauge(
            "flashsale_units_held",
            "Units held for orders waiting for their payment (sampled by the sweep).",
            registry=r,
            multiprocess_mode="max",
        )
        self._return_lag = Histogram(
            "flashsale_order_return_lag_seconds",
            "From an expired order's deadline to its units back on sale.",
            buckets=RETURN_LAG_BUCKETS,
            registry=r,
        )

    def closed(self, status: str, count: int = 1) -> None:
        """``count`` orders left pending_payment as ``status``."""
        self._closed.labels(status).inc(count)

    def late_payment(self) -> None:
        """A payment came after its order closed."""
        self._late_payments.inc()

    def late_refunded(self) -> None:
        """A late payment was marked refunded."""
        self._late_refunded.inc()

    def sample(self, pending: int, units: int) -> None:
        """Orders pending payment now, and the units they hold."""
        self._pending.set(pending)
        self._held.set(units)

    def returned(self, lag_s: float) -> None:
        """An expired order's units are back on sale ``lag_s`` after its deadline."""
        self._return_lag.observe(lag_s)
