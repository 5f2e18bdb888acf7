"""The alert rules evaluated by Prometheus's own tool: ``promtool check rules``
accepts every file Prometheus loads (each ``*.yml`` of deploy/rules/), and
``promtool test rules`` runs the tests of deploy/rules/tests/ against them.

promtool is Debian's ``prometheus`` package; it is installed with apt-get when
missing, as the browser tests install chromium.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from testkit.gateways import REPO
from testkit.processes import APT_WAIT

RULES = REPO / "deploy" / "rules"
RULES_TEST = RULES / "tests" / "sale_test.yml"
EVENTS_TEST = RULES / "tests" / "events_test.yml"
LOOP_TEST = RULES / "tests" / "loop_test.yml"
LOCKS_TEST = RULES / "tests" / "locks_test.yml"


def promtool() -> str:
    """The path of promtool, installed with apt-get first if missing.

    Raises RuntimeError saying what to install when that is not possible."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("the alert rules' test needs promtool: apt-get install prometheus")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", *APT_WAIT, "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        # A fresh machine has no package lists yet.
        subprocess.run(["apt-get", *APT_WAIT, "update", "-q"], env=env, check=True)
        subprocess.run(install, env=env, capture_output=True, check=True)
    found = shutil.which("promtool")
    if found is None:
        raise RuntimeError("apt-get installed prometheus, but promtool is not on PATH")
    return found


def rules_pass(tests: Path, command: str = "test") -> None:
    """``promtool <command> rules`` of ``tests`` passes."""
    result = subprocess.run(
        [promtool(), command, "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_failure_rate_alert_leaves_buyers_gone_out() -> None:
    """FlashsaleDeductionFailureRateHigh stays silent through a drop of clients
    gone before their body arrived (client_gone) with nothing unavailable, and
    fires at one 503 in ten purchases however many buyers went away meanwhile."""
    rules_pass(RULES_TEST)


def test_the_events_alert_fires_past_a_minute_behind_for_that_sink_alone() -> None:
    """FlashsaleEventsBehind stays silent at 60 s and fires at 75 s for the
    webhook, once however many gateways report it, and not for the stream."""
    rules_pass(EVENTS_TEST)


def test_every_file_prometheus_loads_is_a_rule_file() -> None:
    """Each ``*.yml`` of deploy/rules/ (deploy/prometheus.yml's glob) passes
    ``promtool check rules``: no test file or other YAML lies among them."""
    for path in sorted(RULES.glob("*.yml")):
        rules_pass(path, "check")


def test_the_loop_lag_alert_fires_for_the_late_loop_after_a_minute() -> None:
    """FlashsaleEventLoopLagHigh stays silent while the p99 lag is within 50 ms,
    and fires for the one instance whose p99 passed 100 ms for a minute."""
    rules_pass(LOOP_TEST)


def test_the_lease_alert_fires_for_the_instance_holding_past_a_third() -> None:
    """FlashsaleLockHoldNearLease waits five minutes, then fires for the one
    instance whose p99 hold passed a third of its lease."""
    rules_pass(LOCKS_TEST)


def test_every_rule_file_has_its_tests() -> None:
    """Each rule file of deploy/rules/ has ``tests/<name>_test.yml``, and each
    of those is run above."""
    names = sorted(p.stem for p in RULES.glob("*.yml"))
    assert sorted(p.stem.removesuffix("_test") for p in (RULES / "tests").glob("*.yml")) == names
    tested = {RULES_TEST, EVENTS_TEST, LOOP_TEST, LOCKS_TEST}
    assert {p.stem.removesuffix("_test") for p in tested} == set(names)
