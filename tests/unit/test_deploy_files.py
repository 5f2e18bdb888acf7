"""The deployment files, checked without a container engine (none runs here).

compose.yaml, Prometheus, Alertmanager and Grafana files parse and name files
that exist; compose refuses to start without its secrets and publishes only the
public door beyond loopback; the HAProxy config compose mounts is the one the
native HAProxy test runs, with the long poll's timeout and JSON errors; the
alert rules and dashboard query the metrics the gateway exports; the Dockerfile
builds a wheel at the lock's versions, runs as non-root, checks /readyz and
stops on SIGTERM. ``make run`` honours the environment's admin token and
admission secret and installs only what serving needs, at the lock's versions;
``make lock`` writes the lock; scripts/services.sh checks the addresses the
URLs name.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.server import CLOSE_S
from gateway.usecases.tracking import MAX_WAIT_S
from testkit.haproxy import CONFIG
from testkit.ports import HOST, free_port

ROOT = Path(__file__).resolve().parents[2]


def load(path: str) -> Any:
    """A YAML file of the repository."""
    return yaml.safe_load((ROOT / path).read_text())


COMPOSE = load("compose.yaml")
SERVICES: dict[str, Any] = COMPOSE["services"]
GATEWAYS = sorted(name for name in SERVICES if name.startswith("gateway"))


def mounts(service: str) -> dict[str, Path]:
    """A service's bind mounts: container path -> host path."""
    found = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            found[target] = (ROOT / source).resolve()
    return found


def test_compose_has_the_whole_topology_and_its_files_exist() -> None:
    """Stores, two gateways, HAProxy, Prometheus, Grafana; every mounted file exists."""
    assert set(SERVICES) >= {"postgres", "redis", "haproxy", "prometheus", "grafana"}
    assert GATEWAYS == ["gateway1", "gateway2"]
    for service in SERVICES:
        for host_path in mounts(service).values():
            assert host_path.exists(), f"{service} mounts missing {host_path}"


def test_haproxy_in_compose_runs_the_tested_config() -> None:
    """compose mounts deploy/haproxy.cfg, the file tests/e2e/test_haproxy.py runs,
    whose default gateway addresses are compose's gateway services."""
    assert CONFIG.resolve() in mounts("haproxy").values()
    defaults = re.findall(r'server gw\d "\$\{GW\d_ADDR-([^}]+)\}"', CONFIG.read_text())
    assert defaults == [f"{name}:8080" for name in GATEWAYS]


def test_gateways_trust_haproxy_and_outlast_their_stop() -> None:
    """Each gateway trusts exactly HAProxy's address, and the engine waits longer
    than lame duck plus drain before killing it."""
    haproxy_ip = ipaddress.ip_address(SERVICES["haproxy"]["networks"]["flashsale"]["ipv4_address"])
    for name in GATEWAYS:
        env = SERVICES[name]["environment"]
        assert haproxy_ip in ipaddress.ip_network(env["GATEWAY_TRUSTED_PROXIES"])
        stop_s = float(env["GATEWAY_LAME_DUCK_S"]) + float(env["GATEWAY_DRAIN_S"]) + CLOSE_S
        assert float(SERVICES[name]["stop_grace_period"].removesuffix("s")) > stop_s


def test_prometheus_scrapes_every_gateway_and_loads_the_alerts() -> None:
    """One target per gateway service; it loads every ``*.yml`` of deploy/rules/,
    mounted whole, and those are rule files alone (promtool's tests are in
    deploy/rules/tests/, which the glob does not reach): sale.yml, locks.yml
    (the lease rule of thumb), loop.yml and events.yml."""
    config = load("deploy/prometheus.yml")
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "flashsale-gateway"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [f"{name}:8080" for name in GATEWAYS]
    [pattern] = config["rule_files"]
    folder, _, glob = pattern.rpartition("/")
    rules = sorted(mounts("prometheus")[folder].glob(glob))
    assert [p.name for p in rules] == ["events.yml", "locks.yml", "loop.yml", "sale.yml"]
    for path in rules:
        groups = yaml.safe_load(path.read_text())["groups"]
        assert set(groups[0]) == {"name", "rules"} and groups[0]["rules"], path
    [lease] = load("deploy/rules/locks.yml")["groups"][0]["rules"]
    # The metrics it compares are the ones gateway/ops/metrics.py exports.
    assert "flashsale_lock_hold_seconds_bucket" in lease["expr"]
    assert "flashsale_lock_lease_seconds) / 3" in lease["expr"]


def test_grafana_provisions_the_datasource_and_dashboard() -> None:
    """The dashboard provider's folder holds docs/grafana/flashsale.json in the container."""
    provisioning = "deploy/grafana/provisioning"
    [source] = load(f"{provisioning}/datasources/prometheus.yml")["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    [provider] = load(f"{provisioning}/dashboards/flashsale.yml")["providers"]
    dashboard = mounts("grafana")[f"{provider['options']['path']}/flashsale.json"]
    assert json.loads(dashboard.read_text())["uid"] == "flashsale-gateway"


def test_dockerfile_builds_a_wheel_for_a_non_root_runtime() -> None:
    """Multi-stage, a wheel installed (never editable) at the lock's versions,
    non-root, /readyz health check, SIGTERM to stop."""
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    assert "pip wheel" in text and not re.search(r"pip install[^\n]* -e\b", text)
    pips = re.findall(r"pip (?:wheel|install) [^&]*", text.replace("\\\n", " "))
    assert len(pips) == 2 and all(re.search(r" -c \S*requirements\.lock ", p) for p in pips)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/readyz", text, re.M)
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)


# ${NAME:?message}: compose stops with the message when NAME is unset or empty.
REQUIRED = re.compile(r"^\$\{(?P<name>\w+):\?[^}]+\}$")


def test_compose_refuses_to_start_without_its_secrets() -> None:
    """The admin token, the admission secret (so waiting rooms work), Grafana's
    admin password and the alert webhook are required variables, each with a
    message: none has a default, and no other variable has one but OPS_ADDR."""
    required = [
        SERVICES[g]["environment"][k]
        for g in GATEWAYS
        for k in ("GATEWAY_ADMIN_TOKEN", "GATEWAY_ADMISSION_SECRET")
    ]
    required.append(SERVICES["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"])
    required.append(COMPOSE["configs"]["alert_webhook_url"]["content"])
    names = [m["name"] if (m := REQUIRED.match(value)) else value for value in required]
    assert names == [
        *["GATEWAY_ADMIN_TOKEN", "GATEWAY_ADMISSION_SECRET"] * len(GATEWAYS),
        "GRAFANA_ADMIN_PASSWORD",
        "ALERT_WEBHOOK_URL",
    ]
    text = (ROOT / "compose.yaml").read_text()
    defaults = set(re.findall(r"\$\{(\w+):?-", text))
    assert defaults == {"OPS_ADDR"}, defaults
    assert "change-me" not in text


def test_only_the_public_door_is_published_beyond_loopback() -> None:
    """HAProxy's 8080 is the one port on every interface; its internal frontend
    and stats, Prometheus, Alertmanager and Grafana are on OPS_ADDR (loopback
    unless set), at the ports deploy/haproxy.cfg binds by default."""
    ops = "${OPS_ADDR:-127.0.0.1}:"
    published = [str(p) for service in SERVICES.values() for p in service.get("ports", [])]
    assert [p for p in published if not p.startswith(ops)] == ["8080:8080"]
    config = CONFIG.read_text()
    assert '"${FRONTEND_ADDR-:8080}"' in config
    for variable, port in (("INTERNAL_ADDR", 8081), ("STATS_ADDR", 8404)):
        assert f'"${{{variable}-:{port}}}"' in config
        assert f"{ops}{port}:{port}" in SERVICES["haproxy"]["ports"]
    for service, port in (("prometheus", 9090), ("alertmanager", 9093), ("grafana", 3000)):
        assert SERVICES[service]["ports"] == [f"{ops}{port}:{port}"]


def test_redis_keeps_its_append_only_file_in_a_named_volume() -> None:
    """Redis runs with AOF, and /data (where the AOF lives) is a named volume."""
    redis = SERVICES["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    [volume] = [v for v in redis["volumes"] if v.endswith(":/data")]
    assert volume.split(":")[0] in COMPOSE["volumes"]


def test_prometheus_sends_its_alerts_to_alertmanager_and_it_to_a_webhook() -> None:
    """Prometheus' alerting names compose's Alertmanager; Alertmanager's only
    receiver posts to the URL file compose writes from ALERT_WEBHOOK_URL."""
    config = load("deploy/prometheus.yml")
    [manager] = config["alerting"]["alertmanagers"]
    assert [t for g in manager["static_configs"] for t in g["targets"]] == ["alertmanager:9093"]
    service = SERVICES["alertmanager"]
    [config_file] = [a for a in service["command"] if a.startswith("--config.file=")]
    alertmanager = mounts("alertmanager")[config_file.partition("=")[2]]
    routes = yaml.safe_load(alertmanager.read_text())
    [receiver] = routes["receivers"]
    assert routes["route"]["receiver"] == receiver["name"]
    assert {r["receiver"] for r in routes["route"].get("routes", [])} <= {receiver["name"]}
    [webhook] = receiver["webhook_configs"]
    [url_file] = service["configs"]
    assert url_file == {"source": "alert_webhook_url", "target": webhook["url_file"]}


def test_the_event_loop_lag_alert() -> None:
    """p99 of flashsale_event_loop_lag_seconds per instance over 100 ms for a
    minute, from the rate of its buckets."""
    [rule] = load("deploy/rules/loop.yml")["groups"][0]["rules"]
    expr = " ".join(rule["expr"].split())
    assert expr.startswith("histogram_quantile(0.99, sum by (instance, le) (rate(")
    assert "flashsale_event_loop_lag_seconds_bucket[1m]" in expr
    assert expr.endswith("> 0.1") and rule["for"] == "1m"
    assert rule["labels"]["severity"] == "warning" and rule["annotations"]["summary"]


def test_the_events_behind_alert() -> None:
    """The oldest event owed to a sink, the max over the instances that all
    sample it, over 60 s: at once, since the gauge is itself an age."""
    [rule] = load("deploy/rules/events.yml")["groups"][0]["rules"]
    assert rule["alert"] == "FlashsaleEventsBehind"
    assert rule["expr"].strip() == "max by (sink) (flashsale_outbox_oldest_age_seconds) > 60"
    assert "for" not in rule and rule["labels"]["severity"] == "warning"


def _haproxy_seconds(pattern: str) -> list[int]:
    return [int(n) for n in re.findall(pattern, CONFIG.read_text())]


def test_haproxy_gives_the_long_poll_more_than_its_longest_wait() -> None:
    """GET /v1/orders/... (?wait= up to MAX_WAIT_S) gets a server timeout longer
    than that wait plus the gateway's 5 s pool wait; other routes keep 15 s."""
    [long_poll] = _haproxy_seconds(
        r"http-request set-timeout server (\d+)s if METH_GET \{ path_beg /v1/orders/ \}"
    )
    [default] = _haproxy_seconds(r"\n    timeout server (\d+)s\n")
    assert long_poll >= MAX_WAIT_S + 5 > default == 15


def test_haproxy_answers_its_own_errors_in_json() -> None:
    """Each status HAProxy may answer itself has a JSON {"error","detail"} body;
    502, 503 and 504 carry Retry-After; the 400 and 408 of its HTTP parser,
    which HAProxy 2.6 can only send as HTML or not at all, are not at all."""
    errors = re.findall(
        r"http-error status (\d+) content-type application/json string '([^']+)'(.*)",
        CONFIG.read_text(),
    )
    bodies = {int(status): json.loads(body) for status, body, _ in errors}
    assert set(bodies) == {403, 404, 500, 501, 502, 503, 504}
    assert all(set(body) == {"error", "detail"} for body in bodies.values()), bodies
    retried = {int(status) for status, _, rest in errors if "hdr Retry-After 1" in rest}
    assert retried == {502, 503, 504}
    assert re.findall(r"errorfile (\d+) (\S+)", CONFIG.read_text()) == [
        ("400", "/dev/null"),
        ("408", "/dev/null"),
    ]


DASHBOARD = json.loads((ROOT / "docs/grafana/flashsale.json").read_text())


def _exprs(title: str) -> list[str]:
    [panel] = [p for p in DASHBOARD["panels"] if p["title"] == title]
    return [" ".join(t["expr"].split()) for t in panel["targets"]]


def test_dashboard_panels_for_the_loop_the_queue_strategy_and_haproxy() -> None:
    """The event loop's p50/p99 lag, each of the queue strategy's stream and
    writer series, HAProxy, the live sale (its row first) and the order
    events' outbox, lag and webhook answers have panels; ids
    are unique and no two panels overlap."""
    lag = _exprs("Event loop lag p50 / p99")
    assert [e.split(",")[0] for e in lag] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    assert all("rate(flashsale_event_loop_lag_seconds_bucket{" in e for e in lag)
    queried = " ".join(t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", []))
    for name in (
        "flashsale_stream_length",
        "flashsale_stream_pending",
        "flashsale_stream_reclaimed_total",
        "flashsale_writer_batches_total",
        "flashsale_writer_batch_size_bucket",
        "haproxy_frontend_http_responses_total",
        "haproxy_backend_active_servers",
        "haproxy_backend_retry_warnings_total",
        "flashsale_sku_on_sale",
        "flashsale_sku_held",
        "flashsale_sku_sold",
        "flashsale_sku_confirmed_total",
        "flashsale_outbox_depth",
        "flashsale_outbox_oldest_age_seconds",
        "flashsale_event_delivery_lag_seconds_bucket",
        "flashsale_webhook_answers_total",
    ):
        assert name in queried, name
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    assert DASHBOARD["panels"][0]["title"] == "Live sale"
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in DASHBOARD["panels"]
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))


# `make run` and `make services` as a newcomer meets them (issue 19): what make
# would run, printed by `make -n` and not run, and services.sh against addresses
# where nothing listens (it starts nothing there).

_OURS = (
    "GATEWAY_ADMIN_TOKEN",
    "GATEWAY_ADMISSION_SECRET",
    "GATEWAY_REDIS_URL",
    "GATEWAY_DATABASE_URL",
    "GATEWAY_EVENTS_AMQP_URL",
)


def _env(**settings: str) -> dict[str, str]:
    """This environment without the gateway settings make and services.sh read,
    plus ``settings``."""
    return {**{k: v for k, v in os.environ.items() if k not in _OURS}, **settings}


def _dry_run(*args: str, **settings: str) -> list[str]:
    """The commands ``make -n <args>`` prints, with ``settings`` in the environment."""
    argv = ["make", "-n", *args]
    done = subprocess.run(argv, cwd=ROOT, env=_env(**settings), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_run_serves_with_the_token_and_secret_the_environment_sets() -> None:
    """``GATEWAY_ADMIN_TOKEN=mytoken make run`` serves and prints mytoken, and the
    same for GATEWAY_ADMISSION_SECRET; unset, the dev ones."""
    mine = _dry_run(
        "run", GATEWAY_ADMIN_TOKEN="mytoken", GATEWAY_ADMISSION_SECRET="my-secret-123456"
    )
    serve = "GATEWAY_ADMIN_TOKEN='{}' GATEWAY_ADMISSION_SECRET='{}' \\"
    assert serve.format("mytoken", "my-secret-123456") in mine, mine
    assert any("Bearer mytoken" in line for line in mine), mine
    assert serve.format("dev-admin-token", "dev-admission-secret") in _dry_run("run")


@pytest.mark.parametrize("changed", ["pyproject.toml", "requirements.lock"])
def test_make_run_installs_only_what_serving_needs(changed: str) -> None:
    """With pyproject.toml or the lock newer than the stamps (a fresh clone, a
    changed dependency), ``make run`` installs the package without extras; the
    test targets install the dev and bench extras; both at the lock's versions."""

    def installs(target: str) -> list[str]:
        lines = _dry_run("-W", changed, target)
        return [line for line in lines if "pip install" in line and "-U pip" not in line]

    assert installs("run") == [".venv/bin/pip install -q -c requirements.lock -e ."]
    assert installs("pytest") == [".venv/bin/pip install -q -c requirements.lock -e '.[dev,bench]'"]


def test_make_lock_resolves_every_extra_into_the_lock() -> None:
    """``make lock`` installs uv and writes pyproject.toml's resolution, every extra
    included, to requirements.lock."""
    # make's own lines aside ("make[1]: Entering directory", run under make).
    lines = [line for line in _dry_run("lock") if not line.startswith("make")]
    recipe = " ".join(lines).replace("\\", " ").split()
    assert ".venv/bin/pip install -q uv==" in " ".join(recipe)
    compile_ = " ".join(recipe[recipe.index("compile") :])
    assert compile_.startswith("compile -q pyproject.toml --all-extras --python-version 3.11 ")
    assert compile_.endswith(" -o requirements.lock")


def test_services_checks_the_redis_and_postgresql_the_urls_name(tmp_path: Path) -> None:
    """scripts/services.sh looks at the address of GATEWAY_REDIS_URL, of
    GATEWAY_DATABASE_URL and of GATEWAY_EVENTS_AMQP_URL (user, password and
    database aside), not at 6379, 5432 and 5672: nothing listening there is an
    error naming the setting, and nothing is started on a port that is not the
    default."""
    nobody = free_port()
    # services.sh wants the Redis Cluster tools installed: stand-ins on PATH.
    for tool in ("redis-server", "redis-cli"):
        (tmp_path / tool).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / tool).chmod(0o755)
    with socket.create_server((HOST, 0)) as redis:  # a Redis stand-in: it listens
        cases = {
            "GATEWAY_REDIS_URL": {"GATEWAY_REDIS_URL": f"redis://u:p@{HOST}:{nobody}/0"},
            "GATEWAY_DATABASE_URL": {
                "GATEWAY_REDIS_URL": f"redis://{HOST}:{redis.getsockname()[1]}/0",
                "GATEWAY_DATABASE_URL": f"postgresql://u:p@{HOST}:{nobody}/x?sslmode=off",
            },
            "GATEWAY_EVENTS_AMQP_URL": {
                "GATEWAY_REDIS_URL": f"redis://{HOST}:{redis.getsockname()[1]}/0",
                "GATEWAY_DATABASE_URL": f"postgresql://{HOST}:{redis.getsockname()[1]}/x",
                "GATEWAY_EVENTS_AMQP_URL": f"amqp://u:p@{HOST}:{nobody}/vhost",
            },
        }
        for setting, settings in cases.items():
            path = f"{tmp_path}:{os.environ['PATH']}"
            env = _env(**settings, PATH=path, RUN_DIR=str(tmp_path / "run"))
            argv = ["bash", "scripts/services.sh"]
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
            said = f"services: nothing answers at {HOST}:{nobody} ({setting}); start it there"
            assert done.returncode == 1, (setting, done.stderr)
            assert done.stderr.startswith(said), (setting, done.stderr)
