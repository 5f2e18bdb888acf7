"""structlog, configured once: JSON lines (or console text on a terminal).

Follows structlog's performance recipe: a filtering bound logger fixed at the
configured level, cached on first use, contextvars merged (the request id and
sku are bound there), the caller's own processors (the gateway's adds the
request's client address, worked out only when a line is rendered:
``gateway.http.clients.add_client``), orjson rendering to a bytes logger.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import orjson
import structlog
from structlog.typing import Processor

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(
    level: str = "info", *, json: bool | None = None, context: Sequence[Processor] = ()
) -> None:
    """Configure structlog for the process; ``json`` defaults to "not a terminal".
    ``context``: processors that add to every line after the bound context is
    merged (structlog's and the standard library's lines alike)."""
    if json is None:
        json = not sys.stderr.isatty()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        *context,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if json:
        processors.append(structlog.processors.JSONRenderer(serializer=orjson.dumps))
        factory: Any = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    _route_stdlib(level, json=json, context=context)


def _route_stdlib(level: str, *, json: bool, context: Sequence[Processor]) -> None:
    """Libraries log through ``logging`` (asyncpg's pool, aiohttp): render their
    records in the same format, so the log stays one JSON object per line."""
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=lambda obj, **_: orjson.dumps(obj).decode())
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            *context,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
