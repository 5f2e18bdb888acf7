"""One row of the comparison (``loadtests.compare``): every gateway's ``/metrics``
added up, and :func:`measure`, which makes the row from a round's raw wrk results,
its books and those metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtests.lib.compare_round import Options, Round
from loadtests.lib.targets import Target
from testkit.http import http
from testkit.metrics import samples


def scrape_all(gateways: Sequence[Target]) -> dict[str, float]:
    """Every gateway's /metrics samples, added up series by series."""
    merged: dict[str, float] = {}
    for gateway in gateways:
        try:
            status, text = http("GET", f"{gateway.url}/metrics", timeout=5.0)
        except OSError:
            continue
        if status == 200 and isinstance(text, str):
            for series, value in samples(text).items():
                merged[series] = merged.get(series, 0.0) + value
    return merged


def measure(
    rnd: Round, opts: Options, raw: dict[str, Any], books: dict[str, Any], found: dict[str, float]
) -> dict[str, Any]:
    """One row of the comparison from a round's raw results, books and metrics."""
    statuses: dict[str, int] = {}
    for result in raw["raws"]:
        for status, count in result["statuses"].items():
            statuses[str(status)] = statuses.get(str(status), 0) + int(count)
    requests = sum(int(r["requests"]) for r in raw["raws"])
    observed = next(i for i, g in enumerate(rnd.gateways) if g is not rnd.stopped)
    seen = raw["raws"][observed]
    # A gateway that completed nothing in the round has no latency to speak of.
    latency = {
        q: seen["latency_us"][k] / 1000 if seen["requests"] else None for q, k in LATENCY_KEYS
    }
    sold, db_stock = books["sold"], books["db_stock"]
    sold_in = next((t for t, n in raw["sold_curve"] if n >= sold), raw["elapsed_s"])
    unavailable = _series(found, "flashsale_purchases_total", "outcome").get("unavailable", 0.0)
    return {
        "strategy": rnd.strategy,
        "lock": rnd.lock,
        "condition": rnd.condition,
        "fault": raw["fault"],
        "stock": opts.stock,
        "requests": requests,
        "statuses": statuses,
        "confirmed": sold,
        "confirmed_per_s": round(sold / sold_in, 1) if sold and sold_in > 0 else 0.0,
        "latency_ms": latency,
        "lock_wait_ms": {
            "mean": _mean_ms(found, "flashsale_lock_wait_seconds"),
            "p99": _quantile_ms(found, "flashsale_lock_wait_seconds", 0.99),
        },
        "locks_lost": found.get("flashsale_locks_lost_total", 0.0),
        "fenced_out": found.get("flashsale_fenced_out_total", 0.0),
        "flush_failures": _series(found, "flashsale_flush_failures_total", "reason"),
        "failure_rate": round(unavailable / requests, 4) if requests else 0.0,
        "retries": sum(
            v
            for k, v in found.items()
            if "retries" in (name := k.partition("{")[0]) and not name.endswith("_created")
        ),
        "oversell": max(0, sold - opts.stock),
        "unsold": db_stock,
        "lost": opts.stock - sold - db_stock,
        "pending_left": books["pending_left"],
        "audit_exit": books["audit_exit"],
    }


LATENCY_KEYS = (("p50", "p50"), ("p99", "p99"), ("p99.9", "p999"))


def _series(found: dict[str, float], name: str, label: str) -> dict[str, float]:
    """``name``'s samples by the value of ``label``."""
    out: dict[str, float] = {}
    marker = f'{label}="'
    for series, value in found.items():
        if series.startswith(name + "{") and marker in series:
            key = series.split(marker, 1)[1].split('"', 1)[0]
            out[key] = out.get(key, 0.0) + value
    return out


def _mean_ms(found: dict[str, float], name: str) -> float:
    count = found.get(f"{name}_count", 0.0)
    return round(found.get(f"{name}_sum", 0.0) / count * 1000, 3) if count else 0.0


def _quantile_ms(found: dict[str, float], name: str, q: float) -> float:
    """The upper bound of the histogram bucket holding the ``q`` quantile, in ms."""
    buckets = sorted(
        (float(le), count)
        for le, count in _series(found, f"{name}_bucket", "le").items()
        if le != "+Inf"
    )
    total = found.get(f"{name}_count", 0.0)
    if not total:
        return 0.0
    for le, count in buckets:
        if count >= q * total:
            return le * 1000
    return float("inf")
