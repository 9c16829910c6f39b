"""docs/metrics.md and docs/grafana-dashboard.json match the code: every metric the server
registers (found in the source, and scraped from a live server after real traffic) is
documented, and the dashboard queries only documented metrics."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from cli_support import CliTenant, HttpWorker, server_fixture
from platform_fixtures import ROOT

from orbit import metrics as orbit_metrics
from orbit.storage import DSN

pytestmark = pytest.mark.process

DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
REGISTRATION = re.compile(r"\.(?:counter|gauge|histogram)\(\s*(\"[a-z_]+\"|[A-Z_]+)")
server = server_fixture()


def documented() -> set[str]:
    """Metric names in the first column of docs/metrics.md's tables."""
    return set(re.findall(r"^\| `([a-z_]+)` \|", DOC.read_text(), re.MULTILINE))


def registered_in_source() -> set[str]:
    names: set[str] = set()
    for package in ("orbit", "pulse", "weave"):
        for path in (ROOT / package).rglob("*.py"):
            for ref in REGISTRATION.findall(path.read_text()):
                names.add(ref.strip('"') if ref.startswith('"') else getattr(orbit_metrics, ref))
    return names


def test_every_registered_metric_is_documented() -> None:
    source = registered_in_source()
    assert {"orbit_http_requests_total", "pulse_offers_total", "weave_inbox_events_total"} <= source
    assert source - documented() == set(), "metrics missing from docs/metrics.md"
    assert documented() - source == set(), "docs/metrics.md lists metrics the code lacks"


def test_live_server_exposes_only_documented_metrics(server, dsn: DSN) -> None:
    t = CliTenant.bootstrap(server, dsn)
    t.add_queue("q")
    w = HttpWorker(t, ["q"])  # a start and a report, so the lazily created metrics appear
    t.submit("q")
    [started] = w.start(1)
    w.complete(started, "1")
    assert (
        httpx.get(server.url + "/v1/whoami", headers={"Authorization": "Bearer x"}).status_code
        == 401
    )
    text = httpx.get(server.url + "/metrics", timeout=10).text
    exposed = set(re.findall(r"^# TYPE ([a-z_]+) ", text, re.MULTILINE))
    assert {"pulse_starts_total", "pulse_reports_total", "orbit_auth_failures_total"} <= exposed
    assert exposed - documented() == set()


def test_dashboard_is_valid_and_uses_documented_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and dash["schemaVersion"] >= 36
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for p in panels:
        assert p["targets"] and set(p["gridPos"]) == {"h", "w", "x", "y"}
        for target in p["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            for name in re.findall(r"\b((?:orbit|pulse|weave)_[a-z_]+)", expr):
                used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert used - documented() == set()
    assert documented() - used == set(), "every documented metric has a panel"
