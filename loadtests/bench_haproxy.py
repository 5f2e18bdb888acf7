"""One hot sku behind the shipped balancer: one gateway against two, through HAProxy.

``python -m loadtests.bench_haproxy [--rounds 5] [--duration 3]`` starts, on the
shared Redis:

* ``direct_g1``: one gateway process, wrk straight at it (the reference: what
  the balancer costs);
* ``haproxy_g1``: one gateway process behind ``deploy/haproxy.cfg`` (the file
  compose mounts, through ``testkit.haproxy``; the gateway is both ``gw1`` and
  ``gw2``);
* ``haproxy_g2``: two gateway processes behind it, on one database and one key
  prefix, selling the same sku: the deployment we ship. Run it with
  ``balance roundrobin`` in the config to see what spreading one hot sku's
  buyers over both costs.

Each gets a database of its own; the gateways and HAProxy run on the servers'
core, wrk on the load generator's (``loadtests.lib.pinning``). Rounds
interleave the three; each round is one wrk run of new buyers of one hot sku
with ample stock, so every answer is a 201 that went through a flush. The flush
figures are summed over the gateways' ``/metrics`` (each process reports its
own). Prints one Markdown row per target, medians with min-max, and the ratio
of ``haproxy_g2`` to ``haproxy_g1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from loadtests.bench_cluster import SKU, STOCK, interleave, options, table
from loadtests.lib.harness import Harness
from loadtests.lib.pinning import Pinning, choose
from loadtests.lib.targets import Target
from testkit.haproxy import HAProxy


@dataclass
class Door:
    """Where wrk sends buyers (``url``), and the gateways whose flushes it counts."""

    name: str
    url: str
    gateways: Sequence[Target]

    def scrape(self, prefix: str = "flashsale_") -> dict[str, float]:
        """Every gateway's metrics added up."""
        total: dict[str, float] = {}
        for gateway in self.gateways:
            for key, value in gateway.scrape(prefix).items():
                total[key] = total.get(key, 0.0) + value
        return total


@contextmanager
def on_servers_core(pinning: Pinning) -> Iterator[None]:
    """Run the block (and what it spawns) on the servers' core, then move back."""
    mine = os.sched_getaffinity(0)
    pinning.join_servers()
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def start(harness: Harness, pinning: Pinning) -> tuple[list[Door], list[HAProxy]]:
    """The three doors, the sku created on each database."""
    direct = harness.start_gateway(harness.database("direct"), "direct_g1")
    single = harness.start_gateway(harness.database("single"), "single")
    # Both gateways of the pair sell one sku: one database, one key prefix.
    pair_db = harness.database("pair")
    shared = {"GATEWAY_KEY_PREFIX": f"{harness.key_prefix}:pair"}
    pair = [harness.start_gateway(pair_db, f"pair{i}", shared) for i in (1, 2)]
    for target in (direct, single, pair[0]):
        target.put_sku(SKU, STOCK)
    proxies = []
    with on_servers_core(pinning):
        for backends in ([single, single], pair):
            proxy = HAProxy([f"127.0.0.1:{g.port}" for g in backends])
            asyncio.run(proxy.start())
            proxies.append(proxy)
    doors = [
        Door("direct_g1", direct.url, [direct]),
        Door("haproxy_g1", proxies[0].url, [single]),
        Door("haproxy_g2", proxies[1].url, pair),
    ]
    return doors, proxies


def main(argv: Sequence[str] | None = None) -> None:
    """Run the interleaved rounds and print the table (and the raw rows as JSON)."""
    args = options(__doc__.splitlines()[0], argv)
    pinning = choose(enabled=not args.no_pin)
    proxies: list[HAProxy] = []
    try:
        with Harness(pinning=pinning) as harness:
            doors, proxies = start(harness, pinning)
            runs = interleave(doors, args, pinning)
            print(f"{args.rounds} rounds of {args.duration:g} s, {pinning.describe()}")
            print(table(runs))
            ratios = [
                two["confirmed_per_s"] / one["confirmed_per_s"]
                for one, two in zip(runs["haproxy_g1"], runs["haproxy_g2"], strict=True)
            ]
            print(
                f"haproxy_g2 / haproxy_g1 confirmed/s, per round: median "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )
            print(json.dumps(runs))
    finally:
        for proxy in proxies:
            asyncio.run(proxy.close())


if __name__ == "__main__":
    main()
