"""Settings: defaults, environment, flags, and one-line errors naming the setting."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import fields
from ipaddress import ip_network

import pytest

from gateway.domain.model import Strategy
from gateway.domain.rules import Rate
from gateway.settings import (
    PARSE,
    Misconfigured,
    Settings,
    SettingsError,
    add_arguments,
    env_name,
    from_args,
    load,
    masked,
)


def test_defaults() -> None:
    """Without environment the documented defaults apply."""
    s = load({})
    assert (s.host, s.port, s.key_prefix, s.batch_max, s.batch_wait_ms) == (
        "127.0.0.1",
        8080,
        "fs",
        256,
        0.0,
    )
    assert s.admin_token is None
    assert s.flush_lock == "redis"


def test_environment_and_flags() -> None:
    """Environment variables set values; a flag wins over the environment."""
    s = load({"GATEWAY_BATCH_MAX": "64", "GATEWAY_PORT": "9000"}, {"port": "9100"})
    assert (s.batch_max, s.port) == (64, 9100)


def test_a_renamed_setting_is_read_under_its_former_name() -> None:
    """GATEWAY_BACKLOG_MAX was GATEWAY_QUEUE_MAX (and --queue-max): the former
    names still set it, and the new ones win over them."""
    assert load({"GATEWAY_QUEUE_MAX": "7"}).backlog_max == 7
    both = {"GATEWAY_QUEUE_MAX": "7", "GATEWAY_BACKLOG_MAX": "9"}
    assert load(both).backlog_max == 9
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(["--queue-max", "5"], parser).backlog_max == 5
    with pytest.raises(SettingsError, match=r"^GATEWAY_QUEUE_MAX='none'"):
        load({"GATEWAY_QUEUE_MAX": "none"})


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GATEWAY_BATCH_MAX": "zero"}, "GATEWAY_BATCH_MAX"),
        ({"GATEWAY_BATCH_MAX": "0"}, "GATEWAY_BATCH_MAX"),
        ({"GATEWAY_BATCH_WAIT_MS": "nan"}, "GATEWAY_BATCH_WAIT_MS"),
        ({"GATEWAY_REDIS_URL": "http://x"}, "GATEWAY_REDIS_URL"),
        ({"GATEWAY_DATABASE_URL": "mysql://x"}, "GATEWAY_DATABASE_URL"),
        ({"GATEWAY_FLUSH_LOCK": "etcd"}, "GATEWAY_FLUSH_LOCK"),
        ({"GATEWAY_ZOOKEEPER_HOSTS": "zk1"}, "GATEWAY_ZOOKEEPER_HOSTS"),
        ({"GATEWAY_ADMIN_TOKEN": ""}, "GATEWAY_ADMIN_TOKEN"),
        ({"GATEWAY_REBUILD_SHARE": "0"}, "GATEWAY_REBUILD_SHARE"),
        ({"GATEWAY_REBUILD_SHARE": "1.5"}, "GATEWAY_REBUILD_SHARE"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], named: str) -> None:
    """A bad value raises one line that names the setting and the value."""
    with pytest.raises(SettingsError) as info:
        load(env)
    message = str(info.value)
    assert message.startswith(named)
    assert "\n" not in message


def test_cli_fails_at_start_with_one_line() -> None:
    """The CLI prints the error on one line and exits 2 without serving."""
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--batch-max", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--batch-max" in lines[0]


def test_settings_are_frozen() -> None:
    """Settings cannot change after start."""
    s = Settings()
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


def test_sentinels() -> None:
    """GATEWAY_REDIS_SENTINELS is a list of host:port; a malformed one is refused."""
    s = load({"GATEWAY_REDIS_SENTINELS": "127.0.0.1:26379, localhost:26380"})
    assert s.redis_sentinels == (("127.0.0.1", 26379), ("localhost", 26380))
    assert load({}).redis_sentinels == ()
    with pytest.raises(SettingsError, match="GATEWAY_REDIS_SENTINELS"):
        load({"GATEWAY_REDIS_SENTINELS": "nohost"})


def test_cluster_nodes() -> None:
    """GATEWAY_REDIS_CLUSTER_NODES is a list of host:port, refused beside Sentinels."""
    s = load({"GATEWAY_REDIS_CLUSTER_NODES": "127.0.0.1:7000,127.0.0.1:7001"})
    assert s.redis_cluster_nodes == (("127.0.0.1", 7000), ("127.0.0.1", 7001))
    assert load({}).redis_cluster_nodes == ()
    with pytest.raises(SettingsError, match="GATEWAY_REDIS_CLUSTER_NODES"):
        load({"GATEWAY_REDIS_CLUSTER_NODES": "7000"})
    both = {"GATEWAY_REDIS_CLUSTER_NODES": "h:1", "GATEWAY_REDIS_SENTINELS": "h:2"}
    with pytest.raises(SettingsError, match="not both"):
        load(both)


def test_a_release_outlasts_the_reservation_timeout() -> None:
    """GATEWAY_RELEASE_RETENTION_S below GATEWAY_RESERVATION_TIMEOUT_S is refused in
    one line naming both: a release pruned first could let a late flush commit."""
    short = {"GATEWAY_RELEASE_RETENTION_S": "10", "GATEWAY_RESERVATION_TIMEOUT_S": "30"}
    with pytest.raises(SettingsError) as refused:
        load(short)
    assert str(refused.value) == (
        "GATEWAY_RELEASE_RETENTION_S=10: must be at least GATEWAY_RESERVATION_TIMEOUT_S=30"
    )
    assert load({"GATEWAY_RELEASE_RETENTION_S": "30"}).release_retention_s == 30.0


def test_a_batch_waits_well_within_the_reservation_timeout() -> None:
    """GATEWAY_BATCH_WAIT_MS of half GATEWAY_RESERVATION_TIMEOUT_S or more is
    refused naming both: the reconciler would give back batches still waiting."""
    long = {"GATEWAY_BATCH_WAIT_MS": "500", "GATEWAY_RESERVATION_TIMEOUT_S": "1"}
    with pytest.raises(SettingsError) as refused:
        load(long)
    assert str(refused.value) == (
        "GATEWAY_BATCH_WAIT_MS=500: must be below half of GATEWAY_RESERVATION_TIMEOUT_S=1"
        " (in ms), or the reconciler gives back batches still waiting"
    )
    assert load({**long, "GATEWAY_BATCH_WAIT_MS": "499"}).batch_wait_ms == 499.0


def test_strategy_and_the_optimistic_budget() -> None:
    """GATEWAY_STRATEGY defaults to reserve-batch and takes each strategy's name;
    the optimistic budget is read too; an unknown strategy names the setting."""
    assert load({}).strategy is Strategy.RESERVE_BATCH
    s = load(
        {"GATEWAY_STRATEGY": "optimistic", "GATEWAY_OPTIMISTIC_ATTEMPTS": "3"},
        {"optimistic_backoff_ms": "1.5"},
    )
    assert (s.strategy, s.optimistic_attempts, s.optimistic_backoff_ms) == (
        Strategy.OPTIMISTIC,
        3,
        1.5,
    )
    with pytest.raises(SettingsError, match=r"^GATEWAY_STRATEGY='fastest': must be one of"):
        load({"GATEWAY_STRATEGY": "fastest"})
    with pytest.raises(SettingsError, match=r"^GATEWAY_OPTIMISTIC_ATTEMPTS"):
        load({"GATEWAY_OPTIMISTIC_ATTEMPTS": "0"})


def test_every_setting_is_declared_with_its_parser() -> None:
    """Each field of Settings carries the parser of its text (a parser without
    a field cannot exist: it is given where the field is declared)."""
    for f in fields(Settings):
        assert callable(f.metadata.get(PARSE)), f"{f.name} has no parser"


def test_text_is_parsed_once_into_the_values_the_gateway_uses() -> None:
    """Rates, networks and host:port lists are held parsed, not as their text."""
    s = load(
        {
            env_name("user_rate"): "2/s:4",
            env_name("trusted_proxies"): "10.0.0.0/8, ::1",
        }
    )
    assert s.user_rate == Rate(2, 4)
    assert s.client_rate is None
    assert s.trusted_proxies == (ip_network("10.0.0.0/8"), ip_network("::1"))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:pw@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        (
            "postgresql://app@db/x?password=pw&sslmode=require",
            "postgresql://app@db/x?password=***&sslmode=require",
        ),
        ("postgresql://a:pw@h1:5432,h2:5432/x", "postgresql://a:***@h1:5432,h2:5432/x"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("unix:///run/redis.sock?db=2", "unix:///run/redis.sock?db=2"),
    ],
)
def test_a_url_is_shown_with_its_password_masked(url: str, shown: str) -> None:
    """A password in the authority or in the query is shown as ***; a URL
    without one is shown exactly as set."""
    assert masked(url) == shown


def test_a_misconfiguration_is_one_line_naming_setting_and_url() -> None:
    """The message is the setting, its masked URL and the finding; it is a
    SettingsError, like any other setting the gateway cannot run with."""
    exc = Misconfigured("database_url", "postgresql://a:pw@h:6379/x", "not PostgreSQL")
    assert str(exc) == "GATEWAY_DATABASE_URL=postgresql://a:***@h:6379/x: not PostgreSQL"
    assert isinstance(exc, SettingsError) and exc.final
