"""``orbit schedules ...`` run as processes against a real orbit-server (whose scheduler
loop fires the occurrences)."""

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
    tenant.add_queue("reports")
    return tenant


def test_cron_schedule_in_a_dst_zone(t: CliTenant) -> None:
    s = loads(t.orbit("schedules", "put", "nightly", "--queue", "reports", "--kind", "report",
                      "--cron", "30 2 * * *", "--timezone", "Europe/Berlin",
                      "--payload", '{"rate": 0.10}', "--start-at", "2030-03-30T12:00:00Z",
                      "--json"))  # fmt: skip
    assert s["version"] == 1 and s["timezone"] == "Europe/Berlin"
    # 2030-03-31 02:30 does not exist in Berlin (clocks jump 02:00 CET -> 03:00 CEST): it
    # fires once, at the first instant after the gap, 03:00 CEST = 01:00Z.
    assert s["next_fire_at"] == "2030-03-31T01:00:00.000000Z"
    assert s["next_fire_at_local"].startswith("2030-03-31T03:00:00+02:00")
    raw = t.orbit("schedules", "get", "nightly", "--json").stdout
    assert '"payload":{"rate": 0.10}' in raw

    same = loads(t.orbit("schedules", "put", "nightly", "--queue", "reports", "--kind", "report",
                         "--cron", "30 2 * * *", "--timezone", "Europe/Berlin",
                         "--payload", '{"rate": 0.10}', "--start-at", "2030-03-30T12:00:00Z",
                         "--json"))  # fmt: skip
    v2 = loads(t.orbit("schedules", "put", "nightly", "--queue", "reports", "--kind", "report",
                       "--cron", "0 3 * * *", "--timezone", "Europe/Berlin", "--json"))  # fmt: skip
    assert v2["version"] == same["version"] + 1
    stale = t.orbit("schedules", "put", "nightly", "--queue", "reports", "--kind", "report",
                    "--cron", "0 4 * * *", "--if-match", "1")  # fmt: skip
    assert stale.returncode == 1 and "412" in stale.stderr

    assert t.orbit("schedules", "put", "x", "--queue", "reports").returncode == 2
    both = t.orbit("schedules", "put", "x", "--queue", "reports", "--kind", "k", "--cron",
                   "* * * * *", "--every-ms", "1000")  # fmt: skip
    assert both.returncode == 2
    bad = t.orbit("schedules", "put", "x", "--queue", "reports", "--kind", "k",
                  "--cron", "61 * * * *")  # fmt: skip
    assert bad.returncode == 1 and "400" in bad.stderr
    listed = t.orbit("schedules", "list")
    assert listed.stdout.splitlines()[1].split()[:2] == ["nightly", str(v2["version"])]


def test_interval_schedule_fires_pauses_and_resumes(t: CliTenant) -> None:
    loads(t.orbit("schedules", "put", "tick", "--file", "-", "--json",
                  input='{"queue": "reports", "every_ms": 1000, "task": {"kind": "tick"},'
                        ' "catchup_window_ms": 60000}'))  # fmt: skip
    deadline = time.monotonic() + 30
    created: list[dict[str, object]] = []
    while len(created) < 2 and time.monotonic() < deadline:
        time.sleep(1)
        page = loads(t.orbit("schedules", "occurrences", "tick", "--outcome", "created", "--json"))
        created = page["items"]
    assert len(created) >= 2 and all(o["task_id"] for o in created)
    task = loads(t.orbit("tasks", "get", str(created[0]["task_id"]), "--json"))
    assert task["kind"] == "tick" and task["source"]["kind"] == "schedule"

    paused = loads(t.orbit("schedules", "pause", "tick", "--json"))
    assert paused["paused"] is True and paused["next_fire_at"] is None
    time.sleep(2.5)
    resumed = loads(t.orbit("schedules", "resume", "tick", "--json"))
    assert resumed["paused"] is False and resumed["next_fire_at"]
    skipped = loads(t.orbit("schedules", "occurrences", "tick", "--outcome", "skipped", "--json"))
    assert skipped["items"] and skipped["items"][0]["outcome"] == "skipped"
    table = t.orbit("schedules", "occurrences", "tick", "--all")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:2] == [
        "FIRE_AT", "FIRE_AT_LOCAL",
    ]  # fmt: skip


def test_trigger_backfill_overlap_and_delete(t: CliTenant) -> None:
    s = loads(t.orbit("schedules", "put", "hourly", "--queue", "reports", "--kind", "report",
                      "--every-ms", "3600000", "--overlap", "skip", "--json"))  # fmt: skip
    assert s["overlap"] == "skip"
    fired = loads(t.orbit("schedules", "trigger", "hourly", "--idempotency-key", "k-1", "--json"))
    assert fired["occurrence"]["origin"] == "trigger" and fired["task"]["state"] == "WAITING"
    again = t.orbit("schedules", "trigger", "hourly", "--idempotency-key", "k-1")
    assert again.returncode == 0 and "replayed" in again.stdout and "yes" in again.stdout
    assert fired["occurrence"]["id"] in again.stdout
    start = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() - 3 * 3600))
    end = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime())
    filled = loads(t.orbit("schedules", "backfill", "hourly", "--from", start, "--to", end,
                           "--json"))  # fmt: skip
    assert filled["count"] == 3 and filled["already_occurred"] == 0
    human = t.orbit("schedules", "backfill", "hourly", "--from", start, "--to", end)
    assert human.returncode == 0 and "already_occurred" in human.stdout
    occ = loads(t.orbit("schedules", "occurrences", "hourly", "--json"))
    assert sorted(o["origin"] for o in occ["items"]) == ["backfill"] * 3 + ["trigger"]
    bad = t.orbit("schedules", "backfill", "hourly", "--from", end, "--to", start)
    assert bad.returncode == 1 and "400" in bad.stderr
    assert t.orbit("schedules", "backfill", "hourly", "--from", start).returncode == 2
    gone = t.orbit("schedules", "delete", "hourly")
    assert gone.returncode == 0 and "deleted" in gone.stdout
    missing = t.orbit("schedules", "get", "hourly")
    assert missing.returncode == 1 and "404" in missing.stderr
