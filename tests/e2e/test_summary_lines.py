"""A line a test adds to the terminal summary (tests.summary) is printed when the
test ran in a pytest-xdist worker, as under ``make test``: a worker has no
terminal of its own (issue 20: the schemathesis seeds were written to one, and
a passing ``make test`` showed none). An e2e test: a pytest-xdist worker takes
seconds to start."""

from __future__ import annotations

import subprocess
import sys

from testkit.gateways import REPO


def test_a_workers_summary_line_is_printed_at_the_end_of_the_run() -> None:
    """pytest -n 1 over a probe test that adds a line: the run's output ends with
    the line under its section's title."""
    probe = REPO / "tests" / "e2e" / "summary_probe.py"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", str(probe)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if " probe section " in line)
    assert lines[title + 1] == "probe line from a worker", done.stdout
