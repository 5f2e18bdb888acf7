"""Running wrk with ``purchase.lua`` and reading what its ``done()`` hook printed."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtests.lib.pinning import Pinning

SCRIPT = Path(__file__).resolve().parent / "purchase.lua"
MARKER = "WRK_JSON "


class WrkError(RuntimeError):
    """wrk failed or printed no result line."""


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run against one target and path."""

    target: str
    path: str
    round: int
    requests: int
    duration_s: float
    statuses: dict[str, int]
    socket_errors: dict[str, int]
    latency_ms: dict[str, float]
    started_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        """Completed requests per second."""
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def server_errors(self) -> int:
        """Responses with a 5xx status."""
        return sum(n for status, n in self.statuses.items() if status.startswith("5"))

    @property
    def errors(self) -> int:
        """Socket errors (connect, read, write, timeout) plus 5xx responses."""
        return sum(self.socket_errors.values()) + self.server_errors

    def as_json(self) -> dict[str, Any]:
        """The run with its derived numbers, for results/latest.json."""
        return {**asdict(self), "rps": self.rps, "errors": self.errors}


def find_wrk() -> str:
    """The wrk executable; raises :class:`WrkError` when it is not installed."""
    path = shutil.which("wrk")
    if path is None:
        raise WrkError("wrk is not installed (Debian: apt-get install wrk)")
    return path


def run(
    url: str,
    *,
    sku: str,
    tag: str,
    duration_s: float,
    connections: int = 64,
    threads: int = 2,
    timeout_s: float = 5.0,
    pinning: Pinning | None = None,
) -> dict[str, Any]:
    """Run wrk for ``duration_s`` against ``url``; returns the parsed ``done()`` JSON.

    ``tag`` makes this run's user and request ids unique (see purchase.lua);
    ``pinning`` puts wrk on the load generator's core.
    """
    cmd = [
        find_wrk(),
        f"-t{threads}",
        f"-c{connections}",
        # wrk takes whole seconds.
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={timeout_s:g}s",
        "--latency",
        "-s",
        str(SCRIPT),
        url,
        "--",
        sku,
        tag,
    ]
    if pinning is not None:
        cmd = pinning.load_command(cmd)
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=duration_s + 60, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise WrkError(f"wrk did not finish: {' '.join(cmd)}") from exc
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            parsed: dict[str, Any] = json.loads(line[len(MARKER) :])
            parsed["stdout"] = done.stdout
            return parsed
    raise WrkError(
        f"wrk exited {done.returncode} without a result line:\n{done.stdout}\n{done.stderr}"
    )


def to_result(
    target: str, path: str, round_: int, raw: dict[str, Any], started: float
) -> WrkResult:
    """A :class:`WrkResult` from :func:`run`'s output."""
    errors = raw["errors"]
    latency = raw["latency_us"]
    return WrkResult(
        target=target,
        path=path,
        round=round_,
        requests=int(raw["requests"]),
        duration_s=raw["duration_us"] / 1e6,
        statuses={str(k): int(v) for k, v in sorted(raw["statuses"].items())},
        socket_errors={k: int(errors[k]) for k in ("connect", "read", "write", "timeout")},
        latency_ms={k: latency[k] / 1000 for k in ("mean", "p50", "p90", "p99", "p999", "max")},
        started_at=started,
    )
