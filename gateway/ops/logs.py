"""structlog, configured once: JSON lines (or console text on a terminal).

Follows structlog's performance recipe: a filtering bound logger fixed at the
configured level, cached on first use, contextvars merged (the request id and
sku are bound there), the caller's own processors (the gateway's adds the
request's client address, worked out only when a line is rendered:
``gateway.http.clients.add_client``), orjson rendering to a bytes logger.

A traceback is rendered without its source lines (:func:`traceback_text`):
the standard formatting reads each frame's file through ``linecache``, a
blocking read on the event loop the first time a file appears. Under a Redis
failover on a loaded machine that read held two gateways' loops for about a
second (the chaos suite's lag check, 2026-12-07). File, line and function
name say where; the source is in the deployed release.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import orjson
import structlog
from structlog.tracebacks import Stack, extract
from structlog.typing import ExcInfo, Processor

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def traceback_text(exc_info: ExcInfo) -> str:
    """``exc_info`` as Python prints a traceback, the chain of causes first,
    each frame's file, line and function without its source line: nothing
    is read from disk (structlog's ``extract`` walks the frames alone)."""
    exc_type, exc_value, tb = exc_info
    if exc_type is None or exc_value is None:
        return "NoneType: None"
    # The raised exception first, then its cause, its cause's cause...
    stacks = extract(exc_type, exc_value, tb, show_locals=False).stacks
    parts: list[str] = []
    for cause in reversed(stacks[1:]):
        parts += (_stack_text(cause), _LINK[cause.is_cause])
    parts.append(_stack_text(stacks[0]))
    return "".join(parts).rstrip("\n")


# After a cause, by whether the exception after it was raised ``from`` it.
_LINK = {
    True: "\nThe above exception was the direct cause of the following exception:\n\n",
    False: "\nDuring handling of the above exception, another exception occurred:\n\n",
}


def _stack_text(stack: Stack) -> str:
    lines = ["Traceback (most recent call last):\n"] if stack.frames else []
    lines += [f'  File "{f.filename}", line {f.lineno}, in {f.name}\n' for f in stack.frames]
    lines.append(
        f"{stack.exc_type}: {stack.exc_value}\n" if stack.exc_value else f"{stack.exc_type}\n"
    )
    lines += [f"{note}\n" for note in stack.exc_notes]
    for n, group in enumerate(stack.exceptions, 1):
        inner = "".join(_stack_text(s) for s in group.stacks)
        lines.append(f"+---- {n} ----\n" + "".join(f"| {line}\n" for line in inner.splitlines()))
    return "".join(lines)


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
        structlog.processors.ExceptionRenderer(traceback_text),
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
            structlog.processors.ExceptionRenderer(traceback_text),
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
