"""The deployment files, checked without a container engine (none runs here).

compose.yaml, Prometheus and Grafana files parse and name files that exist; the
HAProxy config compose mounts is the one the native HAProxy test runs; the
Dockerfile builds a wheel, runs as non-root, checks /readyz and stops on SIGTERM.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import yaml

from gateway.server import CLOSE_S
from tests.support.haproxy import CONFIG

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
    """One target per gateway service; the rule files it loads are docs/grafana/alerts.yml
    and deploy/rules/locks.yml (the lease rule of thumb)."""
    config = load("deploy/prometheus.yml")
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "flashsale-gateway"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [f"{name}:8080" for name in GATEWAYS]
    rules = mounts("prometheus")
    assert [rules[path] for path in config["rule_files"]] == [
        ROOT / "docs/grafana/alerts.yml",
        ROOT / "deploy/rules/locks.yml",
    ]
    assert load("docs/grafana/alerts.yml")["groups"][0]["rules"]
    [lease] = load("deploy/rules/locks.yml")["groups"][0]["rules"]
    # The metrics it compares are the ones gateway/metrics.py exports.
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
    """Multi-stage, a wheel installed (never editable), non-root, /readyz health
    check, SIGTERM to stop."""
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    assert "pip wheel" in text and not re.search(r"pip install[^\n]* -e\b", text)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/readyz", text, re.M)
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)
