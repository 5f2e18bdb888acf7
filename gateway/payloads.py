"""Request bodies: parsed with orjson and checked by hand, cheaply.

A handful of checks is faster than a schema library on the hot path, and the
rules are few: known fields only, strings of ``[A-Za-z0-9._:-]`` of 1 to 64
characters, and integers that are real JSON integers (not booleans, not floats).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.domain import Purchase
from gateway.errors import InvalidRequest

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
MAX_BODY = 4096
# Stock and quantities stay far inside PostgreSQL's bigint and Lua's doubles.
MAX_INT = 2**50
MAX_LIMIT = 2**31 - 1

PURCHASE_FIELDS = frozenset({"sku", "user_id", "qty", "request_id"})
SKU_FIELDS = frozenset({"stock", "per_user_limit"})
RESTOCK_FIELDS = frozenset({"delta"})


def parse_object(body: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    """Parse a JSON object with only ``allowed`` fields; raises :class:`InvalidRequest`."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("body must be a JSON object")
    extra = data.keys() - allowed
    if extra:
        raise InvalidRequest(f"unknown fields: {', '.join(sorted(extra))}")
    return data


def identifier(value: object, name: str) -> str:
    """Check an id (sku, user_id, request_id); raises :class:`InvalidRequest`."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string")
    if ID_PATTERN.fullmatch(value) is None:
        raise InvalidRequest(f"{name} must be 1 to 64 characters of A-Z a-z 0-9 . _ : -")
    return value


def integer(
    data: Mapping[str, Any], name: str, *, low: int, high: int = MAX_INT, default: int | None = None
) -> int:
    """Read a JSON integer from ``low`` to ``high``; raises :class:`InvalidRequest`."""
    if name not in data:
        if default is None:
            raise InvalidRequest(f"{name} is required")
        return default
    value = data[name]
    # bool is a subclass of int; JSON true is not a quantity.
    if type(value) is not int:
        raise InvalidRequest(f"{name} must be an integer")
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be from {low} to {high}")
    return value


def purchase(body: bytes, idempotency_key: str | None) -> Purchase:
    """Parse ``POST /v1/purchase``; the request id comes from the body, else the
    Idempotency-Key header, else is generated."""
    data = parse_object(body, PURCHASE_FIELDS)
    for name in ("sku", "user_id"):
        if name not in data:
            raise InvalidRequest(f"{name} is required")
    sku = identifier(data["sku"], "sku")
    user_id = identifier(data["user_id"], "user_id")
    qty = integer(data, "qty", low=1, high=MAX_LIMIT, default=1)
    if "request_id" in data:
        request_id = identifier(data["request_id"], "request_id")
    elif idempotency_key is not None:
        request_id = identifier(idempotency_key, "Idempotency-Key")
    else:
        request_id = uuid.uuid4().hex
    return Purchase(sku=sku, user_id=user_id, qty=qty, request_id=request_id)
