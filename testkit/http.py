"""A blocking JSON-over-HTTP client for loopback servers (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

# urllib honours http_proxy; these helpers only ever talk to loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    method: str,
    url: str,
    body: Mapping[str, Any] | None = None,
    *,
    token: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, Any]:
    """One JSON request; returns (status, parsed body, or the text if not JSON, or None).

    Raises:
        OSError: the server could not be reached or did not answer in time.
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:  # closes its response, or it warns when collected
            status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")
