"""What the chaos suite reports: one line per scenario, and diagnostics of a failure.

:data:`REPORT_LINES` gets one line per finished scenario; ``tests/chaos/conftest.py``
moves them into the test's report (``user_properties`` under
:data:`CHAOS_PROPERTY`), and ``tests/conftest.py`` prints them in the terminal
summary. A :data:`Diagnostics` list holds callables whose text is attached to
the report of a failed test.
"""

from __future__ import annotations

from collections.abc import Callable

# One line per finished scenario, until the test's report takes them.
REPORT_LINES: list[str] = []
# The report property that carries them to the terminal summary.
CHAOS_PROPERTY = "chaos scenario"

Diagnostics = list[Callable[[], str]]


def freeze(diagnostics: Diagnostics) -> None:
    """Read every diagnostic now: the stack is about to remove its logs, and the
    report of a failed test is written after the test body (and the stack) ended."""
    texts = []
    for source in diagnostics:
        try:
            texts.append(source())
        except Exception as exc:
            texts.append(f"(diagnostic failed: {exc!r})")
    diagnostics[:] = [constant(text) for text in texts]


def constant(text: str) -> Callable[[], str]:
    return lambda: text
