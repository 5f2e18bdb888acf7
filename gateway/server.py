"""Running the application: listen, wait for a signal, drain within a bound.

On SIGTERM or SIGINT the gateway first plays lame duck for
``GATEWAY_LAME_DUCK_S``: ``/readyz`` answers 503 while purchases are still
served, so the load balancer's checks take it out of rotation before anything
is refused. Then it drains: new purchases get 503 (with Retry-After) while it
keeps listening, the backlog is flushed and settled, it stops
listening, waits for the last handlers, and closes its resources. The drain is
bounded by ``GATEWAY_DRAIN_S`` and the closing after it by ``CLOSE_S``, so the
whole stop by the sum of the three; the process then exits 0. A close that
overruns its bound (a task that will not end) is logged with every task's
stack, and the process exits 1 without waiting for it any longer.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any

import structlog
import uvloop
from aiohttp import web
from prometheus_client.multiprocess import mark_process_dead

from gateway.app import create_app, create_writer_app, drain, lame_duck
from gateway.http import fastpath
from gateway.http.appkeys import BATCHER, METRICS
from gateway.http.limits import LimitedSite
from gateway.settings import Settings, worker_environment

log = structlog.get_logger(__name__)

# After the drain: how long handlers still running get, and the bound on the
# whole close (listener, handlers, background loops, pools, connections).
HANDLERS_S = 2.0
CLOSE_S = 8.0
# How deep a stuck task's chain of awaits is followed in the report.
AWAIT_DEPTH = 40
# The cyclic collector's thresholds once serving: the youngest generation is
# collected every 50,000 net allocations instead of 700, the older ones ten
# times more rarely than by default. A purchase allocates dozens of objects, so
# under a storm the defaults collect every few purchases, and each collection
# pauses every buyer in flight: these shorten the in-stock p99 and leave the
# RSS after a big sale the same (docs/performance.md, "the collector tuned
# once serving").
GC_THRESHOLDS = (50_000, 20, 100)

StartupHook = Callable[[web.Application], Awaitable[None]]


async def run(settings: Settings, on_startup: StartupHook | None = None) -> bool:
    """Serve ``settings`` until a stop signal, then drain and close; whether the
    close ended within its bound."""
    app = create_app(settings)
    if on_startup is not None:
        app.on_startup.append(on_startup)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=HANDLERS_S)
    await runner.setup()
    assert runner.server is not None
    fastpath.install(app, runner.server)
    try:
        # Before listening: the collection blocks the loop once, and no buyer
        # should be in flight then (the lag timer records it before readiness).
        _freeze_heap()
        site = LimitedSite(runner, settings, observer=app[METRICS].connections)
        await site.start()
        log.info("serving", host=settings.host, port=settings.port)
        await _stop_signal()
        await lame_duck(app, settings.lame_duck_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.drain_s
        try:
            async with asyncio.timeout_at(deadline):
                await drain(app)
        except TimeoutError:
            # Out of time: what has not committed is left to the reconciler, so
            # the shutdown below does not wait for it again without a bound.
            log.warning("drain_timed_out", queued=app[BATCHER].backlog)
            app[BATCHER].abort()
    finally:
        closed = await _close_within(runner, CLOSE_S)
    log.info("stopped", clean=closed)
    return closed


async def _close_within(runner: web.AppRunner, seconds: float) -> bool:
    """Close ``runner`` (listener, handlers, cleanup contexts) within ``seconds``.

    Each step has its own bound, so an overrun means a task that ignores its
    cancel; it is reported with every task's stack and left behind, since
    waiting for it would hold the exit forever."""
    closing = asyncio.ensure_future(runner.cleanup())
    done, _ = await asyncio.wait([closing], timeout=seconds)
    if done:
        closing.result()
        return True
    stacks = {
        task.get_name(): _awaiting(task)
        for task in asyncio.all_tasks()
        if task is not asyncio.current_task()
    }
    log.error("close_overran", seconds=seconds, tasks=stacks)
    return False


def _awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits, outermost first: its chain of awaits, which
    ``Task.get_stack`` cuts to one frame for a suspended coroutine."""
    chain = []
    awaited: Any = task.get_coro()
    for _ in range(AWAIT_DEPTH):
        frame = _first_of(awaited, ("cr_frame", "ag_frame", "gi_frame"))
        if frame is None:
            chain.append(repr(awaited))
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_qualname}")
        awaited = _first_of(awaited, ("cr_await", "ag_await", "gi_yieldfrom"))
        if awaited is None:
            break
        if _first_of(awaited, ("cr_frame", "ag_frame", "gi_frame")) is None:
            # An async generator's asend() (a cleanup context's exit, say) does not
            # name its generator; the garbage collector knows what it refers to.
            awaited = next(
                (r for r in gc.get_referents(awaited) if hasattr(r, "ag_frame")), awaited
            )
    return chain


def _first_of(awaitable: object, names: tuple[str, ...]) -> Any:
    """The first of ``names`` that ``awaitable`` has (a coroutine, an async
    generator and a generator name the same things differently), or None."""
    return next((getattr(awaitable, n) for n in names if hasattr(awaitable, n)), None)


async def _stop_signal() -> None:
    # The handlers stay installed through the drain, so a second SIGTERM does
    # not kill the process halfway through settling its batches.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _freeze_heap() -> None:
    """Take what start-up left alive (modules, the app, its pools) out of the
    collector's sight, then collect rarely (see ``GC_THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve(settings: Settings, argv: Sequence[str], on_startup: StartupHook | None = None) -> int:
    """Run the gateway on uvloop until SIGTERM or SIGINT; the exit status.

    With ``GATEWAY_WORKERS`` > 1 this process only supervises that many worker
    processes (``argv`` again, one worker each) that share the port.
    """
    if settings.workers > 1:
        return supervise(settings.workers, argv)
    return _on_uvloop(run(settings, on_startup))


def serve_writer(settings: Settings) -> int:
    """Run a queue writer alone, on uvloop, until SIGTERM or SIGINT; the exit status."""
    return _on_uvloop(run_writer(settings))


def _on_uvloop(main: Coroutine[None, None, bool]) -> int:
    """Run ``main`` on a uvloop loop; 0 when it closed cleanly, else 1 at once."""
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        clean = runner.run(main)
    except BaseException:
        runner.close()
        raise
    if not clean:
        # Closing the loop would cancel the stuck task and wait for it again.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    runner.close()
    return 0


async def run_writer(settings: Settings) -> bool:
    """Write the sku streams until a stop signal. The batch in hand when it comes
    is abandoned: it stays pending, and another writer commits it again safely."""
    runner = web.AppRunner(create_writer_app(settings), handle_signals=False)
    await runner.setup()
    try:
        log.info("writing", prefix=settings.key_prefix)
        await _stop_signal()
    finally:
        closed = await _close_within(runner, CLOSE_S)
    log.info("stopped", clean=closed)
    return closed


def supervise(workers: int, argv: Sequence[str]) -> int:
    """Run ``workers`` gateway processes, pass stop signals on, return the worst status.

    If a worker dies on its own the others are stopped too: a half-sized gateway
    behind a load balancer is better replaced than left limping. A worker that
    the signal passed on ends by that very signal was still starting (a serving
    worker handles it and drains): it stopped as asked, with nothing to drain.
    """
    with (
        tempfile.TemporaryDirectory(prefix="flashsale-metrics-") as metrics_dir,
        tempfile.TemporaryDirectory(prefix="flashsale-lanes-") as lanes_dir,
    ):
        command = [sys.executable, "-m", "gateway", *argv, "--workers", "1"]
        procs: list[subprocess.Popen[bytes]] = []
        sent: int | None = None

        def stop(signum: int, _frame: object) -> None:
            nonlocal sent
            if sent is not None:
                return
            sent = signum
            for proc in procs:
                if proc.returncode is None:
                    proc.send_signal(signum)

        # Before the workers exist, so no stop signal can find the supervisor
        # without its handler.
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        procs += [
            subprocess.Popen(command, env=worker_environment(metrics_dir, lanes_dir, i, workers))
            for i in range(workers)
        ]
        if sent is not None:  # a stop came while they were being started
            for proc in procs:
                proc.send_signal(sent)
        status = 0
        for finished in _reap(procs):
            mark_process_dead(finished.pid, metrics_dir)  # type: ignore[no-untyped-call]
            code = finished.returncode or 0
            if sent is not None and code == -sent:
                code = 0
            status = max(status, abs(code))
            stop(signal.SIGTERM, None)
        return status


def _reap(procs: list[subprocess.Popen[bytes]]) -> Iterator[subprocess.Popen[bytes]]:
    """Yield each worker as it exits."""
    alive = list(procs)
    while alive:
        pid, status = os.wait()
        for proc in alive:
            if proc.pid == pid:
                # Reaped here, so Popen cannot learn the status itself.
                proc.returncode = os.waitstatus_to_exitcode(status)
                alive.remove(proc)
                yield proc
