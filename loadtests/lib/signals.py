"""Signals during a load-test run: SIGTERM and SIGHUP end it like Ctrl-C, and
clean-up is not interrupted half-way."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class _Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so every ``finally`` runs."""


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt for the duration."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Block SIGINT, SIGTERM and SIGHUP in this thread; pending ones arrive on exit."""
    deferred = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
