"""The events' settings: defaults, and the configurations refused at start,
each by the CLI with one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.settings import is_loopback, load

SECRET = "0123456789abcdef"


def test_defaults() -> None:
    """No webhook, no RabbitMQ; a webhook times out at 5 s and gives up after 3 days."""
    s = load({})
    assert (s.webhook_url, s.webhook_secret, s.events_amqp_url) == (None, None, None)
    assert (s.webhook_timeout_s, s.webhook_max_age_s, s.webhook_allow_http) == (
        5.0,
        259_200.0,
        False,
    )
    assert s.events_amqp_exchange == "flashsale.events"


@pytest.mark.parametrize(
    ("env", "replicas"),
    [
        ({}, 0),
        ({"GATEWAY_REDIS_SENTINELS": "127.0.0.1:26379"}, 1),
        ({"GATEWAY_REDIS_CLUSTER_NODES": "127.0.0.1:7000"}, 1),
        ({"GATEWAY_REDIS_SENTINELS": "127.0.0.1:26379", "GATEWAY_EVENTS_STREAM_REPLICAS": "0"}, 0),
        ({"GATEWAY_EVENTS_STREAM_REPLICAS": "2"}, 2),
    ],
)
def test_a_stream_append_waits_for_a_replica_where_redis_fails_over(
    env: dict[str, str], replicas: int
) -> None:
    """Unset, GATEWAY_EVENTS_STREAM_REPLICAS is 1 with Sentinels or a Cluster (a
    failover could lose an append the primary alone held), 0 on one Redis."""
    assert load(env).stream_replicas == replicas


def test_a_negative_replica_count_is_refused() -> None:
    with pytest.raises(ValueError, match="GATEWAY_EVENTS_STREAM_REPLICAS"):
        load({"GATEWAY_EVENTS_STREAM_REPLICAS": "-1"})


@pytest.mark.parametrize(
    "url",
    [
        "https://shop.example/hooks",
        "http://127.0.0.1:8000/h",
        "http://127.8.9.1/h",
        "http://[::1]/h",
        "http://localhost:9/h",
    ],
)
def test_accepted_webhooks(url: str) -> None:
    """https anywhere, plain http to loopback, each with its secret."""
    assert load({"GATEWAY_WEBHOOK_URL": url, "GATEWAY_WEBHOOK_SECRET": SECRET}).webhook_url == url


def test_plain_http_elsewhere_when_allowed() -> None:
    """GATEWAY_WEBHOOK_ALLOW_HTTP=true lets plain http reach any host."""
    env = {
        "GATEWAY_WEBHOOK_URL": "http://10.0.0.5/h",
        "GATEWAY_WEBHOOK_SECRET": SECRET,
        "GATEWAY_WEBHOOK_ALLOW_HTTP": "true",
    }
    assert load(env).webhook_url == "http://10.0.0.5/h"


def test_loopback() -> None:
    """Loopback is localhost, 127.0.0.0/8 and ::1; a name that merely starts so is not."""
    assert all(map(is_loopback, ["localhost", "127.0.0.1", "127.255.0.9", "::1"]))
    assert not any(map(is_loopback, ["127.0.0.1.example", "10.0.0.1", "::2", "localhost.example"]))


REFUSED = {
    "no-secret": (
        {"GATEWAY_WEBHOOK_URL": "https://shop.example/h"},
        "GATEWAY_WEBHOOK_URL=https://shop.example/h: needs GATEWAY_WEBHOOK_SECRET",
    ),
    "http-not-loopback": (
        {"GATEWAY_WEBHOOK_URL": "http://user:pw@shop.example/h", "GATEWAY_WEBHOOK_SECRET": SECRET},
        "GATEWAY_WEBHOOK_URL=http://user:***@shop.example/h: plain http to a host that is not"
        " loopback; use https, or set GATEWAY_WEBHOOK_ALLOW_HTTP=true",
    ),
    "not-http": (
        {"GATEWAY_WEBHOOK_URL": "ftp://shop.example/h", "GATEWAY_WEBHOOK_SECRET": SECRET},
        "GATEWAY_WEBHOOK_URL='ftp://shop.example/h': must be an http(s) URL with a host",
    ),
    "short-secret": (
        {"GATEWAY_WEBHOOK_URL": "https://shop.example/h", "GATEWAY_WEBHOOK_SECRET": "short"},
        "GATEWAY_WEBHOOK_SECRET='short': must be at least 16 characters",
    ),
    "not-amqp": (
        {"GATEWAY_EVENTS_AMQP_URL": "http://127.0.0.1:5672/"},
        "GATEWAY_EVENTS_AMQP_URL='http://127.0.0.1:5672/': must be a URL with scheme amqp or amqps",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_the_cli_refuses_with_one_line(case: str) -> None:
    """Each refused configuration stops every command before it starts: exit
    status 2 and one line on stderr naming the setting (password masked)."""
    env, line = REFUSED[case]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, **env},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flashsale-gateway: {line}"), proc.stderr
