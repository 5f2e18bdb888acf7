"""What the wrk bench measures: its paths, their skus, and the targets of each.

* ``sold_out``: a sku that sold ``SMALL_SALE`` units, then ran out;
* ``big_sold_out``: a sku that sold ``BENCH_BIG_STOCK`` units (200,000 by
  default) to new users, then ran out: the sold-out answer must not get slower,
  or fatter, as the sale gets bigger;
* ``in_stock``: every request a new user on a sku with millions of units.
"""

from __future__ import annotations

SOLD_OUT, BIG_SOLD_OUT, IN_STOCK = "sold_out", "big_sold_out", "in_stock"
SOLD_OUT_SKU, BIG_SKU, IN_STOCK_SKU = "bench-soldout", "bench-bigsale", "bench-instock"
SMALL_SALE = 10
# "nometrics" is the gateway with GATEWAY_METRICS=false: what the metrics cost.
# "bare_min" parses the body only; "bare" also validates it as the gateway does.
# Ratios are taken to bare_min, the reference of issue 14's targets.
TARGETS = ("bare_min", "bare", "gateway", "nometrics", "naive")
REFERENCE, VALIDATING = "bare_min", "bare"
PATH_TARGETS = {
    SOLD_OUT: ("bare_min", "bare", "gateway", "nometrics", "naive"),
    BIG_SOLD_OUT: ("gateway",),
    IN_STOCK: ("gateway", "nometrics", "naive"),
}
WRITERS = ("gateway", "nometrics", "naive")
SKU_OF = {SOLD_OUT: SOLD_OUT_SKU, BIG_SOLD_OUT: BIG_SKU, IN_STOCK: IN_STOCK_SKU}
# The open-loop latency runs (loadtests.lib.bench_openloop): which targets per path,
# each at these shares of its own closed-loop maximum from the same run.
OPEN_TARGETS = {
    SOLD_OUT: ("bare_min", "gateway"),
    IN_STOCK: ("gateway", "naive"),
}
OPEN_LOADS = (0.5, 0.8)
