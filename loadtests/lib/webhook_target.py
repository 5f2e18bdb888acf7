"""A loopback webhook receiver for ``loadtests.bench_relay``, as its own process:

    python -m loadtests.lib.webhook_target --port PORT [--delay-ms 50]

testkit's :class:`~testkit.webhook_receivers.Receiver` answering 204 to every
POST, after ``--delay-ms``, until SIGTERM. ``GET /healthz`` answers 200 once
it listens.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aiohttp import web

from testkit.ports import HOST
from testkit.webhook_receivers import Receiver


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.lib.webhook_target")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    config = parser.parse_args(argv)
    receiver = Receiver(status=204, delay_s=config.delay_ms / 1000)
    app = web.Application()
    app.router.add_post("/{path:.*}", receiver.handle)
    app.router.add_get("/healthz", _healthz)
    web.run_app(app, host=HOST, port=config.port, print=None, access_log=None)
    return 0


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


if __name__ == "__main__":
    sys.exit(main())
