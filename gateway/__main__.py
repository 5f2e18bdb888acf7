"""The command line: ``flashsale-gateway [serve|migrate|audit|writer|events] [--flags]``.

``serve`` (the default) runs the gateway on uvloop without an access log;
``migrate`` creates the database if needed and applies the migrations;
``audit`` checks the books of every sku (or ``--sku``), see gateway.ops.audit;
``writer`` runs a queue strategy's stream writer alone until SIGTERM;
``events`` lists the order events owed to the sinks, redelivers them and drops
a sink, see
gateway.ops.events_command.

Each exits 2 with one line on stderr, no traceback, when a setting is wrong,
among them a URL that names something the gateway cannot use (the setting, the
URL with its password masked, and what is there: gateway.settings.Misconfigured);
1 on a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from aiohttp import web

from gateway import server, settings
from gateway.domain.skus import IfMissing
from gateway.http.appkeys import ADMIN, ORDERS, SETTINGS
from gateway.http.clients import add_client
from gateway.ops import audit, events_command, logs
from gateway.postgres.database import connect, ensure_database, migrate

DEMO_SKU, DEMO_STOCK = "demo", 100


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one flag per setting, plus the subcommand."""
    parser = argparse.ArgumentParser(prog="flashsale-gateway", description=__doc__)
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve", "migrate", "audit", "writer", "events"],
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help=f"create sku {DEMO_SKU!r} with stock {DEMO_STOCK} if it does not exist",
    )
    parser.add_argument("--sku", help="audit: only this sku (default: every sku)")
    # A redelivery's flags; --replay and --replay-since, their first spelling, stay aliases.
    parser.add_argument(
        "--redeliver",
        "--replay",
        metavar="EVENT_ID",
        help="events: redeliver this event, delivered or not",
    )
    parser.add_argument(
        "--redeliver-since",
        "--replay-since",
        metavar="TIME",
        help="events: redeliver every event since TIME (RFC 3339) still in the outbox",
    )
    parser.add_argument("--sink", help="events: only this sink (stream, webhook, amqp)")
    parser.add_argument(
        "--drop-sink", metavar="NAME", help="events: forget this sink and all it is owed"
    )
    settings.add_arguments(parser)
    return parser


async def run_migrate(config: settings.Settings) -> None:
    """Create the database if missing and apply every migration."""
    created = await ensure_database(config.database_url)
    con = await connect(config.database_url)
    try:
        applied = await migrate(con)
    finally:
        await con.close()
    print(f"database ready (created: {created}; migrations applied: {applied or 'none'})")


async def _create_demo_sku(app: web.Application) -> None:
    settings_ = app[SETTINGS]
    if await app[ORDERS].stock(DEMO_SKU) is None:
        await app[ADMIN].change_sku(DEMO_SKU, {"stock": DEMO_STOCK}, if_missing=IfMissing.CREATE)
    body = f'{{"sku": "{DEMO_SKU}", "user_id": "alice"}}'
    print(
        f"demo sku {DEMO_SKU!r} ready; try:\n  curl -X POST "
        f"http://{settings_.host}:{settings_.port}/v1/purchase -d '{body}'",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m gateway`` and ``flashsale-gateway``."""
    parser = build_parser()
    try:
        config = settings.from_args(argv, parser)
    except settings.SettingsError as exc:
        print(f"flashsale-gateway: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logs.configure(config.log_level, context=[add_client])
    try:
        return _run(args, config, sys.argv[1:] if argv is None else list(argv))
    except settings.Misconfigured as exc:
        # One line, no traceback: the setting, its URL and what is there.
        print(f"flashsale-gateway {args.command}: {exc}", file=sys.stderr, flush=True)
        return 2


def _run(args: argparse.Namespace, config: settings.Settings, argv: list[str]) -> int:
    """Run the command ``args`` names; its exit status."""
    if args.command == "audit":
        return audit.run(config, args.sku)
    if args.command == "events":
        request = events_command.Request(
            args.redeliver, args.redeliver_since, args.sink, args.drop_sink
        )
        return events_command.run(config, request)
    if args.command == "migrate":
        asyncio.run(run_migrate(config))
        return 0
    if args.command == "writer":
        return server.serve_writer(config)
    return server.serve(config, argv, _create_demo_sku if args.demo else None)


if __name__ == "__main__":
    sys.exit(main())
