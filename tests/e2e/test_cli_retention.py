"""``orbit retention get|set`` as processes against a real orbit-server: the defaults, a
partial change that keeps the other windows, ``forever``, a refused value (exit 1 naming
the field), and usage errors (exit 2); and the server's own purge loop at work."""

from __future__ import annotations

import time

import httpx
import pytest
from cli_support import CliTenant, loads, server_fixture
from platform_fixtures import raw_query

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    return CliTenant.bootstrap(server, dsn)


def test_retention_get_and_set(t: CliTenant) -> None:
    first = loads(t.orbit("retention", "get", "--json"))
    assert first["revision"] == 1 and first["events_days"] is None
    out = loads(t.orbit("retention", "set", "--events-days", "14", "--audit-days", "90",
                        "--json"))  # fmt: skip
    assert (out["events_days"], out["audit_days"], out["revision"]) == (14, 90, 2)
    out = loads(t.orbit("retention", "set", "--finished-tasks-days", "30", "--json"))
    assert (out["finished_tasks_days"], out["events_days"], out["audit_days"]) == (30, 14, 90)
    out = loads(t.orbit("retention", "set", "--finished-tasks-days", "forever", "--json"))
    assert out["finished_tasks_days"] is None and out["events_days"] == 14
    human = t.orbit("retention", "get")
    assert human.returncode == 0 and "purged_total" in human.stdout
    refused = t.orbit("retention", "set", "--audit-days", "10")
    assert refused.returncode == 1 and "400" in refused.stderr and "audit_days" in refused.stderr
    assert t.orbit("retention", "set").returncode == 2
    assert t.orbit("retention", "set", "--events-days", "soon").returncode == 2


def test_the_server_purges_in_the_background(t: CliTenant, dsn: DSN) -> None:
    """The composition root runs the purge loop: a finished task 40 days old goes within a
    few seconds of the settings, with its counter on /metrics."""
    t.add_queue("old")
    task = t.submit("old")
    assert t.api("POST", f"/tasks/{task['id']}/cancel").status_code == 200
    raw_query(
        dsn, "UPDATE pulse_tasks SET created_at = created_at - INTERVAL 40 DAY,"
        " available_at = available_at - INTERVAL 40 DAY,"
        " state_changed_at = state_changed_at - INTERVAL 40 DAY,"
        " finished_at = finished_at - INTERVAL 40 DAY WHERE id = UNHEX(%s)", (task["id"],),
    )  # fmt: skip
    young = t.submit("old")
    assert t.api("POST", f"/tasks/{young['id']}/cancel").status_code == 200
    assert t.orbit("retention", "set", "--finished-tasks-days", "7").returncode == 0
    deadline = time.monotonic() + 30
    while t.api("GET", f"/tasks/{task['id']}").status_code != 404:
        assert time.monotonic() < deadline, "the purge did not run"
        time.sleep(0.5)
    assert t.api("GET", f"/tasks/{young['id']}").status_code == 200
    progress = loads(t.orbit("retention", "get", "--json"))
    assert progress["purged_total"] >= 1 and progress["last_run_at"] is not None
    metrics = httpx.get(t.server.url + "/metrics", timeout=10).text
    assert 'orbit_retention_purged_rows_total{table="pulse_tasks"}' in metrics
    assert "orbit_retention_purge_lag_seconds" in metrics
