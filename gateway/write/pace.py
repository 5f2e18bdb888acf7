"""A sku's pace: a moving average of its gaps, read by the batcher and the flusher.

The batcher averages the gaps between a sku's arrivals, to make a batch wait
only when another purchase is due within the wait; the flusher averages the gaps
between its sku's backlog running empty and flushing again, to keep the sku's lock only
when the next flush is due within the slice.
"""

from __future__ import annotations

# Weight of the newest gap in the moving average.
GAP_WEIGHT = 0.25


def averaged(average: float, gap: float) -> float:
    """The moving average after one more ``gap``; ``gap`` itself after none
    (an average of ``inf``)."""
    if average == float("inf"):
        return gap
    return average + GAP_WEIGHT * (gap - average)
