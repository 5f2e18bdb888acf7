"""Where the load tests run and write, and how their options are spelled.

``BENCH_PG_URL`` and ``BENCH_REDIS_URL`` name the servers a run creates its
databases and keys on (the shared ones on 127.0.0.1 by default).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "loadtests" / "results"
PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def parse_seconds(raw: str) -> float:
    """``"10"``, ``"10s"``, ``"1.5s"`` or ``"2m"`` in seconds."""
    raw = raw.strip().lower()
    if raw.endswith("m"):
        return float(raw[:-1]) * 60
    return float(raw.removesuffix("s"))


def parse_settings(raw: str) -> dict[str, str]:
    """``"a=1,b=x"`` to ``{"a": "1", "b": "x"}`` (empty string: none)."""
    pairs = (item.partition("=") for item in raw.split(",") if item.strip())
    return {k.strip(): v.strip() for k, _, v in pairs}


def new_run_id() -> str:
    """A short id that names this run's databases and Redis keys."""
    return uuid.uuid4().hex[:8]
