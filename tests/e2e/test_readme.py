"""The docs' API examples, run as pasted against a gateway started by ``make run``.

Every fenced ``sh`` block that runs ``curl``, in the README and in every page
of ``docs/`` (today: docs/api.md's "Try it"), is run by bash, each ``curl``
preceded by a ``# expect NNN`` line naming the status it must get. The README
runs first, then the pages in name order, each block in order, against one
gateway: ``make run`` itself starts it (its admin token, admission secret and
demo sku), on this test's port, database and key prefix; nothing else is
configured, so what the docs show is what a newcomer gets.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from testkit.gateways import REPO
from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, free_port
from testkit.processes import Child, make_tmp, remove_tmp, tail
from testkit.services import REDIS_URL, create_database, drop_database

# The address the examples name: make run's.
DOCS_URL = "http://127.0.0.1:8080"
EXPECT = re.compile(r"^# expect (\d{3})\b", re.M)
# A line that runs curl (not a comment).
CURL = re.compile(r"^(?!\s*#).*\bcurl\s", re.M)
# curl writes each answer's status to stderr; the body still goes to stdout.
PRELUDE = "curl() { command curl -w '%{stderr}status %{http_code}\\n' \"$@\"; }\n"


def doc_files() -> list[Path]:
    """The README, then every page of docs/ (and below it) in name order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def curl_blocks() -> list[tuple[str, str]]:
    """(file, block) of each fenced sh block of the docs that runs curl, in order."""
    found: list[tuple[str, str]] = []
    for path in doc_files():
        for block in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
            if CURL.search(block):
                found.append((str(path.relative_to(REPO)), block))
    return found


def test_every_curl_has_an_expected_status() -> None:
    """Each curl of the docs is announced by one ``# expect`` line, so none goes
    unchecked; the API's examples are among them."""
    blocks = curl_blocks()
    assert "docs/api.md" in {name for name, _ in blocks}, "no curl block in docs/api.md"
    for name, block in blocks:
        assert len(EXPECT.findall(block)) == len(CURL.findall(block)), f"{name}:\n{block}"


@pytest.fixture
async def make_run_url(run_id: str) -> AsyncIterator[str]:
    """``make run``'s gateway, on a free port, a fresh database and its own key
    prefix; the admin token and admission secret are the Makefile's own."""
    name = f"flashsale_readme_{run_id}"
    database_url = await create_database(name)
    port, tmp = free_port(), make_tmp("readme")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        GATEWAY_PORT=str(port),
        GATEWAY_HOST=HOST,
        GATEWAY_DATABASE_URL=database_url,
        GATEWAY_REDIS_URL=REDIS_URL,
        GATEWAY_KEY_PREFIX=f"readme{run_id}",
        MAKEFLAGS="",
    )
    # make passes SIGTERM on to the gateway it runs, which then stops gracefully.
    child = Child(["make", "-s", "run"], tmp / "make-run.log", cwd=REPO, env=env)
    child.spawn()
    url = f"http://{HOST}:{port}"
    try:
        await _ready(child, url)
        yield url
    finally:
        await child.stop(signal.SIGTERM, within=20)
        remove_tmp(tmp)
        await drop_database(name)


async def _ready(child: Child, url: str) -> None:
    """Wait for /readyz 200; fails at once, with make's output, if make exits."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as http:

        async def ready() -> bool:
            if not child.running:
                raise GaveUp(f"make run exited:\n{tail(child.log_path)}")
            async with http.get(f"{url}/readyz") as response:
                return response.status == 200

        await wait_for(ready, within=90, what="make run's /readyz")


async def test_doc_examples_answer_as_documented(make_run_url: str) -> None:
    """Every curl of the docs gets the status its ``# expect`` line says, run in
    order, as pasted, against ``make run``'s gateway."""
    for name, block in curl_blocks():
        script = PRELUDE + block.replace(DOCS_URL, make_run_url)
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            script,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        got = re.findall(r"^status (\d{3})$", err.decode(), re.M)
        expected = EXPECT.findall(block)
        steps = list(zip(expected, got, strict=False))
        assert got == expected, (
            f"{name}: example statuses differ (expected, got): {steps}\n"
            f"stdout:\n{out.decode()}\nstderr:\n{err.decode()}"
        )
