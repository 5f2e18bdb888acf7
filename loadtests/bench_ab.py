"""An A/B run: this checkout's gateway against another revision's, round by round.

``python -m loadtests.bench_ab --base REV`` checks ``REV`` out into a temporary git
worktree, starts its gateway and this checkout's (each on its own database and
key prefix, both with this virtualenv) and the minimal bare handler, sells each
gateway's small sale out, then alternates short wrk runs of the chosen paths,
the order reversed every round. Each run records requests a second and the CPU
time the target spent per request, read from ``/proc``.

Why not ``make bench`` twice: on a shared machine throughput swings by tens of
percent between minutes, so two benches taken apart compare the machine's
moods. Rounds taken back to back see nearly the same machine, and the CPU time
per request barely moves with contention (loadtests.lib.cputime). The report gives,
per path, each target's median (min-max) and the per-round ratio of this
checkout to the base, with its median.

The base runs its own Python code, Lua and SQL (the worktree's ``lua`` and
``sql`` are linked into its ``gateway`` package, where the import system finds
them before this checkout's editable install), and its database is migrated by
its own checkout, so a base with another schema compares too.

``--head-sku-field`` and ``--base-sku-field`` add fields to one gateway's
``PUT /admin/skus`` of the in-stock sku: a sku setting such as a payment window
(``payment_window_s=3600``, with ``--head-setting GATEWAY_PAYMENT_TOKEN=...``)
is then measured against a base without it. ``--head-limit-group N`` (and
``--base-limit-group N``) puts that gateway's two skus, sold-out and in-stock,
in a limit group of N skus (limit 1; the other N-2 have stock), so a grouped
sku's answers are measured against an ungrouped one's (``--base HEAD``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from loadtests.lib.bench_openloop import drive_open
from loadtests.lib.bench_paths import IN_STOCK, IN_STOCK_SKU, SMALL_SALE, SOLD_OUT, SOLD_OUT_SKU
from loadtests.lib.bench_runs import measured
from loadtests.lib.bench_sales import sell_out
from loadtests.lib.harness import Harness
from loadtests.lib.options import REPO_ROOT
from loadtests.lib.pinning import choose
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target
from testkit.http import http

BASE, HEAD, BARE = "base", "head", "bare_min"
CONNECTIONS = 64
IN_STOCK_UNITS = 10_000_000
# wrk on one core, the targets on the other, when there are two.
HARNESS_PINNING = choose()


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a temporary worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="flashsale-ab-") as parent:
        path = Path(parent) / "base"
        git = ["git", "-C", str(REPO_ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", str(path), revision], check=True)
        try:
            for data in ("lua", "sql"):
                (path / "gateway" / data).symlink_to(path / data, target_is_directory=True)
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


def measure(target: Target, path: str, seconds: float, tag: str) -> tuple[float, float, float]:
    """One wrk run of ``path``: (requests a second, CPU microseconds a request, p99 ms)."""
    result = measured(
        target,
        path,
        0,
        seconds,
        tag=tag,
        connections=CONNECTIONS,
        threads=1,
        pinning=HARNESS_PINNING,
    )
    if result.errors:
        raise RuntimeError(f"{target.name} {path}: {result.errors} errors {result.statuses}")
    cpu = float(result.extra.get("cpu_us_per_request", 0.0))
    return result.rps, cpu, result.latency_ms["p99"]


def put_in_stock(target: Target, fields: Mapping[str, object]) -> None:
    """Create the in-stock sku on ``target`` with ``fields`` added to its PUT."""
    body = {"stock": IN_STOCK_UNITS, "per_user_limit": 1, **fields}
    url = f"{target.url}/admin/skus/{IN_STOCK_SKU}"
    status, answer = http("PUT", url, body, token=target.admin_token)
    if status != 200:
        raise RuntimeError(f"{target.name}: PUT {IN_STOCK_SKU} answered {status}: {answer}")


# The limit group of ``--head-limit-group``, and its other skus' stock.
GROUP, SIBLING_UNITS = "bench-drop", 1000


def put_group(target: Target, sizes: int) -> None:
    """Put both bench skus of ``target`` in a limit group of ``sizes`` skus (limit
    1): the group, ``sizes - 2`` siblings, and each bench sku's ``limit_group``."""
    token = target.admin_token
    status, answer = http(
        "PUT", f"{target.url}/admin/limit-groups/{GROUP}", {"per_user_limit": 1}, token=token
    )
    if status != 200:
        raise RuntimeError(f"{target.name}: PUT /admin/limit-groups answered {status}: {answer}")
    for n in range(sizes - 2):
        body = {"stock": SIBLING_UNITS, "limit_group": GROUP}
        status, answer = http("PUT", f"{target.url}/admin/skus/{GROUP}-{n}", body, token=token)
        if status != 200:
            raise RuntimeError(f"{target.name}: a sibling sku answered {status}: {answer}")
    for sku in (SOLD_OUT_SKU, IN_STOCK_SKU):
        body = {"limit_group": GROUP}
        status, answer = http("PATCH", f"{target.url}/admin/skus/{sku}", body, token=token)
        if status != 200:
            raise RuntimeError(f"{target.name}: PATCH {sku} answered {status}: {answer}")


def _summary(values: Sequence[float], digits: int = 1) -> str:
    def f(value: float) -> str:
        return f"{value:,.{digits}f}"

    return f"{f(statistics.median(values))} ({f(min(values))}-{f(max(values))})"


def run(
    base: str,
    paths: Sequence[str],
    rounds: int,
    seconds: float,
    settings: Mapping[str, Mapping[str, str]],
    open_rates: Sequence[int] = (),
    sku_fields: Mapping[str, Mapping[str, object]] | None = None,
    group_sizes: Mapping[str, int] | None = None,
) -> None:
    """Start the three targets, alternate the rounds, print the report.

    ``settings`` holds extra ``GATEWAY_*`` variables per gateway (``base``, ``head``),
    ``sku_fields`` extra fields of its in-stock sku, ``group_sizes`` the size of
    the limit group its bench skus are put in (none when absent or 0).
    Each of ``open_rates`` then drives both gateways open-loop (loadtests.lib.openloop)
    on every path, for ``seconds`` each, base and head in turn.
    """
    with worktree(base) as source, Harness(pinning=HARNESS_PINNING) as harness:
        targets = {
            BARE: harness.start_bare(BARE, minimal=True),
            BASE: harness.start_gateway(
                harness.database(BASE, source), BASE, settings.get(BASE), source=source
            ),
            HEAD: harness.start_gateway(harness.database(HEAD), HEAD, settings.get(HEAD)),
        }
        for name in (BASE, HEAD):
            targets[name].put_sku(SOLD_OUT_SKU, SMALL_SALE)
            put_in_stock(targets[name], (sku_fields or {}).get(name, {}))
            if (group_sizes or {}).get(name):
                put_group(targets[name], (group_sizes or {})[name])
            sell_out(
                targets[name],
                SOLD_OUT_SKU,
                SMALL_SALE,
                connections=CONNECTIONS,
                pinning=HARNESS_PINNING,
                tag=f"{harness.run_id}{name}",
            )
        seen = _rounds(targets, paths, rounds, seconds, harness.run_id)
        print(f"\nA/B: head ({REPO_ROOT}) against base {base}, {rounds} rounds of {seconds:g} s")
        for name in (BASE, HEAD):
            if settings.get(name):
                print(f"{name} settings: {dict(settings[name])}")
            if (sku_fields or {}).get(name):
                print(f"{name} in-stock sku: {dict((sku_fields or {})[name])}")
            if (group_sizes or {}).get(name):
                print(f"{name} skus: in a limit group of {(group_sizes or {})[name]} skus, limit 1")
        print(
            "| path | target | req/s median (min-max) | CPU µs/request median (min-max)"
            " | p99 ms median (min-max) |"
        )
        print("|---|---|--:|--:|--:|")
        for (name, path), runs in seen.items():
            print(
                f"| {path} | {name} | {_summary([r[0] for r in runs])}"
                f" | {_summary([r[1] for r in runs])} | {_summary([r[2] for r in runs])} |"
            )
        if open_rates:
            _open_runs(targets, paths, open_rates, seconds, harness.run_id)
        for path in paths:
            pairs = list(zip(seen[(HEAD, path)], seen[(BASE, path)], strict=True))
            rps = [h[0] / b[0] for h, b in pairs]
            cpu = [h[1] / b[1] for h, b in pairs]
            print(
                f"{path}: head/base req/s per round {_summary(rps, 3)}; "
                f"CPU per request {_summary(cpu, 3)}"
            )


def _rounds(
    targets: Mapping[str, Target], paths: Sequence[str], rounds: int, seconds: float, run_id: str
) -> dict[tuple[str, str], list[tuple[float, float, float]]]:
    """The closed-loop rounds: (target, path) -> (req/s, CPU µs a request, p99 ms) per round."""
    seen: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for round_ in range(rounds):
        for path in paths:
            order = [BARE, BASE, HEAD] if path == SOLD_OUT else [BASE, HEAD]
            if round_ % 2:
                order.reverse()
            for name in order:
                tag = f"{run_id}r{round_}{name}{path}"
                seen.setdefault((name, path), []).append(measure(targets[name], path, seconds, tag))
        print(f"  round {round_ + 1}/{rounds} done", flush=True)
    return seen


def _open_runs(
    targets: Mapping[str, Target],
    paths: Sequence[str],
    rates: Sequence[int],
    seconds: float,
    run_id: str,
) -> None:
    """Open-loop runs at each rate, base then head, printed as a table."""
    print("| path | rate/s | target | sent/s | p50 ms | p99 ms | p99.9 ms |")
    print("|---|--:|---|--:|--:|--:|--:|")
    for path in paths:
        for rate in rates:
            for name in (BASE, HEAD):
                tag = f"{run_id}o{rate}{name}{path}"
                r = drive_open(targets[name], path, 0.0, rate, seconds, HARNESS_PINNING, tag)
                lat, sent = r.latency_ms, r.extra["open_loop"]["achieved_rate"]
                print(
                    f"| {path} | {rate:,} | {name} | {sent:,.0f} | {lat['p50']:.2f}"
                    f" | {lat['p99']:.2f} | {lat['p999']:.2f} |",
                    flush=True,
                )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench_ab``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument(
        "--paths", default=SOLD_OUT, help=f"comma-separated: {SOLD_OUT}, {IN_STOCK}"
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    for name in (BASE, HEAD):
        parser.add_argument(
            f"--{name}-setting",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=f"a GATEWAY_* variable for the {name} gateway only (repeatable)",
        )
        parser.add_argument(
            f"--{name}-sku-field",
            action="append",
            default=[],
            metavar="NAME=JSON",
            help=f"a field of the {name} gateway's in-stock sku (repeatable)",
        )
        parser.add_argument(
            f"--{name}-limit-group",
            type=int,
            default=0,
            metavar="N",
            help=f"put the {name} gateway's bench skus in a limit group of N skus (limit 1)",
        )
    parser.add_argument(
        "--open-rates",
        default="",
        help="comma-separated requests/s: open-loop runs of both gateways after the rounds",
    )
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    if not set(paths) <= {SOLD_OUT, IN_STOCK}:
        parser.error(f"--paths: {SOLD_OUT} and/or {IN_STOCK}")
    settings: dict[str, dict[str, str]] = {}
    for name, given in ((BASE, args.base_setting), (HEAD, args.head_setting)):
        for item in given:
            key, sep, value = item.partition("=")
            if not sep or not key.startswith("GATEWAY_"):
                parser.error(f"--{name}-setting: GATEWAY_NAME=VALUE, not {item!r}")
            settings.setdefault(name, {})[key] = value
    sku_fields: dict[str, dict[str, object]] = {}
    for name, given in ((BASE, args.base_sku_field), (HEAD, args.head_sku_field)):
        for item in given:
            key, sep, value = item.partition("=")
            try:
                parsed = json.loads(value) if sep else None
            except ValueError:
                sep = ""
            if not sep:
                parser.error(f"--{name}-sku-field: NAME=JSON, not {item!r}")
            sku_fields.setdefault(name, {})[key] = parsed
    with signals_interrupt():
        rates = [int(r) for r in args.open_rates.split(",") if r]
        sizes = {BASE: args.base_limit_group, HEAD: args.head_limit_group}
        run(args.base, paths, args.rounds, args.seconds, settings, rates, sku_fields, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
