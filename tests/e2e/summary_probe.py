"""Run only by tests/e2e/test_summary_lines.py, in a pytest of its own (the name is no
``test_*.py``, so the suite does not collect it): one test that adds a line to
the terminal summary."""

from __future__ import annotations

import pytest

from tests import summary


def test_adds_a_summary_line(request: pytest.FixtureRequest) -> None:
    summary.add_line(request, "probe section", "probe line from a worker")
