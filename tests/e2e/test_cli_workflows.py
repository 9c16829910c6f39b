"""``orbit workflows | instances | signals ...`` run as processes against a real
orbit-server (whose Weave advancer runs the instances)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_support import CliTenant, HttpWorker, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()

DEFINITION = """{"description": "cli test",
 "steps": [
  {"id": "wait", "type": "wait_signal", "signal": "go", "timeout_ms": 600000},
  {"id": "work", "type": "task", "queue": "jobs", "kind": "work",
   "payload": {"n": {"$": "$.input.n"}}},
  {"id": "done", "type": "succeed",
   "output": {"signal": {"$": "$.steps.wait.output"}, "work": {"$": "$.steps.work.output"}}}
 ]}
"""


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    tenant = CliTenant.bootstrap(server, dsn)
    tenant.add_queue("jobs")
    return tenant


def wait_for(t: CliTenant, instance: str, pred, timeout: float = 30) -> dict:  # type: ignore[no-untyped-def,type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = loads(t.orbit("instances", "get", instance, "--json"))
        if pred(doc):
            return doc  # type: ignore[no-any-return]
        time.sleep(0.5)
    raise AssertionError(f"instance never reached the expected state: {doc}")


def test_publish_start_signal_history(t: CliTenant, tmp_path: Path) -> None:
    f = tmp_path / "wf.json"
    f.write_text(DEFINITION)
    v1 = loads(t.orbit("workflows", "publish", "orders", "--file", str(f), "--json"))
    assert v1["version"] == 1 and v1["unchanged"] is False
    assert loads(t.orbit("workflows", "publish", "orders", "--file", str(f), "--json"))["unchanged"]
    text = t.orbit("workflows", "get", "orders", "--version", "1", "--definition").stdout
    assert text.strip() == DEFINITION.strip()  # byte for byte
    wf = loads(t.orbit("workflows", "get", "orders", "--json"))
    assert wf["latest_version"] == 1 and [v["version"] for v in wf["versions"]] == [1]
    versions = loads(t.orbit("workflows", "get", "orders", "--all", "--json"))
    assert [v["version"] for v in versions["items"]] == [1]
    assert "latest_version  1" in t.orbit("workflows", "get", "orders").stdout
    assert loads(t.orbit("workflows", "list", "--json"))["items"][0]["name"] == "orders"

    bad = tmp_path / "bad.json"
    bad.write_text('{"steps": [{"id": "x", "type": "task"}]}')
    invalid = t.orbit("workflows", "publish", "orders", "--file", str(bad))
    assert invalid.returncode == 1 and "400 invalid_request" in invalid.stderr

    inst = loads(t.orbit("instances", "start", "orders", "--input", '{"n": 2.50}',
                         "--business-key", "order-1", "--json"))  # fmt: skip
    assert inst["state"] == "RUNNING" and inst["deduplicated"] is False
    again = loads(t.orbit("instances", "start", "orders", "--input", '{"n": 2.50}',
                          "--business-key", "order-1", "--json"))  # fmt: skip
    assert again["id"] == inst["id"] and again["deduplicated"] is True

    sig = t.orbit("signals", "send", inst["id"], "go", "--signal-id", "s-1",
                  "--payload", '{"by": "cli", "x": 1.0}', "--json")  # fmt: skip
    assert '"payload":{"by": "cli", "x": 1.0}' in sig.stdout
    dup = loads(t.orbit("signals", "send", inst["id"], "go", "--signal-id", "s-1",
                        "--payload", '{"by": "cli", "x": 1.0}', "--json"))  # fmt: skip
    assert dup["id"] == loads(sig)["id"]

    w = HttpWorker(t, ["jobs"])
    [started] = w.start(1)
    w.complete(started, '{"worked": true}')
    done = wait_for(t, inst["id"], lambda d: d["state"] == "SUCCEEDED")
    assert done["output"] == {"signal": {"by": "cli", "x": 1.0}, "work": {"worked": True}}

    human = t.orbit("instances", "get", inst["id"])
    assert "state             SUCCEEDED" in human.stdout and "wait_signal" in human.stdout
    history = loads(t.orbit("instances", "history", inst["id"], "--all", "--json"))
    entries = [(e["entry"], e["step"]) for e in history["items"]]
    assert ("activation", "work") in entries and ("wait", "wait") in entries
    page = loads(t.orbit("instances", "history", inst["id"], "--json"))
    assert [s["signal_id"] for s in page["signals"]] == ["s-1"]
    assert "SUCCEEDED" in t.orbit("instances", "history", inst["id"]).stdout
    listed = loads(t.orbit("instances", "list", "--workflow", "orders", "--json"))
    assert [i["id"] for i in listed["items"]] == [inst["id"]]


def test_pause_resume_cancel(t: CliTenant, tmp_path: Path) -> None:
    f = tmp_path / "wf.json"
    f.write_text(DEFINITION)
    t.orbit("workflows", "publish", "orders", "--file", str(f))
    inst = loads(t.orbit("instances", "start", "orders", "--input-file", "-", "--json",
                         input=json.dumps({"n": 1})))  # fmt: skip
    paused = loads(t.orbit("instances", "pause", inst["id"], "--json"))
    assert paused["paused"] is True
    stale = t.orbit("instances", "resume", inst["id"], "--if-match", "1")
    assert stale.returncode == 1 and "412" in stale.stderr
    resumed = loads(t.orbit("instances", "resume", inst["id"], "--if-match",
                            str(paused["control_revision"]), "--json"))  # fmt: skip
    assert resumed["paused"] is False
    cancelled = loads(t.orbit("instances", "cancel", inst["id"], "--reason", "test", "--json"))
    assert cancelled["state"] == "CANCELLED"
    again = t.orbit("instances", "pause", inst["id"])
    assert again.returncode == 1 and "409" in again.stderr
    missing = t.orbit("instances", "get", "0" * 32)
    assert missing.returncode == 1 and "404" in missing.stderr
