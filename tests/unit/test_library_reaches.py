"""Where the gateway reaches past a library's public API, the release it was read from.

Three libraries are reached into, each pinned to one release in pyproject.toml:

- redis-py: ``gateway.redis.scripts._send`` is ``send_packed_command`` with its
  write bounded in the caller's task, calling the private ``_send_packed_command``;
  ``_take_buffered`` takes the replies already in the hiredis parser's reader
  as its ``read_response`` does (and ``gateway.lock.subscriber`` drives a
  connection below the client);
- aiohttp: ``gateway.http.fastpath`` swaps ``web.Server.request_handler`` after
  start-up, and ``gateway.http.limits`` subclasses ``RequestHandler`` (reading
  its ``_messages``, ``_current_request`` and ``_loop``) and ``BaseSite``
  (``_runner``, ``_backlog``, ``_server``), listening as ``TCPSite.start`` does;
- prometheus_client: ``gateway.ops.event_metrics.observe_many`` is
  ``Histogram.observe`` for many values at once, on its ``_upper_bounds``,
  ``_buckets`` and ``_sum``.

A failure here after an upgrade is the signal to read the library's new code,
bring the reach in line, and only then move the pin and the digests below.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import tomllib
import typing
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import hiredis
import pytest
from aiohttp import StreamReader, web, web_protocol
from packaging.requirements import Requirement
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess, values
from redis._parsers.hiredis import _AsyncHiredisParser
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, Connection, ConnectionPool

from gateway.ops.event_metrics import LAG_BUCKETS, observe_many
from gateway.redis.scripts import _send

ROOT = Path(__file__).resolve().parents[2]
# sha256 of the source each reach mirrors, in the pinned release.
SEND_PACKED_COMMAND = "baaeabd916209157db40455f034a0bac6fb3e2db902271313e0702bcbc678321"
HIREDIS_ON_CONNECT = "5c7b848496314124f40e3684eca6edab6a0435a46cae9e62980eb497516db013"
HIREDIS_READ_RESPONSE = "6cba18b62d2aad4dfe9e4be4e3bbb834ba4728640cbba421587e31bc096b2315"
READ_RESPONSE = "c1b374bc1a30d0b4f987af86e3ce475a1a1288382dc140b39f436d25beebe5d4"
HISTOGRAM_OBSERVE = "38beca3be1d1595b61a274180f55537000e15133ead54fa07e303a86d9ceca39"
TCP_SITE_START = "0baaeca3d4f956ad5e5e05e7379dce04b117f2386f53640463e7879325d8c654"


def _digest(function: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def _parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize("name", ["redis", "aiohttp", "prometheus-client"])
def test_a_reached_library_is_pinned_to_the_installed_release(name: str) -> None:
    """pyproject.toml pins the library to one release, and that release is installed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [r for r in map(Requirement, project["dependencies"]) if r.name == name]
    [spec] = pin.specifier
    assert spec.operator == "==", f"{name} must be pinned: its internals are reached into"
    assert metadata.version(name) == spec.version


def test_histogram_observe_is_the_one_observe_many_mirrors() -> None:
    """prometheus_client's ``Histogram.observe`` is the code ``observe_many`` does
    for many values (a bucket per value: the first bound at least the value)."""
    assert _digest(Histogram.observe) == HISTOGRAM_OBSERVE


@pytest.mark.parametrize("workers", [False, True])
def test_observe_many_counts_as_observe_does(
    workers: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values on the bounds, between them, past the last and at 0, observed one
    by one into one histogram and all at once into another: the same buckets,
    count and sum, in one process and in the files several workers share."""
    observed = [0.0, 0.01, 0.011, 0.1, 0.25, 0.2501, 59.0, 3600.0, 7200.5, 0.05, 0.05]
    exposed = []
    for observe in (None, observe_many):
        directory = tmp_path / ("one" if observe is None else "many")
        if workers:
            # A value class of its own per histogram: it keeps its files open.
            directory.mkdir()
            monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
            value_class = values.MultiProcessValue(lambda: 1)  # type: ignore[no-untyped-call]
            monkeypatch.setattr(values, "ValueClass", value_class)
        registry = CollectorRegistry()
        histogram = Histogram("lag", "x", ["sink"], buckets=LAG_BUCKETS, registry=registry)
        child = histogram.labels("stream")
        if observe is None:
            for value in observed:
                child.observe(value)
        else:
            observe(child, observed)
        if workers:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
        text = generate_latest(registry).decode()
        exposed.append([line for line in text.splitlines() if "_created" not in line])
    assert exposed[0] == exposed[1]
    assert 'lag_bucket{le="0.01",sink="stream"} 2.0' in exposed[1]
    assert 'lag_count{sink="stream"} 11.0' in exposed[1]


def test_send_packed_command_is_the_one_send_mirrors() -> None:
    """redis-py's ``send_packed_command`` is the code ``_send`` was copied from."""
    assert _digest(AbstractConnection.send_packed_command) == SEND_PACKED_COMMAND


def test_the_reader_take_buffered_reads_is_the_one_read_response_reads() -> None:
    """The hiredis parser's reader (its not-enough-data sentinel, error replies
    as exceptions), what its ``read_response`` does with a reply (a
    ConnectionError raised, a push to its handler) and the connection's
    ``read_response`` (the timeout, the health check's clock, a ResponseError
    raised): the code ``_take_buffered`` was read from."""
    assert _digest(_AsyncHiredisParser.on_connect) == HIREDIS_ON_CONNECT
    assert _digest(_AsyncHiredisParser.read_response) == HIREDIS_READ_RESPONSE
    assert _digest(AbstractConnection.read_response) == READ_RESPONSE
    assert isinstance(Connection()._parser, _AsyncHiredisParser)


def test_the_redis_internals_send_calls_keep_their_shape() -> None:
    """The private write, the connect without a health check, the pool and the retry
    take what ``evalsha_many`` and ``_send`` pass them."""
    assert _parameters(AbstractConnection._send_packed_command) == ["self", "command"]
    connect = inspect.signature(AbstractConnection.connect_check_health).parameters
    assert connect["check_health"].default is True
    assert inspect.signature(AbstractConnection.disconnect).parameters["nowait"].default is False
    assert isinstance(inspect.getattr_static(AbstractConnection, "is_connected"), property)
    assert _parameters(ConnectionPool.get_connection)[:2] == ["self", "command_name"]
    retry = inspect.signature(Connection().retry.call_with_retry).parameters
    assert list(retry)[:2] == ["do", "fail"] and retry["with_failure_count"].default is False


def test_the_connection_calls_of_the_locks_subscriber_keep_their_shape() -> None:
    """gateway.lock.subscriber drives one connection itself: an unbounded read that
    takes push messages, on a cluster node's connection taken and given back."""
    read = inspect.signature(AbstractConnection.read_response).parameters
    assert {"timeout", "push_request"} <= set(read)
    assert callable(ClusterNode.acquire_connection) and callable(ClusterNode.release)


def test_hiredis_packs_a_call_as_redis_py_would() -> None:
    """The EVALSHAs hiredis packs are the bytes redis-py's own packer writes."""
    call = ("EVALSHA", "a" * 40, 2, "{s}:stock", b"{s}:seen", 7, 1.5, -3, "é")
    assert hiredis.pack_command(call) == b"".join(Connection().pack_command(*call))  # type: ignore[arg-type]


class _Interrupted(BaseException):
    """Stands for a cancellation arriving mid-write."""


@dataclass
class _Writer:
    """A stream writer whose drain succeeds, fails with ``fails`` or never ends."""

    fails: BaseException | None = None
    stalls: bool = False
    written: list[bytes] = field(default_factory=list)
    drained_in: asyncio.Task[Any] | None = None

    def writelines(self, chunks: Iterable[bytes]) -> None:
        self.written.extend(chunks)

    async def drain(self) -> None:
        self.drained_in = asyncio.current_task()
        if self.fails is not None:
            raise self.fails
        if self.stalls:
            await asyncio.Event().wait()

    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


SCENARIOS: dict[str, Callable[[], _Writer]] = {
    "written": _Writer,
    "broken pipe": lambda: _Writer(fails=BrokenPipeError(32, "Broken pipe")),
    "reset": lambda: _Writer(fails=ConnectionResetError("Connection lost")),
    "stalled": lambda: _Writer(stalls=True),
    "interrupted": lambda: _Writer(fails=_Interrupted()),
}


async def _outcome(
    send: Callable[[AbstractConnection, bytes], Any], writer: _Writer, connected: bool
) -> tuple[object, ...]:
    """What a write through ``send`` did: what it called, wrote and raised, and
    whether the connection stayed open."""
    conn: Any = Connection(socket_timeout=0.01)
    calls: list[tuple[str, dict[str, Any]]] = []

    async def connect_check_health(**kwargs: Any) -> None:
        calls.append(("connect_check_health", kwargs))
        conn._reader, conn._writer = object(), writer

    async def connect() -> None:  # pragma: no cover - only a drifted copy calls it
        calls.append(("connect", {}))
        conn._reader, conn._writer = object(), writer

    async def check_health() -> None:
        calls.append(("check_health", {}))

    conn.connect_check_health, conn.connect, conn.check_health = (
        connect_check_health,
        connect,
        check_health,
    )
    if connected:
        conn._reader, conn._writer = object(), writer
    try:
        await send(conn, b"*1\r\n$4\r\nPING\r\n")
        raised: tuple[object, str] | None = None
    except BaseException as exc:
        raised = (type(exc), str(exc))
    outcome = (tuple(calls), tuple(writer.written), raised, conn.is_connected)
    await conn.disconnect(nowait=True)
    return outcome


@pytest.mark.parametrize("connected", [True, False], ids=["connected", "not connected"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_send_does_what_send_packed_command_does(scenario: str, connected: bool) -> None:
    """Connecting, the health check, the write, and on a failed write the
    disconnect and the error raised: the same through ``_send`` as through redis-py."""

    def library(conn: AbstractConnection, packed: bytes) -> Any:
        return conn.send_packed_command(packed)

    theirs = await _outcome(library, SCENARIOS[scenario](), connected)
    ours = await _outcome(_send, SCENARIOS[scenario](), connected)
    assert ours == theirs


async def test_send_writes_in_the_callers_task() -> None:
    """The one difference ``_send`` exists for: the bounded write is not a task of its own."""
    writer = _Writer()
    await _outcome(_send, writer, connected=True)
    assert writer.written and writer.drained_in is asyncio.current_task()


@pytest.fixture
async def server() -> web.Server:
    async def handler(request: web.BaseRequest) -> web.StreamResponse:  # pragma: no cover
        return web.Response()

    return web.Server(handler)


async def test_a_connection_accepted_after_the_swap_is_served_by_the_new_handler(
    server: web.Server,
) -> None:
    """aiohttp's protocol takes the server's ``request_handler`` when it is built
    (a connection accepted), so assigning it after start-up takes effect."""

    async def swapped(request: web.BaseRequest) -> web.StreamResponse:  # pragma: no cover
        return web.Response()

    server.request_handler = swapped
    handler = web_protocol.RequestHandler(server, loop=asyncio.get_running_loop())
    assert handler._request_handler is swapped


async def test_what_the_limited_handler_reads_of_aiohttps_is_there(server: web.Server) -> None:
    """The keyword arguments LimitedSite passes, the attributes LimitedHandler reads
    (a queue of (message, payload) pairs, the request in hand, the loop) and the
    error hook it overrides."""
    loop = asyncio.get_running_loop()
    # LimitedSite's keywords, access_log=None included (typed Logger, taken as none).
    kwargs: dict[str, Any] = {"access_log": None, "max_line_size": 1, "max_field_size": 1}
    handler = web_protocol.RequestHandler(server, loop=loop, max_headers=1, **kwargs)
    assert handler._messages == deque() and handler._current_request is None
    assert handler._loop is loop
    assert typing.get_args(web_protocol._MsgType)[1] is StreamReader
    handle_error = web_protocol.RequestHandler.handle_error
    assert _parameters(handle_error) == ["self", "request", "status", "exc", "message"]


def test_the_limited_site_listens_as_tcp_site_does() -> None:
    """``LimitedSite.start`` is ``TCPSite.start`` with its own handlers, on the
    private fields of ``BaseSite`` it sets."""
    assert {"_runner", "_backlog", "_server"} <= set(web.BaseSite.__slots__)
    assert _digest(web.TCPSite.start) == TCP_SITE_START
