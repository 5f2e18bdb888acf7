"""Every Locust profile, briefly, against a real gateway: requests made, no 5xx.

One gateway subprocess serves all profiles, on a database and Redis key prefix
of its own (created here, removed at the end). Locust runs in a subprocess, so
gevent never patches the test process. Nothing here measures speed: a profile
passes when it made requests and every answer was one its scenario allows.
The whole module stays within ``BUDGET_S``: each run gets what is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.lib.harness import Harness
from loadtests.lib.profiles import PROFILES
from loadtests.lib.targets import Target
from loadtests.locust_run import LocustRun, run_locust
from testkit.services import PG_ADMIN_URL, REDIS_URL

RUN_S = 3.0
USERS = 10
BUDGET_S = 55.0
# No single run may take more than this, whatever budget is left.
RUN_TIMEOUT_S = 25.0

# `make test` installs the bench extra, so Locust is always there to run.
pytestmark = pytest.mark.timeout(BUDGET_S + 5)


@pytest.fixture(scope="module")
def deadline() -> float:
    """When the module's time budget runs out (monotonic clock)."""
    return time.monotonic() + BUDGET_S


@pytest.fixture(scope="module")
def gateway(deadline: float, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One gateway on a private database and key prefix, for every profile."""
    harness = Harness(
        pg_url=PG_ADMIN_URL,
        redis_url=REDIS_URL,
        log_dir=tmp_path_factory.mktemp("locust-smoke-logs"),
        db_prefix="flashsale_test_locust",
    )
    with harness:
        yield harness.start_gateway(harness.database("smoke"))


def describe(run: LocustRun) -> str:
    """What to show when a profile fails: counts, failure rows, Locust's output."""
    rows = "\n".join(f"  {f.occurrences} x {f.name}: {f.error}" for f in run.stats.failure_rows)
    return (
        f"exit {run.returncode}, {run.stats.requests} requests, {run.stats.failures} failures\n"
        f"{rows}\n--- locust output ---\n{run.output[-3000:]}"
    )


@pytest.mark.parametrize("name", list(PROFILES))
def test_profile_runs_without_server_errors(
    name: str, gateway: Target, deadline: float, tmp_path: Path
) -> None:
    """A few seconds of the profile: it made requests, none got a 5xx or a wrong answer."""
    left = deadline - time.monotonic()
    if left < RUN_S + 5:
        pytest.fail(f"time budget of {BUDGET_S:.0f}s used up before {name}")
    run = run_locust(
        PROFILES[name],
        gateway.url,
        gateway.admin_token,
        duration_s=RUN_S,
        users=USERS,
        spawn_rate=USERS,
        csv_prefix=tmp_path / name,
        # Skus of their own, so one profile's sale does not sell out another's.
        extra_env={"LOCUST_SKU_PREFIX": f"smoke-{name}"},
        timeout_s=min(left, RUN_TIMEOUT_S),
    )
    assert gateway.process.poll() is None, f"gateway died:\n{gateway.log_tail()}"
    assert run.stats.requests > 0, describe(run)
    assert run.stats.server_errors == 0, describe(run)
    assert run.stats.failures == 0, describe(run)
    assert run.returncode == 0, describe(run)
