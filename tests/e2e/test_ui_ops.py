"""The console's operator controls in a real headless Chromium against a real
``orbit-server`` process (the fixtures of tests/e2e/test_ui_browser.py): schedule trigger,
backfill and delete. Screenshots land in ``reports/ui/``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import test_ui_browser as ui
from test_ui_browser import Console, ConsoleServer, bootstrap, expect

from orbit.storage import Database

pytestmark = pytest.mark.process

# The browser, its server process and one console tab per test (test_ui_browser's fixtures).
browser = ui.browser
server = ui.server
console = ui.console


async def test_schedule_trigger_backfill_and_delete(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    t.queue("reports")
    r = t.http.put(t.path("schedules", "hourly"), json={
        "queue": "reports", "every_ms": 3_600_000, "overlap": "skip",
        "task": {"kind": "report", "payload": {}},
    })  # fmt: skip
    assert r.status_code == 201, r.text
    page = console.page
    await console.login(t.key, t.ns)
    await console.go("#/schedules/hourly")
    facts = page.locator("dl.facts")
    await expect(facts).to_contain_text("Overlap policy")
    await expect(facts).to_contain_text("skip")

    await page.get_by_text("Trigger now…").click()
    await page.get_by_role("button", name="Fire now").click()
    status = page.locator("#view p[role=status]")
    await expect(status).to_contain_text("Triggered: task")
    rows = page.locator("table.grid tbody tr")
    await expect(rows.filter(has_text="trigger")).to_have_count(1)
    await expect(facts).to_contain_text("Previous run")

    start = (datetime.now(UTC) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)

    async def backfill() -> None:
        await page.get_by_text("Backfill…").click()
        await page.get_by_label("From (UTC, inclusive)").fill(start.strftime("%Y-%m-%dT%H:%M:%SZ"))
        await page.get_by_label("To (UTC, exclusive)").fill(
            (start + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        await page.get_by_role("button", name="Backfill", exact=True).click()

    await backfill()
    await expect(status).to_contain_text("Backfilled: 3 tasks created, 0 fire times had run")
    await expect(rows.filter(has_text="backfill")).to_have_count(3)
    await console.shot("ops-schedule-controls", full_page=True)
    await backfill()  # the same range again creates nothing
    await expect(status).to_contain_text("Backfilled: 0 tasks created, 3 fire times had run")

    await page.get_by_text("Delete schedule…").click()
    await page.get_by_role("button", name="Yes, delete this schedule").click()
    await expect(page.get_by_role("heading", name="Schedules", exact=True)).to_be_visible()
    await expect(page.get_by_role("link", name="hourly")).to_have_count(0)
    assert t.http.get(t.path("schedules", "hourly")).status_code == 404
    tasks = t.http.get(t.path("tasks"), params={"queue": "reports"}).json()["items"]
    assert len(tasks) == 4  # history stays
