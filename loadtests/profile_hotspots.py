"""Profile the gateway under wrk load with py-spy: ``python -m loadtests.profile_hotspots``.

Starts a gateway exactly as the bench does (:mod:`loadtests.lib.harness`), warms it
up, then samples it with ``py-spy record`` while wrk drives one path
(``sold_out`` or ``in_stock``, see :mod:`loadtests.bench`). Writes the raw
collapsed stacks to ``loadtests/results/profile_<path>.txt`` (speedscope and
flamegraph.pl read them) and prints the top frames by own time and by total
time. py-spy is a tool for whoever profiles, not a project dependency:
``.venv/bin/pip install py-spy``. It needs ptrace rights on the gateway
(root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.lib import wrk
from loadtests.lib.bench_paths import IN_STOCK_SKU, SKU_OF, SOLD_OUT_SKU
from loadtests.lib.harness import Harness
from loadtests.lib.options import RESULTS_DIR, parse_seconds
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target


@dataclass(frozen=True, slots=True)
class Samples:
    """Samples by frame: own (the frame was running) and total (on the stack)."""

    samples: int
    own: Counter[str]
    total: Counter[str]


def find_py_spy() -> str:
    """py-spy next to this interpreter or on PATH; exits with advice when missing."""
    local = Path(sys.executable).with_name("py-spy")
    found = str(local) if local.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def parse_collapsed(text: str) -> Samples:
    """Read py-spy's raw output: ``frame;frame;...;leaf count`` per line."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        samples += n
        own[frames[-1]] += n
        # A recursive frame counts once per sample in its total.
        for frame in set(frames):
            total[frame] += n
    return Samples(samples, own, total)


def format_top(profile: Samples, top: int) -> str:
    """The ``top`` frames by own time, each with its total share, as Markdown."""
    lines = ["| # | own % | total % | frame |", "|--:|--:|--:|---|"]
    for rank, (frame, n) in enumerate(profile.own.most_common(top), 1):
        own_pct = 100 * n / profile.samples
        total_pct = 100 * profile.total[frame] / profile.samples
        lines.append(f"| {rank} | {own_pct:.1f} | {total_pct:.1f} | `{frame}` |")
    return "\n".join(lines)


def record(
    target: Target, path: str, seconds: float, rate: int, native: bool, out: Path
) -> tuple[Samples, wrk.WrkResult]:
    """Sample ``target`` with py-spy while wrk drives ``path`` for ``seconds``."""
    cmd = [
        find_py_spy(),
        "record",
        "--pid",
        str(target.pid),
        "--format",
        "raw",
        "--function",
        "--rate",
        str(rate),
        "--duration",
        f"{max(1, int(seconds) - 1)}",
        "--output",
        str(out),
    ]
    if native:
        cmd.append("--native")
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        raw = wrk.run(target.url, sku=SKU_OF[path], tag=f"p{int(time.time())}", duration_s=seconds)
        _, err = spy.communicate(timeout=60)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait(5)
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.strip()}")
    result = wrk.to_result(target.name, path, 0, raw, time.time())
    return parse_collapsed(out.read_text()), result


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.profile_hotspots``."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.profile_hotspots", description=__doc__
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--path", choices=["sold_out", "in_stock", "both"], default="both")
    parser.add_argument("--duration", default="15s", help="seconds of load per path")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--native", action="store_true", help="include C/Cython frames")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    find_py_spy()
    seconds = parse_seconds(args.duration)
    paths = ["sold_out", "in_stock"] if args.path == "both" else [args.path]
    with signals_interrupt(), Harness() as harness:
        gateway = harness.start_gateway(harness.database("profile"))
        gateway.put_sku(SOLD_OUT_SKU, 0)
        gateway.put_sku(IN_STOCK_SKU, 10_000_000)
        for path in paths:
            # Warm-up: pools filled, sold-out mark set, code paths taken once.
            wrk.run(gateway.url, sku=SKU_OF[path], tag=f"w{int(time.time())}", duration_s=2)
            suffix = "_native" if args.native else ""
            out = args.out / f"profile_{path}{suffix}.txt"
            profile, result = record(gateway, path, seconds, args.rate, args.native, out)
            print(
                f"\n## {path}: {result.rps:,.0f} req/s under py-spy, statuses {result.statuses}, "
                f"{profile.samples} samples of the busy main thread ({out})\n"
            )
            print(format_top(profile, args.top))
        print(f"\ngateway warnings/errors: {gateway.log_problems() or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
