"""The stuck-work watchdog in a real ``orbit-server`` process (its background loop, with a
short interval), seen through ``orbit tasks list --stuck``, the queue GET and ``/metrics``."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from cli_support import CliTenant, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture(ORBIT_PULSE_WATCHDOG_INTERVAL_MS="200")


def test_server_watchdog_surfaces_a_waiting_task(server, dsn: DSN) -> None:
    t = CliTenant.bootstrap(server, dsn)
    t.add_queue("slow", stuck_after_ms=1000)
    t.add_queue("unwatched")
    stuck = t.submit("slow")["id"]
    calm = t.submit("unwatched")["id"]  # no bound: never surfaced

    deadline = time.monotonic() + 30
    items: list[dict] = []
    while time.monotonic() < deadline:
        items = loads(t.orbit("tasks", "list", "--stuck", "--json"))["items"]
        if items:
            break
        time.sleep(0.2)
    assert [i["id"] for i in items] == [stuck]
    assert items[0]["state"] == "WAITING"
    assert items[0]["stuck_reason"].startswith("WAITING for ")
    assert items[0]["stuck_reason"].endswith(
        "> stuck_after_ms 1000 on queue slow: no live worker session takes work from queue slow"
    )

    table = t.orbit("tasks", "list", "--stuck")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0].split()
    assert header[:4] == ["ID", "QUEUE", "KIND", "STATE"] and "STUCK_REASON" in header
    assert (
        len(table.stdout.splitlines()) == 2 and stuck in table.stdout and calm not in table.stdout
    )

    got = loads(t.orbit("tasks", "get", stuck, "--json"))
    assert got["state"] == "WAITING" and got["stuck_at"] is not None
    q = t.api("GET", "/queues/slow").json()
    assert q["usage"]["stuck_tasks"] == 1 and q["counts"]["WAITING"] == 1
    assert t.api("GET", "/queues/unwatched").json()["usage"]["stuck_tasks"] == 0

    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(r'^pulse_tasks_stuck_total\{state="WAITING"\} (\d+)', metrics, re.MULTILINE)
    assert m and int(m.group(1)) >= 1
    assert re.search(r'^pulse_tasks_stuck\{state="WAITING"\} [1-9]', metrics, re.MULTILINE)
