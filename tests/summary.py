"""Lines a test adds to the run's terminal summary, from a pytest-xdist worker too.

Under ``make test`` (pytest-xdist) a test runs in a worker process, which has no
terminal: whatever it writes there is lost when it passes. A line added here
rides in the test's report (``user_properties``) to the process that collects
the reports, and ``tests/conftest.py`` prints it at the end of the run under
its section's title, whether the test passed or failed.
"""

from __future__ import annotations

import pytest

# The report property of a summary line is this prefix and the section's title.
_PREFIX = "summary: "


def add_line(request: pytest.FixtureRequest, section: str, line: str) -> None:
    """Print ``line`` under ``section`` in the terminal summary of the run."""
    request.node.user_properties.append((_PREFIX + section, line))


def section_of(prop: str) -> str | None:
    """The section a report property's line belongs to; None for another property."""
    return prop.removeprefix(_PREFIX) if prop.startswith(_PREFIX) else None
