"""The SQL the gateway sends, read from its source for tests that check every statement."""

from __future__ import annotations

import ast
from pathlib import Path


def statements(root: Path) -> list[tuple[str, str]]:
    """(where, text) of every SQL statement in ``root/gateway`` (string constants,
    via the AST) and ``root/sql`` (statements split on ``;``)."""
    found: list[tuple[str, str]] = []
    for path in sorted((root / "gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((f"{path.relative_to(root)}:{node.lineno}", node.value))
    for path in sorted((root / "sql").rglob("*.sql")):
        for i, text in enumerate(path.read_text().split(";")):
            found.append((f"{path.relative_to(root)}#{i}", text))
    return found
