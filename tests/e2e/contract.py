"""The published contract, ``docs/openapi.yaml``, fuzzed by schemathesis against real gateways
(``tests/e2e/test_contract.py`` and ``test_contract_bare.py``: two files, so two workers run
them at once).

One gateway process configured with every feature: a sku of each strategy, a
waiting room (and the admission secret it needs), sale windows not yet open
and already closed, rate limits (the instance's per user, and a sku's own per
user and per client address). Then one with no optional setting but the admin
token (without it every admin route is a 403, and the fuzzer reaches none):
what an instance answers when a feature is off must be in the contract too
(issue 33: ``PATCH /admin/skus/{sku}`` with a ``waiting_room`` answered 422
``not_configured`` there, which the schema documented only for ``PUT``).
Schemathesis runs every phase (examples, coverage, fuzzing, and stateful,
where the schema's links lead from a put sku to its queue and purchases, from
a ticket to its token and from a purchase to its order) with the checks below.
Any failure fails the test with schemathesis's report.

Twice on the first gateway: with a fixed seed, then a random one; once on the
second, with the fixed seed. Each run's seed, time and admitted purchases are
printed in the terminal summary of the run (tests.summary: a pytest-xdist
worker has no terminal of its own) and in a failure's message;
``CONTRACT_SEED=<seed> pytest tests/e2e/test_contract.py`` replays every run,
in the same order. Both runs on the first gateway together get two minutes at
most (the issue's bound), the one on the second one minute: a run still going
when its budget is spent is killed and fails the test with what it printed so
far. Each run is bounded by its test cases (``--max-examples``), not by
schemathesis's ``--max-time``, which would repeat fuzzing and stateful
testing until the time was spent: a replay with the same seed then makes the
same cases, and a run takes what it needs (about 20 s on an idle 2-core
machine).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from testkit.gateways import ADMIN_TOKEN, REPO, GatewayCluster
from testkit.processes import make_tmp, remove_tmp
from testkit.services import REDIS_URL, create_database, drop_database
from tests import summary

FIXED_SEED = 20_260_101
RANDOM_SEED = int(os.environ.get("CONTRACT_SEED") or random.randrange(2**31))
REPLAY = f"random, replay: CONTRACT_SEED={RANDOM_SEED} pytest tests/e2e/test_contract.py"
PHASES = "examples,coverage,fuzzing,stateful"
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    )
)
# Test cases per operation and phase: both runs together stay well within BUDGET_S.
MAX_EXAMPLES = 25
# Both runs together, gateway start-up aside.
BUDGET_S = 115.0
# The one run against the gateway without optional settings.
BARE_BUDGET_S = 60.0
SECRET = "contract-admission-secret"
# Every feature on: waiting rooms, a default rate per user, and payments.
# Schemathesis sends one bearer token: the payment routes take the admin's
# here, so the fuzzer reaches them past their 401.
SETTINGS = {"admission_secret": SECRET, "user_rate": "50/s:50", "payment_token": ADMIN_TOKEN}
STOCK = 1_000_000
SKUS: dict[str, dict[str, Any]] = {
    "demo": {"stock": STOCK, "per_user_limit": 3},
    "queued": {"stock": STOCK, "strategy": "queue"},
    "direct": {"stock": STOCK, "strategy": "sql-direct"},
    "optimist": {"stock": STOCK, "strategy": "optimistic"},
    "pessimist": {"stock": STOCK, "strategy": "pessimistic"},
    "room": {"stock": STOCK, "waiting_room": {"admit_per_s": 1000, "token_ttl_s": 60}},
    "paying": {"stock": STOCK, "payment_window_s": 60},
    "later": {"stock": STOCK, "starts_at": "2099-01-01T00:00:00Z"},
    "over": {
        "stock": STOCK,
        "starts_at": "2001-01-01T00:00:00Z",
        "ends_at": "2001-01-02T00:00:00Z",
    },
    "rated": {"stock": STOCK, "user_rate": "1/s:1", "client_rate": "1/s:2"},
}
# Without an admission secret a waiting room is refused (422 not_configured).
# What a gateway without the admission secret and the payment token cannot serve is left out.
BARE_SKUS = {
    sku: body
    for sku, body in SKUS.items()
    if "waiting_room" not in body and "payment_window_s" not in body
}


def schemathesis_argv(url: str, seed: int, token: str) -> list[str]:
    """The command line of one schemathesis run against ``url``."""
    st = Path(sys.executable).parent / "st"
    return [
        str(st),
        "run",
        str(REPO / "docs" / "openapi.yaml"),
        f"--url={url}",
        f"--phases={PHASES}",
        f"--checks={CHECKS}",
        f"--seed={seed}",
        f"--max-examples={MAX_EXAMPLES}",
        f"--header=Authorization: Bearer {token}",
        "--generation-database=none",
        "--no-color",
    ]


async def fuzz(
    request: pytest.FixtureRequest,
    name: str,
    settings: dict[str, str],
    skus: dict[str, dict[str, Any]],
    seeds: tuple[tuple[int, str], ...],
    budget_s: float,
) -> None:
    """Run schemathesis with each of ``seeds`` in turn against one gateway set
    with ``settings`` and selling ``skus``, in a database ``name`` of its own;
    every run must end with zero failures, all of them within ``budget_s``."""
    database_url = await create_database(name)
    # Schemathesis keeps a cache in its working directory: a private one.
    tmp = make_tmp("contract")
    try:
        async with GatewayCluster(
            1, redis_url=REDIS_URL, database_url=database_url, settings=settings
        ) as cluster:
            for sku, body in skus.items():
                await cluster.admin("PUT", f"/admin/skus/{sku}", body)
            deadline = time.monotonic() + budget_s
            admitted = 0
            for seed, kind in seeds:
                argv = schemathesis_argv(cluster[0].url, seed, cluster.admin_token)
                started = time.monotonic()
                returncode, report = await run(argv, tmp, deadline - started)
                took = time.monotonic() - started
                bought = await admitted_purchases(cluster) - admitted
                admitted += bought
                line = f"seed {seed} ({kind}): {took:.1f} s, {bought} admitted purchases"
                summary.add_line(request, "schemathesis", line)
                over = (
                    "" if returncode is not None else f", killed: over the {budget_s:.0f} s budget"
                )
                assert returncode == 0, (
                    f"schemathesis failed, {line}{over}:\n{report}"
                    f"\n--- gateway log:\n{cluster.logs(60)}"
                )
    finally:
        remove_tmp(tmp)
        await drop_database(name)


async def admitted_purchases(cluster: GatewayCluster) -> int:
    """Purchases confirmed with an admission token so far: the request ids that
    spent a ticket's token (the rooms' ``q:used:<ticket>`` keys) with an order."""
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        keys = [k async for k in redis.scan_iter(match=f"{cluster.key_prefix}:*:q:used:*")]
        spent = [r for r in await redis.mget(keys) if r] if keys else []
    finally:
        await redis.aclose()
    con = await asyncpg.connect(cluster.database_url)
    try:
        found = await con.fetchval("SELECT count(*) FROM orders WHERE request_id = ANY($1)", spent)
    finally:
        await con.close()
    return int(found)


async def run(argv: list[str], cwd: Path, within: float) -> tuple[int | None, str]:
    """Run a command for at most ``within`` seconds: its status (None when it was
    killed for running longer) and what it printed until it ended."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert proc.stdout is not None
    stdout, out = proc.stdout, bytearray()

    async def read() -> None:
        while chunk := await stdout.read(65536):
            out.extend(chunk)
        await proc.wait()

    try:
        await asyncio.wait_for(read(), timeout=max(within, 0.0))
    except TimeoutError:
        return None, out.decode(errors="replace")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, out.decode(errors="replace")
