"""One wrk run of a bench path against a target (``loadtests.bench`` and the
benches built on it): the target's CPU time per request, and what the
gateway's counters did meanwhile."""

from __future__ import annotations

import time

from loadtests.lib import wrk
from loadtests.lib.bench_config import Config
from loadtests.lib.bench_paths import SKU_OF
from loadtests.lib.cputime import cpu_seconds
from loadtests.lib.pinning import Pinning
from loadtests.lib.targets import Target


def drive(
    target: Target, path: str, round_: int, seconds: float, config: Config, tag: str
) -> wrk.WrkResult:
    """One wrk run of ``path`` against ``target`` (see :func:`measured`), with what
    the gateway's counters did meanwhile."""
    before = target.scrape()
    result = measured(
        target,
        path,
        round_,
        seconds,
        tag=tag,
        connections=config.connections,
        threads=config.threads,
        pinning=config.pinning,
    )
    if before:
        result.extra["metrics"] = metrics_delta(before, target.scrape())
    return result


def measured(
    target: Target,
    path: str,
    round_: int,
    seconds: float,
    *,
    tag: str,
    connections: int,
    threads: int,
    pinning: Pinning,
) -> wrk.WrkResult:
    """One wrk run of ``path`` against ``target``, with the target's CPU time per
    request; fails if the target died."""
    started = time.time()
    cpu_before = cpu_seconds(target.pid)
    raw = wrk.run(
        target.url,
        sku=SKU_OF[path],
        tag=tag,
        duration_s=seconds,
        connections=connections,
        threads=threads,
        pinning=pinning,
    )
    if target.process.poll() is not None:
        raise RuntimeError(f"{target.name} died under load:\n{target.log_tail()}")
    result = wrk.to_result(target.name, path, round_, raw, started)
    if result.requests:
        spent = cpu_seconds(target.pid) - cpu_before
        result.extra["cpu_us_per_request"] = round(spent / result.requests * 1e6, 1)
    return result


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the gateway's counters and histograms did during one run.

    Adds mean batch size, mean flush time and mean lock wait when the gateway
    exports those histograms; only what changed is kept.
    """
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    for name, key, scale in (
        ("flashsale_batch_size", "mean_batch_size", 1.0),
        ("flashsale_flush_duration_seconds", "mean_flush_ms", 1000.0),
        ("flashsale_lock_wait_seconds", "mean_lock_wait_ms", 1000.0),
    ):
        count = delta.get(f"{name}_count", 0.0)
        if count:
            delta[key] = round(scale * delta.get(f"{name}_sum", 0.0) / count, 3)
    return delta
