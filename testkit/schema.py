"""The published schema (docs/openapi.yaml), read once, for the tests that check
answers against it."""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

from testkit.gateways import REPO


@cache
def schema() -> dict[str, Any]:
    """The published schema."""
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())
    return loaded


def component(name: str) -> dict[str, Any]:
    """The schema's component ``name`` (``components/schemas/<name>``)."""
    found: dict[str, Any] = schema()["components"]["schemas"][name]
    return found


def responses(path: str, method: str) -> dict[str, Any]:
    """An operation's responses, each ``$ref`` resolved."""
    shared = schema()["components"]["responses"]
    raw = schema()["paths"][path][method]["responses"]
    return {
        status: shared[r["$ref"].rsplit("/", 1)[1]] if "$ref" in r else r
        for status, r in raw.items()
    }
