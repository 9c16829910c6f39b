"""``orbit tasks ...`` and ``orbit events ...`` run as processes against a real orbit-server."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import CliTenant, HttpWorker, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    tenant = CliTenant.bootstrap(server, dsn)
    tenant.add_queue("emails")
    return tenant


def test_submit_get_list_keep_payload_bytes_and_dedup(t: CliTenant) -> None:
    payload = '{"amount": 1.50, "big": 1e400, "s": "caf\\u00e9"}'
    sub = loads(t.orbit("tasks", "submit", "emails", "welcome", "--payload", payload,
                        "--dedup-key", "u-1", "--priority", "7", "--json"))  # fmt: skip
    assert sub["state"] == "WAITING" and sub["priority"] == 7 and sub["deduplicated"] is False
    raw = t.orbit("tasks", "get", sub["id"], "--json").stdout
    assert '"payload":{"amount": 1.50, "big": 1e400, "s": "caf\\u00e9"}' in raw  # byte for byte

    again = loads(t.orbit("tasks", "submit", "emails", "welcome", "--payload", "{}",
                          "--dedup-key", "u-1", "--json"))  # fmt: skip
    assert again["id"] == sub["id"] and again["deduplicated"] is True

    human = t.orbit("tasks", "submit", "emails", "welcome", "--payload-file", "-",
                    "--idempotency-key", "idem-1", input='{"n": 2}')  # fmt: skip
    assert human.returncode == 0 and "deduplicated  no" in human.stdout
    replay = t.orbit("tasks", "submit", "emails", "welcome", "--payload", '{"n": 2}',
                     "--idempotency-key", "idem-1", "--json")  # fmt: skip
    assert loads(replay)["id"] == human.stdout.split()[1]  # `id  <hex>` is the first line
    mismatch = t.orbit("tasks", "submit", "emails", "welcome", "--payload", '{"n": 3}',
                       "--idempotency-key", "idem-1")  # fmt: skip
    assert mismatch.returncode == 1 and "422 idempotency_mismatch" in mismatch.stderr

    table = t.orbit("tasks", "list", "--queue", "emails")
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:4] == ["ID", "QUEUE", "KIND", "STATE"]
    assert len(table.stdout.splitlines()) == 3  # header + 2 tasks
    got = t.orbit("tasks", "get", sub["id"])
    assert "state             WAITING" in got.stdout and '"amount":1.5' in got.stdout


def test_list_pages_and_all(t: CliTenant) -> None:
    ids = [t.submit("emails", "bulk", payload=i)["id"] for i in range(7)]
    first = loads(t.orbit("tasks", "list", "--kind", "bulk", "--limit", "3", "--json"))
    assert [x["id"] for x in first["items"]] == ids[:3] and first["next_cursor"]
    second = loads(t.orbit("tasks", "list", "--kind", "bulk", "--limit", "3",
                           "--cursor", first["next_cursor"], "--json"))  # fmt: skip
    assert [x["id"] for x in second["items"]] == ids[3:6]
    everything = loads(t.orbit("tasks", "list", "--kind", "bulk", "--all", "--json"))
    assert [x["id"] for x in everything["items"]] == ids and everything["next_cursor"] is None
    more = t.orbit("tasks", "list", "--kind", "bulk", "--limit", "3")
    assert "--cursor" in more.stderr  # humans are told there is more
    bad = t.orbit("tasks", "list", "--state", "NOPE")
    assert bad.returncode == 1 and "400 invalid_request" in bad.stderr


def test_submit_batch_chunks_errors_replay_and_progress(t: CliTenant, tmp_path: Path) -> None:
    lines = [json.dumps({"kind": "b", "payload": {"i": i}}) for i in range(2300)]
    lines[5] = '{"kind": "b", "priority": 12}'  # 400 for this item only
    lines[1500] = '{"queue": "nope", "kind": "b"}'  # 404 for this item only
    lines.insert(10, "")  # blank lines are skipped (line numbers still count them)
    f = tmp_path / "tasks.jsonl"
    f.write_text("\n".join(lines) + "\n")

    r = t.orbit("tasks", "submit-batch", "--file", str(f), "--queue", "emails",
                "--idempotency-key", "load-1", "--json")  # fmt: skip
    assert r.returncode == 1  # some items were rejected
    summary = json.loads(r.stdout)
    assert summary["lines"] == 2300 and summary["chunks"] == 3
    assert (summary["created"], summary["rejected"]) == (2298, 2)
    assert [(e["line"], e["status"]) for e in summary["errors"]] == [(6, 400), (1502, 404)]
    assert summary["errors"][0]["error"]["details"]["field"] == "priority"
    assert r.stderr == ""  # no progress bar when stderr is not a terminal

    again = t.orbit("tasks", "submit-batch", "--file", str(f), "--queue", "emails",
                    "--idempotency-key", "load-1", "--json")  # fmt: skip
    assert json.loads(again.stdout)["replayed_chunks"] == 3
    counted = loads(t.orbit("tasks", "list", "--kind", "b", "--all", "--json"))
    assert len(counted["items"]) == 2298  # the re-run created nothing

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"queue": "emails", "kind": "x"}\n{"queue": \n')
    r = t.orbit("tasks", "submit-batch", "--file", str(bad))
    assert r.returncode == 2 and "bad.jsonl:2" in r.stderr
    assert loads(t.orbit("tasks", "list", "--kind", "x", "--json"))["items"] == []  # nothing sent

    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"kind": "tty", "payload": i}) + "\n" for i in range(30)))
    code, out, err = t.orbit_on_tty("tasks", "submit-batch", "--file", str(small), "--queue",
                                    "emails", "--chunk-size", "10")  # fmt: skip
    assert code == 0 and "30 lines in 3 chunks: 30 created" in out
    assert "submitting [" in err and "30/30" in err  # the bar, on the terminal only


def test_cancel_cancel_all_and_exit_codes(t: CliTenant, dsn: DSN, server) -> None:
    t.add_queue("other")
    a = t.submit("emails", "a")
    assert loads(t.orbit("tasks", "cancel", a["id"], "--json"))["state"] == "CANCELLED"
    assert t.orbit("tasks", "cancel", a["id"]).returncode == 0  # already cancelled: 200

    for _ in range(3):
        t.submit("emails", "x")
    t.submit("emails", "y")
    t.submit("other", "x")
    other = CliTenant.bootstrap(server, dsn)
    other.add_queue("emails")
    theirs = other.submit("emails", "x")

    no_filter = t.orbit("tasks", "cancel-all")
    assert no_filter.returncode == 2 and "--yes" in no_filter.stderr
    out = loads(t.orbit("tasks", "cancel-all", "--queue", "emails", "--kind", "x", "--json"))
    assert out == {"cancelled": 3, "cancel_requested": 0}
    out = loads(t.orbit("tasks", "cancel-all", "--owner-id", t.application_id, "--json"))
    assert out == {"cancelled": 2, "cancel_requested": 0}  # y and other/x
    assert other.orbit("tasks", "get", theirs["id"], "--json").stdout.count('"WAITING"') == 1

    w = HttpWorker(t, ["emails"])
    done = t.submit("emails", "done")
    [started] = w.start(1)
    w.complete(started, '{"ok": true}')
    conflict = t.orbit("tasks", "cancel", done["id"])
    assert conflict.returncode == 1 and "409 conflict" in conflict.stderr
    missing = t.orbit("tasks", "get", "0" * 32)
    assert missing.returncode == 1 and "404 not_found" in missing.stderr
    assert t.orbit("tasks", "get").returncode == 2  # usage
    assert t.orbit("tasks", "submit", "emails", "k", "--payload", "{x").returncode == 2


def test_resolve_and_attempts_after_a_lost_lease(t: CliTenant) -> None:
    t.add_queue("short", lease_ms=1000)
    task = t.submit("short", "charge")
    w = HttpWorker(t, ["short"])
    w.start(1)  # ... and never heartbeat: the lease passes, recovery decides
    deadline = time.monotonic() + 30
    state = ""
    while state != "NEEDS_REVIEW" and time.monotonic() < deadline:
        time.sleep(0.5)
        state = loads(t.orbit("tasks", "get", task["id"], "--json"))["state"]
    assert state == "NEEDS_REVIEW"

    attempts = t.orbit("tasks", "attempts", task["id"])
    assert attempts.returncode == 0
    row = attempts.stdout.splitlines()[1].split()
    assert row[0] == "1" and row[2] == "LOST"
    wrong = t.orbit("tasks", "resolve", task["id"], "retry", "--note", "n", "--result", "1")
    assert wrong.returncode == 2
    resolved = t.orbit("tasks", "resolve", task["id"], "succeed", "--note", "charged by hand",
                       "--result", '{"charged": 10.50}', "--json")  # fmt: skip
    assert '"result":{"charged": 10.50}' in resolved.stdout
    assert loads(resolved)["state"] == "SUCCEEDED"
    again = t.orbit("tasks", "resolve", task["id"], "fail", "--note", "n")
    assert again.returncode == 1 and "409" in again.stderr
    evidence = loads(t.orbit("tasks", "attempts", task["id"], "--json"))
    kinds = [e["kind"] for a in evidence["items"] for e in a["evidence"]]
    assert "operator_resolution" in kinds


def test_tail_follows_new_events_as_ndjson(t: CliTenant) -> None:
    first = t.submit("emails", "t1")
    t.orbit("tasks", "cancel", first["id"])
    listed = loads(t.orbit("events", "list", "--json"))["items"]
    assert [e["task_id"] for e in listed] == [first["id"]]

    tail = t.popen("tasks", "tail", "--json", "--count", "3", "--interval", "0.2",
                   "--kind", "t2")  # fmt: skip
    try:
        w = HttpWorker(t, ["emails"])
        ids = [t.submit("emails", "t2", payload=i)["id"] for i in range(3)]
        t.submit("emails", "t3")  # filtered out
        for started in w.start(4):
            w.complete(started, '{"amount": 1.50}')
        out, err = tail.communicate(timeout=60)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert sorted(e["task_id"] for e in events) == sorted(ids)
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert all(e["type"] == "task.succeeded" and e["kind"] == "t2" for e in events)
    assert '"result":{"amount":1.50}' in out.replace(" ", "")  # the result's bytes as stored

    human = t.orbit("events", "tail", "--after-seq", "1", "--count", "2")
    lines = human.stdout.splitlines()
    assert lines[0].split()[:3] == ["SEQ", "CREATED_AT", "TYPE"] and len(lines) == 3

    endless = t.popen("events", "tail", "--json", "--interval", "0.2")
    assert endless.stdout is not None
    assert json.loads(endless.stdout.readline())["seq"] == 1  # it is following
    endless.send_signal(signal.SIGINT)  # Ctrl-C is how a tail ends: exit 0
    try:  # read its pipes while it ends (a full pipe must not keep it from exiting)
        _, err = endless.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        endless.kill()
        _, err = endless.communicate()
        raise AssertionError(
            f"the tail did not end within 30 s of SIGINT; stderr: {err!r}"
        ) from None
    assert endless.returncode == 0, err


def test_queue_limited_key_and_namespace_choice(t: CliTenant) -> None:
    created = loads(t.orbit("credentials", "create", "--name", "ro", "--namespace", "default",
                            "--action", "tasks.read", "--queue", "emails", "--json"))  # fmt: skip
    limited = created["key"]
    t.submit("emails", "seen")
    denied = t.orbit("tasks", "list", key=limited)
    assert denied.returncode == 1 and "403 forbidden" in denied.stderr
    ok = t.orbit("tasks", "list", "--queue", "emails", "--json", key=limited)
    assert len(loads(ok)["items"]) == 1
    nowhere = t.orbit("tasks", "list", "--namespace", "nope")
    assert nowhere.returncode == 1 and "404" in nowhere.stderr
