"""What the wrk bench measures: its two paths, their skus, and the targets of each."""

from __future__ import annotations

SOLD_OUT, IN_STOCK = "sold_out", "in_stock"
SOLD_OUT_SKU, IN_STOCK_SKU = "bench-soldout", "bench-instock"
# "nometrics" is the gateway with GATEWAY_METRICS=false: what the metrics cost.
TARGETS = ("bare", "gateway", "nometrics", "naive")
PATH_TARGETS = {
    SOLD_OUT: ("bare", "gateway", "nometrics", "naive"),
    IN_STOCK: ("gateway", "nometrics", "naive"),
}
WRITERS = ("gateway", "nometrics", "naive")
SKU_OF = {SOLD_OUT: SOLD_OUT_SKU, IN_STOCK: IN_STOCK_SKU}
