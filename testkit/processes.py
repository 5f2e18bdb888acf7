"""Child processes of a test run: spawned, signalled, reaped, and never leaked.

A process is killed three ways: by its owner (``stop``/``kill``), by an
``atexit`` hook, and by the kernel when the run dies without running either
(children are spawned with ``PR_SET_PDEATHSIG``, see :func:`die_with_parent`).
Also here: temporary directories, the tail of a log file and the processes
below a pid, read from /proc.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from testkit.polling import wait_for

# Set CHAOS_KEEP_TMP=1 to keep server directories (configs, logs) after a run.
KEEP_TMP = os.environ.get("CHAOS_KEEP_TMP") == "1"

# Looked up once here, not in the forked child.
_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
PR_SET_PDEATHSIG = 1


# apt-get waits this long for another installer's lock (a parallel test worker
# installing a package of its own) instead of failing at once.
APT_WAIT = ("-o", "DPkg::Lock::Timeout=600")


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` that has the kernel send ``sig`` to the child when its
    parent dies, even by SIGKILL (Linux only; elsewhere it does nothing)."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, sig)

    return preexec


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Child:
    """One child process we own: spawned, signalled, reaped and never leaked."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.user = user
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The pid of the current process, if one was spawned."""
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        """Whether the process was spawned and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of the last process (negative: killed by that signal)."""
        return None if self.proc is None else self.proc.poll()

    def spawn(self, banner: str | None = None) -> None:
        """Start the process, its output appended to the log file after ``banner``."""
        if self.running:
            raise RuntimeError(f"{self.argv[0]} is already running")
        ids: dict[str, Any] = {}
        if self.user is not None:
            ids = {"user": self.user, "group": self.user, "extra_groups": []}
        with open(self.log_path, "ab") as log:
            if banner is not None:
                log.write(f"{banner}\n".encode())
                log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                preexec_fn=die_with_parent(),
                **ids,
            )
        _LIVE.add(self)

    def send(self, sig: int) -> None:
        """Send a signal if the process runs (no-op otherwise)."""
        if self.proc is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    async def wait_exit(self, within: float) -> int:
        """Wait (polling, non-blocking) until the process has exited; its status."""
        proc = self.proc
        if proc is None:
            return 0
        await wait_for(lambda: proc.poll() is not None, within=within, what=f"{self.argv[0]} exit")
        _LIVE.discard(self)
        return proc.returncode

    async def stop(self, sig: int = signal.SIGTERM, within: float = 10.0) -> None:
        """Ask the process to exit with ``sig``; SIGKILL it after ``within``."""
        if not self.running:
            await self.wait_exit(1)
            return
        # A stopped process only handles SIGTERM once it runs again.
        self.send(signal.SIGCONT)
        self.send(sig)
        try:
            await self.wait_exit(within)
        except TimeoutError:
            self.send(signal.SIGKILL)
            await self.wait_exit(10)

    async def kill(self) -> None:
        """SIGKILL the process and wait until it is reaped."""
        self.send(signal.SIGKILL)
        await self.wait_exit(10)

    def kill_now(self) -> None:
        """Synchronous SIGKILL and reap, for finalizers that have no event loop."""
        if self.proc is not None:
            self.send(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        _LIVE.discard(self)


_LIVE: set[Child] = set()


class OwnsChild:
    """Mixin of a server or gateway whose process is the :class:`Child` ``_child``."""

    _child: Child

    @property
    def running(self) -> bool:
        """Whether the process is alive (maybe paused by SIGSTOP)."""
        return self._child.running

    @property
    def pid(self) -> int | None:
        """The current process id."""
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        """Exit status of the last process (negative: the signal that killed it)."""
        return self._child.returncode


class Started:
    """Mixin: ``async with x`` starts ``x`` and closes it, also when starting failed."""

    async def start(self) -> Self:
        """Start everything; returns ``self`` once it is ready."""
        raise NotImplementedError

    async def close(self) -> None:
        """Stop everything and remove what was created."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@atexit.register
def _kill_leftovers() -> None:
    """Last resort: whatever a test forgot to stop dies with the interpreter."""
    for child in list(_LIVE):
        child.kill_now()


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15.0) -> int | None:
    """SIGTERM, wait up to ``timeout`` for a graceful exit, then SIGKILL; returns the code.

    Blocking, for plain scripts (the load tests); :class:`Child` is the asyncio one.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)
    return process.returncode


def make_tmp(prefix: str, owner: str | None = None) -> Path:
    """A new directory under the system temp dir, owned by ``owner`` if given."""
    path = Path(tempfile.mkdtemp(prefix=f"chaos-{prefix}-"))
    if owner is not None:
        shutil.chown(path, owner, owner)
    return path


def remove_tmp(path: Path) -> None:
    """Remove a directory from :func:`make_tmp` (kept when CHAOS_KEEP_TMP=1)."""
    if not KEEP_TMP:
        shutil.rmtree(path, ignore_errors=True)


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name is in parentheses and may hold spaces.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def descendants_of(pid: int, limit: int = 256) -> list[int]:
    """Child processes of ``pid``, recursively (at most ``limit``)."""
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < limit:
        children = children_of(queue.pop())
        found += children
        queue += children
    return found[:limit]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: it holds no resources any more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False
