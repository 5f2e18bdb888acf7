"""Lines of a log captured with ``structlog.testing.capture_logs()``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def events(logs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    """The captured lines of one event."""
    return [line for line in logs if line["event"] == name]
