"""Logs: one JSON object per line, library records included, request ids bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


FAILING = """
import linecache, structlog, sys
from gateway.ops import logs
logs.configure("info", json=True)
# Every file read for a source line is recorded, none done.
read = []
linecache.updatecache = lambda filename, *rest: read.append(filename) or []
linecache.clearcache()

def settle():
    raise ConnectionError("redis down")

try:
    try:
        settle()
    except ConnectionError as exc:
        raise RuntimeError("settle failed") from exc
except RuntimeError:
    structlog.get_logger().exception("flush_failed")
print(len(read))
"""


def test_a_traceback_is_logged_without_reading_a_source_file(tmp_path: Path) -> None:
    """An exception logged with its traceback: the chain, each frame's file,
    line and function, and not one file read for its source lines (a blocking
    read on the event loop, which stalled two gateways for about a second
    under a Redis failover on a loaded machine)."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "0", "source files were read to log a traceback"
    [line] = [json.loads(line) for line in proc.stderr.splitlines()]
    text = line["exception"]
    assert line["event"] == "flush_failed" and line["level"] == "error"
    assert text.index("ConnectionError: redis down") < text.index("RuntimeError: settle failed")
    assert "The above exception was the direct cause of the following exception:" in text
    assert f'File "{script}", line 11, in settle' in text
    assert 'raise ConnectionError("redis down")' not in text
