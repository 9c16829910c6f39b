"""docs/examples/deploy agrees with the server it deploys: the environment file names only
variables the server reads, the unit's exit-code policy is the server's, and both reverse
proxies pass WebSocket upgrades with read timeouts above the long-poll wait."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from orbit_cmd import server

from orbit.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "examples" / "deploy"
#: The longest a long poll waits (docs/api): a proxy must keep an idle request open longer.
LONG_POLL_S = 30


def _server_variables() -> set[str]:
    """Every ORBIT_* variable the server's code reads."""
    names = {f"ORBIT_{f.name.upper()}" for f in fields(Settings)}
    for package in ("orbit", "pulse", "weave", "cmd"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"\"(ORBIT_[A-Z0-9_]+)\"", path.read_text()))
    return names


def _unit() -> dict[str, list[str]]:
    entries: dict[str, list[str]] = {}
    for line in (DEPLOY / "orbit-server.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            entries.setdefault(key.strip(), []).append(value.strip())
    return entries


def test_the_environment_file_sets_only_what_the_server_reads() -> None:
    text = (DEPLOY / "orbit.env").read_text()
    variables = re.findall(r"^#?(ORBIT_[A-Z0-9_]+)=", text, re.M)
    assert {"ORBIT_DSN", "ORBIT_HOST", "ORBIT_PORT"} <= set(variables)
    unknown = set(variables) - _server_variables()
    assert not unknown, f"orbit.env names variables the server never reads: {sorted(unknown)}"


def test_the_unit_runs_the_installed_server_with_the_environment_file() -> None:
    unit = _unit()
    assert unit["EnvironmentFile"] == ["/etc/orbit/orbit.env"]
    assert unit["ExecStart"] == ["/opt/orbit/bin/orbit-server"]
    assert unit["KillSignal"] == ["SIGTERM"]  # the server's clean stop
    assert unit["User"] == ["orbit"] and unit["NoNewPrivileges"] == ["yes"]
    # Final exits are not restarted: schema not current, bad arguments. Database down is.
    final = {int(code) for code in unit["RestartPreventExitStatus"][0].split()}
    assert final == {server.EXIT_NOT_CURRENT, server.EXIT_USAGE}
    assert server.EXIT_UNAVAILABLE not in final and unit["Restart"] == ["on-failure"]


def _seconds(value: str) -> int:
    m = re.fullmatch(r"(\d+)(s|m)?", value)
    assert m, value
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def test_nginx_passes_websocket_upgrades_over_tls() -> None:
    conf = (DEPLOY / "nginx-orbit.conf").read_text()
    assert re.search(r"listen 443 ssl", conf) and "ssl_certificate " in conf
    assert "proxy_http_version 1.1;" in conf
    assert "proxy_set_header Upgrade $http_upgrade;" in conf
    assert "proxy_set_header Connection $connection_upgrade;" in conf
    assert re.search(r"map \$http_upgrade \$connection_upgrade \{\s*default upgrade;", conf)
    read = re.search(r"proxy_read_timeout (\w+);", conf)
    assert read and _seconds(read.group(1)) > LONG_POLL_S
    assert "proxy_buffering off;" in conf


def test_caddy_proxies_with_health_checks_and_long_timeouts() -> None:
    conf = (DEPLOY / "Caddyfile").read_text()
    assert re.search(r"^orbit\.example\.com \{", conf, re.M)  # a site address: automatic TLS
    assert "reverse_proxy 127.0.0.1:8080" in conf and "health_uri /readyz" in conf
    read = re.search(r"read_timeout (\w+)", conf)
    assert read and _seconds(read.group(1)) > LONG_POLL_S
    assert "flush_interval -1" in conf
