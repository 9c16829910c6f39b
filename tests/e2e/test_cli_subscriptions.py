"""``orbit subscriptions ...`` run as processes against a real orbit-server (whose delivery
loop turns result events into deliveries)."""

from __future__ import annotations

import time

import pytest
from cli_support import CliTenant, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    tenant = CliTenant.bootstrap(server, dsn)
    tenant.add_queue("emails")
    tenant.add_queue("other")
    return tenant


def pull(t: CliTenant, *extra: str) -> list[dict]:  # type: ignore[type-arg]
    out = loads(t.orbit("subscriptions", "pull", "results", "--max", "10", "--wait-ms", "3000",
                        "--json", *extra))  # fmt: skip
    return out["deliveries"]  # type: ignore[no-any-return]


def test_put_get_pull_ack_nack_history_and_budget(t: CliTenant) -> None:
    s = loads(t.orbit("subscriptions", "put", "results", "--queue", "emails", "--start",
                      "earliest", "--ack-timeout-ms", "1000", "--max-deliveries", "2",
                      "--create-only", "--json"))  # fmt: skip
    assert s["filter"] == {"queues": ["emails"]} and s["max_deliveries"] == 2
    s = loads(t.orbit("subscriptions", "put", "results", "--max-in-flight", "7", "--json"))
    assert s["max_in_flight"] == 7 and s["max_deliveries"] == 2  # the rest kept
    assert t.orbit("subscriptions", "put", "results", "--create-only").returncode == 1
    assert t.orbit("subscriptions", "put", "results", "--start", "soon").returncode == 2

    a, b = t.submit("emails", "a"), t.submit("emails", "b")
    t.orbit("tasks", "cancel", a["id"])
    t.orbit("tasks", "cancel", b["id"])
    t.orbit("tasks", "cancel", t.submit("other", "c")["id"])  # filtered out

    first = pull(t)
    assert sorted(d["event"]["task_id"] for d in first) == sorted([a["id"], b["id"]])
    da = next(d for d in first if d["event"]["task_id"] == a["id"])
    db_ = next(d for d in first if d["event"]["task_id"] == b["id"])
    ack = loads(t.orbit("subscriptions", "ack", da["delivery_id"], "--proof", da["proof"],
                        "--json"))  # fmt: skip
    assert ack["outcome"] == "applied" and ack["delivery"]["state"] == "ACKED"
    replay = t.orbit("subscriptions", "ack", da["delivery_id"], "--proof", da["proof"])
    assert replay.returncode == 0 and "replayed" in replay.stdout
    wrong = t.orbit("subscriptions", "ack", db_["delivery_id"], "--proof", "not-the-proof")
    assert wrong.returncode == 1

    nack = loads(t.orbit("subscriptions", "nack", db_["delivery_id"], "--proof", db_["proof"],
                         "--retry-after-ms", "0", "--json"))  # fmt: skip
    assert nack["state"] == "PENDING"
    second = pull(t)  # b again (attempt 2 = the whole budget); never acked
    assert [d["delivery_id"] for d in second] == [db_["delivery_id"]]
    deadline = time.monotonic() + 30
    exhausted: list[dict] = []  # type: ignore[type-arg]
    while not exhausted and time.monotonic() < deadline:
        time.sleep(0.5)
        exhausted = loads(t.orbit("subscriptions", "deliveries", "results", "--state",
                                  "EXHAUSTED", "--json"))["items"]  # fmt: skip
    assert [d["delivery_id"] for d in exhausted] == [db_["delivery_id"]]
    got = loads(t.orbit("subscriptions", "get", "results", "--json"))
    assert got["backlog"]["exhausted"] == 1 and got["backlog"]["acked"] == 1

    revived = loads(t.orbit("subscriptions", "budget", db_["delivery_id"], "--add", "1",
                            "--idempotency-key", "fix-1", "--json"))  # fmt: skip
    assert revived["budget"] == 3 and revived["state"] == "PENDING"
    loads(t.orbit("subscriptions", "budget", db_["delivery_id"], "--add", "1",
                  "--idempotency-key", "fix-1", "--json"))  # fmt: skip
    third = pull(t, "--ack")
    assert [d["delivery_id"] for d in third] == [db_["delivery_id"]]
    history = t.orbit("subscriptions", "deliveries", "results")
    states = [line.split()[2] for line in history.stdout.splitlines()[1:]]
    assert states == ["ACKED", "ACKED"]
    final = loads(t.orbit("subscriptions", "get", "results", "--json"))
    assert final["backlog"]["acked"] == 2 and final["backlog"]["exhausted"] == 0
    bad = t.orbit("subscriptions", "budget", db_["delivery_id"], "--add", "0")
    assert bad.returncode == 2
