"""The alert rules evaluated by Prometheus's own tool: ``promtool test rules``
runs docs/grafana/alerts_test.yml against docs/grafana/alerts.yml, and
deploy/rules/events_test.yml against deploy/rules/events.yml.

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

RULES_TEST = REPO / "docs" / "grafana" / "alerts_test.yml"
EVENTS_TEST = REPO / "deploy" / "rules" / "events_test.yml"


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


def rules_pass(tests: Path) -> None:
    """``promtool test rules`` of ``tests`` passes."""
    result = subprocess.run(
        [promtool(), "test", "rules", str(tests)],
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
