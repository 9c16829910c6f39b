"""docs/examples/nightly_cron runs against a real orbit-server: its schedule in
Europe/Berlin fires once per night across both DST changes, and a fast variant of the same
schedule really fires, creating one task per occurrence that the worker reports once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import CliTenant, loads, server_fixture
from platform_fixtures import ROOT

from orbit.storage import DSN

pytestmark = pytest.mark.process

EXAMPLE = ROOT / "docs" / "examples" / "nightly_cron" / "nightly.py"
server = server_fixture()


def run(t: CliTenant, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], env={**t.env, "ORBIT_NAMESPACE": t.namespace},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def published(t: CliTenant, *args: str) -> dict[str, object]:
    r = run(t, "publish", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_one_report_per_night_across_dst(t_factory) -> None:  # type: ignore[no-untyped-def]
    t = t_factory()
    # Spring forward (2030-03-31): 02:30 does not exist; it fires at 03:00 CEST instead.
    spring = published(t, "--name", "spring", "--start-at", "2030-03-30T12:00:00Z")
    assert spring["next_fire_at"] == "2030-03-31T01:00:00.000000Z"
    assert str(spring["next_fire_at_local"]).startswith("2030-03-31T03:00:00+02:00")
    # Fall back (2030-10-27): 02:30 happens twice; it fires once, at the first (CEST).
    autumn = published(t, "--name", "autumn", "--start-at", "2030-10-26T12:00:00Z")
    assert autumn["next_fire_at"] == "2030-10-27T00:30:00.000000Z"
    assert str(autumn["next_fire_at_local"]).startswith("2030-10-27T02:30:00+02:00")
    # An ordinary winter night: 02:30 CET = 01:30Z.
    winter = published(t, "--name", "winter", "--start-at", "2030-01-10T12:00:00Z")
    assert winter["next_fire_at"] == "2030-01-11T01:30:00.000000Z"


def test_the_schedule_fires_and_each_occurrence_is_reported_once(t_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t = t_factory()
    # The same schedule with a seconds field (every 2 s) so CI need not wait for the night.
    published(t, "--name", "fast", "--cron", "* * * * * */2")
    deadline = time.monotonic() + 30
    created: list[dict[str, object]] = []
    while len(created) < 3 and time.monotonic() < deadline:
        time.sleep(1)
        page = loads(t.orbit("schedules", "occurrences", "fast", "--outcome", "created", "--json"))
        created = page["items"]
    assert t.orbit("schedules", "pause", "fast").returncode == 0
    fired = loads(t.orbit("schedules", "occurrences", "fast", "--outcome", "created", "--all",
                          "--json"))["items"]  # fmt: skip
    assert len(fired) >= 3

    out = tmp_path / "reports.jsonl"
    r = run(t, "worker", "--out", str(out), "--burst")
    assert r.returncode == 0, r.stderr
    reports = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(x["task_id"] for x in reports) == sorted(str(o["task_id"]) for o in fired)
    assert sorted(x["fire_at_local"] for x in reports) == sorted(
        str(o["fire_at_local"]) for o in fired
    )
    assert all(x["night"] == x["fire_at_local"][:10] for x in reports)
    assert json.loads(r.stdout.splitlines()[-1])["succeeded"] == len(fired)


@pytest.fixture
def t_factory(server, dsn: DSN):  # type: ignore[no-untyped-def]
    def make() -> CliTenant:
        t = CliTenant.bootstrap(server, dsn)
        t.add_queue("reports")
        return t

    return make
