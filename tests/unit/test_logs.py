"""Logs: one JSON object per line, library records included, request ids bound."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging, structlog
from gateway.ops import logs
logs.configure("info", json=True)
structlog.contextvars.bind_contextvars(request_id="r-1", sku="s-1")
structlog.get_logger().warning("request_failed", cause="redis")
structlog.get_logger().info("flush", size=3)
structlog.get_logger().debug("hidden")
try:
    raise ConnectionRefusedError("down")
except OSError:
    logging.getLogger("asyncpg.pool").warning("Failed to restore the pool", exc_info=True)
"""


def test_json_lines_with_bound_context_and_library_records() -> None:
    """Every line parses as JSON; ours carry request_id and sku; a library's
    traceback is a field, not loose lines; debug is filtered at info."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [line["event"] for line in lines] == [
        "request_failed",
        "flush",
        "Failed to restore the pool",
    ]
    assert lines[0]["request_id"] == "r-1" and lines[0]["sku"] == "s-1"
    assert lines[0]["level"] == "warning" and "timestamp" in lines[0]
    assert "ConnectionRefusedError" in lines[2]["exception"]
    assert lines[2]["logger"] == "asyncpg.pool"
