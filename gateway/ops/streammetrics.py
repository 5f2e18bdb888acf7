"""The queue strategy's metrics: its streams' length and pending entries, reclaims,
and the writers' batches (gateway/write/writer.py).

:class:`StreamFamilies` implements the writers' observer (``gateway.write.writer.WriterObserver``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class StreamFamilies:
    """The queue strategy's metric families in one registry; the writers' observer."""

    def __init__(self, r: CollectorRegistry, batch: tuple[int, ...]) -> None:
        self.stream_length = Gauge(
            "flashsale_stream_length",
            "Queued purchases in a sku's stream, read or not (sampled by its writers).",
            ["sku"],
            registry=r,
            multiprocess_mode="max",
        )
        self.stream_pending = Gauge(
            "flashsale_stream_pending",
            "Stream entries a writer has read and not yet acknowledged.",
            ["sku"],
            registry=r,
            multiprocess_mode="max",
        )
        self.stream_reclaims = Counter(
            "flashsale_stream_reclaimed",
            "Stream entries claimed from a writer presumed dead (XAUTOCLAIM).",
            registry=r,
        )
        self.writer_batches = Counter(
            "flashsale_writer_batches",
            "Batches of stream entries a writer committed, or failed to.",
            ["result"],
            registry=r,
        )
        self.writer_batch_size = Histogram(
            "flashsale_writer_batch_size",
            "Stream entries per committed writer batch.",
            buckets=batch,
            registry=r,
        )

    def writer_batch(self, size: int, failed: bool) -> None:
        """A writer committed a batch of ``size`` entries, or failed one."""
        self.writer_batches.labels("failed" if failed else "committed").inc()
        if not failed:
            self.writer_batch_size.observe(size)

    def stream_reclaimed(self, count: int) -> None:
        """A writer claimed ``count`` entries of a dead one."""
        self.stream_reclaims.inc(count)

    def stream_depth(self, sku: str, length: int, pending: int) -> None:
        """A sku's stream length and pending entries, as a writer sampled them."""
        self.stream_length.labels(sku).set(length)
        self.stream_pending.labels(sku).set(pending)
