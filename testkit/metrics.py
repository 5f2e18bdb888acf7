"""Prometheus exposition text, as the gateway's ``/metrics`` serves it, read back."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp


def samples(text: str) -> dict[str, float]:
    """Every sample of ``text``: ``name{labels}`` (as written) -> value.

    Comment lines and lines whose value is not a number are left out.
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            found[series] = float(value)
        except ValueError:
            continue
    return found


def metric(found: Mapping[str, float], name: str) -> float:
    """Sum of every sample of ``name`` (all label sets) in :func:`samples` output."""
    return sum(v for k, v in found.items() if k == name or k.startswith(name + "{"))


def totals(text: str, prefix: str = "flashsale_") -> dict[str, float]:
    """Every metric named ``prefix*``: name -> value summed over its label sets."""
    values: dict[str, float] = {}
    for series, value in samples(text).items():
        if series.startswith(prefix):
            name = series.partition("{")[0]
            values[name] = values.get(name, 0.0) + value
    return values


async def scrape(base_url: str, within: float = 3.0) -> dict[str, float]:
    """``GET {base_url}/metrics`` as :func:`samples`."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as http,
        http.get(f"{base_url}/metrics") as response,
    ):
        return samples(await response.text())
