"""``orbit queues ...`` run as processes against a real orbit-server."""

from __future__ import annotations

import pytest
from cli_support import CliTenant, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    return CliTenant.bootstrap(server, dsn)


def test_put_set_get_list_and_preconditions(t: CliTenant) -> None:
    created = t.orbit("queues", "put", "emails", "--max-concurrency", "4", "--lease-ms", "5000",
                      "--max-attempts", "5", "--create-only", "--json")  # fmt: skip
    q = loads(created)
    assert (q["max_concurrency"], q["lease_ms"], q["retry"]["max_attempts"]) == (4, 5000, 5)
    assert q["revision"] == 1
    exists = t.orbit("queues", "put", "emails", "--create-only")
    assert exists.returncode == 1 and "412 precondition_failed" in exists.stderr

    # `set` changes only what is given and keeps the rest (put would reset it).
    q = loads(t.orbit("queues", "set", "emails", "--max-unfinished-tasks", "100",
                      "--backoff-max-ms", "60000", "--json"))  # fmt: skip
    assert (q["max_unfinished_tasks"], q["max_concurrency"], q["lease_ms"]) == (100, 4, 5000)
    assert q["retry"]["max_attempts"] == 5 and q["retry"]["backoff_max_ms"] == 60000
    assert q["revision"] == 2
    q = loads(t.orbit("queues", "set", "emails", "--max-concurrency", "unlimited", "--json"))
    assert q["max_concurrency"] is None and q["max_unfinished_tasks"] == 100

    stale = t.orbit("queues", "put", "emails", "--lease-ms", "9000", "--if-match", "1")
    assert stale.returncode == 1 and "412" in stale.stderr
    q = loads(t.orbit("queues", "put", "emails", "--lease-ms", "9000", "--if-match", "3",
                      "--json"))  # fmt: skip
    assert q["lease_ms"] == 9000 and q["max_unfinished_tasks"] is None  # put = whole config

    assert t.orbit("queues", "set", "emails").returncode == 2  # nothing to set
    assert t.orbit("queues", "put", "emails", "--max-concurrency", "x").returncode == 2
    bad = t.orbit("queues", "put", "emails", "--lease-ms", "5")
    assert bad.returncode == 1 and "400 invalid_request" in bad.stderr

    t.orbit("queues", "put", "alpha", "--file", "-", input='{"max_concurrency": 2}')
    t.submit("emails")
    human = t.orbit("queues", "get", "emails")
    assert "WAITING=1" in human.stdout and "unfinished=1" in human.stdout
    listed = loads(t.orbit("queues", "list", "--json"))
    assert [x["name"] for x in listed["items"]] == ["alpha", "emails"]
    table = t.orbit("queues", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "PAUSED", "UNFINISHED"]
    assert table[2].split()[:3] == ["emails", "no", "1"]
    missing = t.orbit("queues", "get", "nope")
    assert missing.returncode == 1 and "404" in missing.stderr


def test_pause_resume_queue_and_namespace(t: CliTenant) -> None:
    t.add_queue("emails")
    q = loads(t.orbit("queues", "pause", "emails", "--json"))
    assert q["paused"] is True and q["gate"]["control_revision"] == 1
    assert loads(t.orbit("queues", "pause", "emails", "--json"))["gate"]["control_revision"] == 1
    assert loads(t.orbit("queues", "resume", "emails", "--json"))["paused"] is False

    gate = loads(t.orbit("queues", "pause-namespace", "--json"))
    assert gate["paused"] is True
    assert loads(t.orbit("queues", "get", "emails", "--json"))["namespace_paused"] is True
    assert "paused            yes" in t.orbit("queues", "gate").stdout
    assert loads(t.orbit("queues", "resume-namespace", "--json"))["paused"] is False

    reader = loads(t.orbit("credentials", "create", "--name", "r", "--namespace", "default",
                           "--action", "tasks.read", "--json"))["key"]  # fmt: skip
    denied = t.orbit("queues", "pause", "emails", key=reader)
    assert denied.returncode == 1 and "403" in denied.stderr
