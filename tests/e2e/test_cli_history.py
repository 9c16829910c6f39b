"""``orbit tasks history ID`` runs as a process against a real orbit-server: the events of a
task run over the HTTP fallback, as a table, as JSON, one page at a time and with --all.
``orbit tasks get`` and ``orbit tasks attempts`` show the progress a worker reported."""

from __future__ import annotations

import pytest
from cli_support import CliTenant, HttpWorker, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    tenant = CliTenant.bootstrap(server, dsn)
    tenant.add_queue("jobs")
    return tenant


def test_tasks_history(t: CliTenant) -> None:
    task = t.submit("jobs")
    worker = HttpWorker(t, ["jobs"])
    (started,) = worker.start(1)
    worker.complete(started, '{"ok": true}')
    doc = loads(t.orbit("tasks", "history", task["id"], "--json"))
    assert doc["task_id"] == task["id"] and doc["next_cursor"] is None
    types = [e["type"] for e in doc["events"]]
    assert types == ["task.accepted", "task.leased", "task.started", "task.succeeded"]
    human = t.orbit("tasks", "history", task["id"])
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].split()[:3] == ["CREATED_AT", "TYPE", "STATE"]
    assert [line.split()[1] for line in lines[1:]] == types
    first = t.orbit("tasks", "history", task["id"], "--limit", "2")
    assert len(first.stdout.splitlines()) == 3 and "--cursor" in first.stderr
    every = loads(t.orbit("tasks", "history", task["id"], "--limit", "1", "--all", "--json"))
    assert [e["type"] for e in every["events"]] == types
    missing = t.orbit("tasks", "history", "0" * 32)
    assert missing.returncode == 1 and "404" in missing.stderr


def test_tasks_get_shows_progress(t: CliTenant) -> None:
    task = t.submit("jobs")
    worker = HttpWorker(t, ["jobs"])
    (started,) = worker.start(1)
    r = worker._post(f"/attempts/{started['attempt_id']}/heartbeat", json={"progress": {"done": 7}})
    assert r.status_code == 200, r.text
    got = loads(t.orbit("tasks", "get", task["id"], "--json"))
    assert got["progress"] == {"done": 7} and got["progress_at"]
    human = t.orbit("tasks", "get", task["id"])
    line = next(x for x in human.stdout.splitlines() if x.startswith("progress "))
    assert '"done":7' in line.replace(" ", "")
    attempts = t.orbit("tasks", "attempts", task["id"])
    assert "PROGRESS" in attempts.stdout and '"done":7' in attempts.stdout.replace(" ", "")
