"""Library paths that would block the event loop are never called (gateway.ops.loop_lag)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCES = sorted((Path(__file__).resolve().parents[2] / "gateway").rglob("*.py"))


def _pipelines(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "pipeline"
    ]


def _non_transactional(call: ast.Call) -> bool:
    return any(
        kw.arg == "transaction" and isinstance(kw.value, ast.Constant) and kw.value.value is False
        for kw in call.keywords
    )


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_redis_transaction_pipeline(path: Path) -> None:
    """Every Redis pipeline is opened with ``transaction=False`` (redis-py's default is a
    MULTI). On a Redis Cluster, redis-py's asyncio transaction pipeline runs each queued
    command in a new thread with its own event loop and joins it, which blocks the
    gateway's loop and, after a failover, binds the client's lock to that thread's loop
    (a wedged gateway). Atomic reads and writes of one sku's keys are Lua scripts."""
    tree = ast.parse(path.read_text(), str(path))
    offenders = [f"{path.name}:{c.lineno}" for c in _pipelines(tree) if not _non_transactional(c)]
    assert not offenders, f"transaction pipelines: {offenders}"


def test_the_check_sees_a_transaction_pipeline() -> None:
    """The check above flags both spellings of a MULTI pipeline."""
    tree = ast.parse("r.pipeline()\nr.pipeline(transaction=True)\nr.pipeline(transaction=False)")
    assert [_non_transactional(c) for c in _pipelines(tree)] == [False, False, True]
