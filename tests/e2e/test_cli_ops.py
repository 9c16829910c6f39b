"""``orbit queues|subscriptions|workflows delete``, ``orbit workers list|close``,
``orbit audit list`` and ``orbit tasks retry|retry-all`` run as processes against a real
orbit-server."""

from __future__ import annotations

import json

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


def test_deletes(t: CliTenant) -> None:
    task = t.submit("jobs")
    held = t.orbit("queues", "delete", "jobs")
    assert held.returncode == 1 and "409" in held.stderr and "1 unfinished task" in held.stderr
    assert t.api("POST", f"/tasks/{task['id']}/cancel").status_code == 200
    gone = t.orbit("queues", "delete", "jobs")
    assert gone.returncode == 0 and "queue jobs deleted" in gone.stdout
    assert t.orbit("queues", "get", "jobs").returncode == 1
    assert t.orbit("queues", "delete", "jobs", "--json").returncode == 1  # 404 now

    assert t.api("PUT", "/subscriptions/feed", json={"filter": {}}).status_code == 201
    stale = t.orbit("subscriptions", "delete", "feed", "--if-match", "7")
    assert stale.returncode == 1 and "412" in stale.stderr
    assert loads(t.orbit("subscriptions", "delete", "feed", "--json")) == {"deleted": True}

    doc = {"steps": [{"id": "done", "type": "succeed", "output": {}}]}
    assert t.api("POST", "/workflows/noop/versions", json={"definition": doc}).status_code == 201
    assert t.orbit("workflows", "delete", "noop").returncode == 0
    assert t.orbit("workflows", "get", "noop").returncode == 1


def test_workers_list_and_close(t: CliTenant) -> None:
    t.submit("jobs")
    worker = HttpWorker(t, ["jobs"])
    (started,) = worker.start(1)
    listed = loads(t.orbit("workers", "list", "--json"))
    [s] = listed["sessions"]
    assert s["id"] == worker.sid and s["in_flight"] == 1 and s["queues"] == ["jobs"]
    human = t.orbit("workers", "list")
    assert human.returncode == 0 and worker.sid in human.stdout and "cli-test" in human.stdout
    refused = t.orbit("workers", "close", worker.sid)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    closed = loads(t.orbit("workers", "close", worker.sid, "--yes", "--json"))
    assert closed["state"] == "CLOSED" and closed["lost_attempts"] == 1
    task = t.api("GET", f"/tasks/{started['task_id']}").json()
    assert task["state"] == "NEEDS_REVIEW"
    assert loads(t.orbit("workers", "list", "--json"))["sessions"] == []
    everything = loads(t.orbit("workers", "list", "--state", "any", "--json"))
    assert [x["state"] for x in everything["sessions"]] == ["CLOSED"]


def test_audit_list(t: CliTenant) -> None:
    assert t.orbit("queues", "pause", "jobs").returncode == 0
    page = loads(t.orbit("audit", "list", "--action", "queues.pause", "--json"))
    [event] = page["items"]
    assert event["outcome"] == "ok" and event["resource_id"] == "jobs"
    human = t.orbit("audit", "list", "--limit", "5")
    assert human.returncode == 0 and "queues.pause" in human.stdout
    bad = t.orbit("audit", "list", "--since", "yesterday")
    assert bad.returncode == 1 and "400" in bad.stderr
    every = t.orbit("audit", "list", "--all", "--json")
    assert json.loads(every.stdout)["next_cursor"] is None


def _fail(t: CliTenant, worker: HttpWorker, started: dict[str, object], error_type: str) -> None:
    token = json.dumps(started["execution_token"])
    r = worker._post(
        f"/attempts/{started['attempt_id']}/fail",
        content=f'{{"execution_token": {token}, "error": {{"type": "{error_type}"}}}}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["task_state"] == "FAILED", r.text


def test_retry_and_retry_all(t: CliTenant) -> None:
    for _ in range(3):
        t.submit("jobs", max_attempts=1)
    worker = HttpWorker(t, ["jobs"])
    started = worker.start(3)
    for i, s in enumerate(started):
        _fail(t, worker, s, "Timeout" if i else "Bug")
    one = started[0]["task_id"]
    missing_note = t.orbit("tasks", "retry", one)
    assert missing_note.returncode == 2
    task = loads(t.orbit("tasks", "retry", one, "--note", "fixed", "--json"))
    assert task["state"] == "WAITING" and task["resolution"]["note"] == "fixed"
    again = t.orbit("tasks", "retry", one, "--note", "twice")
    assert again.returncode == 1 and "409" in again.stderr
    counted = t.orbit("tasks", "retry-all", "--note", "outage", "--error-type", "Timeout")
    assert counted.returncode == 2 and "2 finished tasks match; add --yes" in counted.stdout
    assert t.api("GET", f"/tasks/{started[1]['task_id']}").json()["state"] == "FAILED"
    done = loads(t.orbit("tasks", "retry-all", "--note", "outage", "--error-type", "Timeout",
                         "--yes", "--json"))  # fmt: skip
    assert done == {"retried": 2, "quota_refused": 0}
    for s in started[1:]:
        assert t.api("GET", f"/tasks/{s['task_id']}").json()["state"] == "WAITING"
    none = t.orbit("tasks", "retry-all", "--note", "n", "--queue", "jobs")
    assert none.returncode == 0 and "0 finished tasks match" in none.stdout


def test_task_retry_policy_and_queue_bounds(t: CliTenant) -> None:
    q = loads(t.orbit("queues", "put", "bounded", "--min-delay-ms", "100", "--max-delay-ms",
                      "60000", "--max-multiplier", "3", "--json"))  # fmt: skip
    assert q["retry_bounds"] == {"min_delay_ms": 100, "max_delay_ms": 60000, "max_multiplier": 3.0}
    kept = loads(t.orbit("queues", "set", "bounded", "--lease-ms", "20000", "--json"))
    assert kept["retry_bounds"]["max_delay_ms"] == 60000 and kept["lease_ms"] == 20000
    task = loads(t.orbit("tasks", "submit", "bounded", "k", "--backoff-initial-ms", "250",
                         "--backoff-multiplier", "1.5", "--json"))  # fmt: skip
    assert task["retry"]["backoff_initial_ms"] == 250 and task["retry"]["backoff_multiplier"] == 1.5
    bad = t.orbit("tasks", "submit", "bounded", "k", "--backoff-initial-ms", "5")
    assert bad.returncode == 1 and "retry.backoff_initial_ms" in bad.stderr
    cleared = loads(t.orbit("queues", "set", "bounded", "--min-delay-ms", "none", "--json"))
    assert cleared["retry_bounds"]["min_delay_ms"] is None
    assert loads(t.orbit("tasks", "submit", "bounded", "k", "--backoff-initial-ms", "5",
                         "--json"))["retry"]["backoff_initial_ms"] == 5  # fmt: skip
