"""Where the stack's µs go (``python -m loadtests.bench_stack --profile DIR``).

During each round's measured window, from the load generator's core: ``py-spy
record`` samples the gateway (Python frames, ``--nonblocking``: the gateway is
never paused) and ``perf record -g`` samples the stack's whole core (PostgreSQL
and Redis by C function). py-spy drops idle samples, so a frame's samples over
the rate are its CPU seconds: divided by the round's orders, its µs per order.
Both are tools of whoever profiles, not dependencies: ``.venv/bin/pip install
py-spy``, ``apt-get install linux-perf``; both need root (or ptrace and
perf_event rights). A missing one is skipped with a note.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtests.lib.pinning import Pinning
from loadtests.profile_hotspots import parse_collapsed

PY_SPY_RATE = 200
PERF_HZ = 999


def _py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def profiling(
    out: Path | None, name: str, gateway_pid: int, pinning: Pinning, seconds: float
) -> Iterator[None]:
    """Profile the gateway (py-spy) and the stack's core (perf) for ``seconds``, into
    ``out/<name>.pyspy.txt`` and ``out/<name>.perf.data``; nothing when ``out`` is None."""
    if out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    spy = _py_spy()
    if spy is not None:
        cmd = [spy, "record", "--pid", str(gateway_pid), "--format", "raw", "--function"]
        cmd += ["--nonblocking", "--rate", str(PY_SPY_RATE), "--duration", f"{round(seconds)}"]
        cmd += ["--output", str(out / f"{name}.pyspy.txt")]
        procs.append(_start(pinning.load_command(cmd)))
    perf = shutil.which("perf")
    if perf is not None and pinning.servers is not None:
        cmd = [perf, "record", "-q", "-g", "-F", str(PERF_HZ), "-C", str(pinning.servers)]
        cmd += ["-o", str(out / f"{name}.perf.data"), "--", "sleep", f"{seconds:g}"]
        procs.append(_start(pinning.load_command(cmd)))
    try:
        yield
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _start(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def python_top(path: Path, us_per_order: float, top: int = 25) -> list[tuple[str, float, float]]:
    """The gateway's frames by own time: (frame, own µs per order, total µs per order).

    py-spy counts a thread that waits for the core (shared with PostgreSQL and
    Redis) as busy, so its samples are shares, scaled here to the gateway's CPU
    per order as /proc measured it (``us_per_order``).
    """
    if not path.exists():
        return []
    samples = parse_collapsed(path.read_text())
    if not samples.samples:
        return []
    scale = us_per_order / samples.samples
    return [
        (frame, n * scale, samples.total[frame] * scale)
        for frame, n in samples.own.most_common(top)
    ]


def python_total(path: Path, us_per_order: float, needle: str) -> float:
    """µs per order (scaled as in :func:`python_top`) of the samples with a frame
    containing ``needle`` on the stack."""
    if not path.exists():
        return 0.0
    n = total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            total += int(count)
            n += int(count) if needle in stack else 0
    return n * us_per_order / total if total else 0.0


def native_top(path: Path, comm: str, limit: float = 1.5) -> str:
    """``perf report`` of one command's own time by function, entries over ``limit`` %."""
    perf = shutil.which("perf")
    if perf is None or not path.exists():
        return ""
    cmd = [perf, "report", "-i", str(path), "--comms", comm, "--percentage", "relative"]
    cmd += ["--no-children", "--stdio", "--sort", "dso,sym", "-g", "none"]
    cmd += ["--percent-limit", f"{limit:g}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip() and line[0] != "#"]
    return "\n".join(lines)


def report(out: Path, rounds: Sequence[Mapping[str, Any]], top: int = 20) -> str:
    """Per mode: the gateway's top frames in µs per order (all its rounds' samples
    over all their orders) and perf's top functions of PostgreSQL and Redis (its
    first round)."""
    parts: list[str] = []
    modes = list(dict.fromkeys(str(r["mode"]) for r in rounds))
    for mode in modes:
        mine = [r for r in rounds if r["mode"] == mode]
        names = [f"{r['mode']}{r['round']}" for r in mine]
        orders = sum(int(r["orders"]) for r in mine)
        spent = sum(float(r["cpu_s"]["gateway"]["gateway"]) for r in mine)
        us = spent / orders * 1e6 if orders else 0.0
        merged = out / f"{mode}.pyspy.txt"
        merged.write_text(
            "\n".join(
                (out / f"{n}.pyspy.txt").read_text()
                for n in names
                if (out / f"{n}.pyspy.txt").exists()
            )
        )
        parts.append(
            f"\n### {mode}: the gateway (py-spy, {len(mine)} rounds, {orders:,} orders, "
            f"{us:.1f} µs/order by /proc, shared out by the samples)"
        )
        parts.append("| own µs/order | total µs/order | frame |\n|--:|--:|---|")
        for frame, own, total in python_top(merged, us, top):
            parts.append(f"| {own:.2f} | {total:.2f} | `{frame}` |")
        for needle in ("relay.py", "outbound", "flusher.py", "batcher.py", "purchase"):
            parts.append(
                f"on the stack, `{needle}`: {python_total(merged, us, needle):.1f} µs/order"
            )
        first = out / f"{names[0]}.perf.data"
        for comm in ("postgres", "redis-server"):
            parts.append(
                f"\n### {mode}: {comm} (perf, round {mine[0]['round']}, share of its samples)"
            )
            parts.append(native_top(first, comm))
    return "\n".join(parts)
