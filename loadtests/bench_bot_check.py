"""What the bot check costs a room join: joins with and without it.

``python -m loadtests.bench_bot_check`` starts one gateway (loadtests.lib.harness)
with ``GATEWAY_BOT_CHECK_URL`` at a loopback siteverify of its own
(testkit.siteverify, in a process of its own), and two rooms: one without the
check, one with it. Each join is a new buyer (a new ticket in both rooms, so
both run the same join script), with a bot token the siteverify passes. It
reports, per room, the joins' latency at one join at a time (median, p99), the
joins a second with ``--concurrency`` in flight, and the siteverify round trip
measured on its own from the bench: the check should cost that round trip and
nothing else (that it asks once per join is the tests' to hold:
tests/unit/test_bot_check_admission.py). It exits 1 unless every join was
answered 200.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from itertools import count

import aiohttp

from loadtests.lib.harness import Harness
from loadtests.lib.targets import Target
from testkit.http import http
from testkit.ports import HOST, free_port
from testkit.processes import stop_process
from testkit.siteverify import SECRET

ROOM = {"admit_per_s": 1_000_000, "token_ttl_s": 60}


def serve_siteverify(port: int) -> None:
    """The siteverify process: serve until killed (tokens taken twice, since the
    bench never reuses one and keeps no state it does not need)."""
    from aiohttp import web

    from testkit.siteverify import SiteVerify

    provider = SiteVerify(duplicates=True)
    app = web.Application()
    app.router.add_post("/siteverify", provider.handle)
    web.run_app(app, host=HOST, port=port, print=None, access_log=None)


async def _joins(url: str, sku: str, n: int, concurrency: int, names: count[int]) -> list[float]:
    """``n`` joins by new buyers, ``concurrency`` at once; each one's seconds."""
    took: list[float] = []
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            i = next(names)
            body = {"user_id": f"b{i}", "bot_token": f"pass-{i}"}
            start = time.perf_counter()
            async with session.post(f"{url}/v1/queue/{sku}", json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"join answered {resp.status}")
            took.append(time.perf_counter() - start)

        async def worker(share: int) -> None:
            for _ in range(share):
                await one()

        shares = [n // concurrency + (1 if k < n % concurrency else 0) for k in range(concurrency)]
        await asyncio.gather(*(worker(s) for s in shares))
    return took


async def _siteverify_alone(url: str, n: int) -> list[float]:
    """``n`` siteverify POSTs from the bench, one at a time: the round trip itself."""
    took: list[float] = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            form = {"secret": SECRET, "response": f"pass-alone-{i}", "remoteip": HOST}
            start = time.perf_counter()
            async with session.post(url, data=form) as resp:
                await resp.read()
            took.append(time.perf_counter() - start)
    return took


def _ms(values: Sequence[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered) * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms"


async def _measure(target: Target, siteverify: str, args: argparse.Namespace) -> None:
    names = count()
    # Warm both paths (connections, scripts, the catalog) before measuring.
    for sku in ("open", "checked"):
        await _joins(target.url, sku, 200, 8, names)
    print(f"siteverify alone, from the bench: {_ms(await _siteverify_alone(siteverify, args.n))}")
    for sku in ("open", "checked"):
        serial = await _joins(target.url, sku, args.n, 1, names)
        start = time.perf_counter()
        await _joins(target.url, sku, args.n, args.concurrency, names)
        rate = args.n / (time.perf_counter() - start)
        print(
            f"join, {sku:7} room: one at a time {_ms(serial)}; "
            f"{args.concurrency} in flight {rate:,.0f} joins/s"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; 1 when a join failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="joins per room and measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serve-siteverify", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_siteverify:
        serve_siteverify(args.serve_siteverify)
        return 0
    port = free_port()
    cmd = [sys.executable, "-m", "loadtests.bench_bot_check", "--serve-siteverify", str(port)]
    provider = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    siteverify = f"http://{HOST}:{port}/siteverify"
    try:
        with Harness() as harness:
            settings = {"GATEWAY_BOT_CHECK_URL": siteverify, "GATEWAY_BOT_CHECK_SECRET": SECRET}
            target = harness.start_gateway(harness.database("bot"), settings=settings)
            for sku, check in (("open", False), ("checked", True)):
                room = {**ROOM, "bot_check": check}
                status, answer = http(
                    "PUT",
                    f"{target.url}/admin/skus/{sku}",
                    {"stock": 1_000_000, "waiting_room": room},
                    token=target.admin_token,
                )
                if status != 200:
                    raise RuntimeError(f"PUT {sku}: {status} {answer}")
            asyncio.run(_measure(target, siteverify, args))
    except RuntimeError as exc:
        print(f"bench_bot_check: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_process(provider)
    return 0


if __name__ == "__main__":
    sys.exit(main())
