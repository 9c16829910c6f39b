"""The console's operator controls in a real headless Chromium against a real
``orbit-server`` process (the fixtures of tests/e2e/test_ui_browser.py): schedule trigger,
backfill and delete. Screenshots: see test_ui_browser.REPORTS."""

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


def _running_worker(t: ui.Tenant, queue: str) -> tuple[str, str]:
    """A session over the HTTP fallback holding one running attempt: (session id, task id)."""
    task = t.submit(queue, "slow")
    r = t.http.post(t.path("workers", "sessions"), json={
        "instance": {"host": "ui-host", "pid": 77, "sdk": "ui-test/1"},
        "queues": [queue], "max_concurrency": 4,
    })  # fmt: skip
    assert r.status_code == 201, r.text
    sid, token = r.json()["session_id"], r.json()["session_token"]
    session = {"Authorization": f"Bearer {token}"}
    for _ in range(20):
        offers = t.http.post(
            t.path("workers", "sessions", sid, "poll"), params={"wait_ms": 1000}, headers=session
        ).json()["offers"]
        if offers:
            break
    (offer,) = offers
    started = t.http.post(t.path("attempts", offer["attempt_id"], "start"), headers=session)
    assert started.json()["type"] == "started", started.text
    return sid, task["id"]


async def test_workers_page_and_close(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    t.queue("jobs")
    sid, task_id = _running_worker(t, "jobs")
    page = console.page
    await console.login(t.key, t.ns)
    await page.get_by_role("link", name="Workers", exact=True).click()
    row = page.locator("table.grid tbody tr").filter(has_text="ui-host (pid 77)")
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text("ui-test/1")
    await expect(row).to_contain_text("1 / 4")
    await expect(row.get_by_role("link", name=f"Task {task_id}")).to_be_visible()
    await console.shot("ops-workers", full_page=True)
    await row.get_by_text("Close…").click()
    await row.get_by_role("button", name="Yes, close this session").click()
    status = page.locator("#view p[role=status]")
    await expect(status).to_contain_text("1 running attempts recovered")
    await expect(page.locator("table.grid tbody tr").filter(has_text="ui-host")).to_have_count(0)
    assert t.task(task_id)["state"] == "NEEDS_REVIEW"
    await page.get_by_label("State").select_option("CLOSED")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("table.grid tbody tr").filter(has_text="ui-host")).to_have_count(1)
    assert sid


async def test_audit_view_filters(console: Console, server: ConsoleServer, db: Database) -> None:
    t = await bootstrap(server, db)
    t.queue("audited")
    assert t.http.post(t.path("queues", "audited", "pause")).status_code == 200
    assert t.http.delete(t.path("queues", "nope")).status_code == 404
    page = console.page
    await console.login(t.key, t.ns)
    await page.get_by_role("link", name="Audit", exact=True).click()
    rows = page.locator("table.grid tbody tr")
    await expect(rows.filter(has_text="queues.pause")).to_have_count(1)
    await expect(rows.filter(has_text="queues.put").first).to_be_visible()
    await page.get_by_label("Action").fill("queues.pause")
    await page.get_by_role("button", name="Search").click()
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("queue audited")
    await expect(rows.first).to_contain_text("OK")
    await console.shot("ops-audit")
    await page.get_by_label("Outcome").select_option("denied")
    await page.get_by_role("button", name="Search").click()
    await expect(rows.first).to_contain_text("No audit event matches these filters.")


async def test_rerun_a_cancelled_task_from_its_page(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    t.queue("again")
    task = t.submit("again", "k")
    assert t.http.post(t.path("tasks", task["id"], "cancel")).status_code == 200
    page = console.page
    await console.login(t.key, t.ns)
    await console.go(f"#/tasks/{task['id']}")
    await page.get_by_text("Re-run…").click()
    await page.get_by_role("button", name="Re-run task").click()
    status = page.locator("#view p[role=status]").filter(has_text="Write a note")
    await expect(status).to_be_visible()
    await page.get_by_label("Note (required: why, kept on the task and in the audit trail)").fill(
        "cancelled by mistake"
    )
    await page.get_by_label("Further attempts allowed").fill("2")
    await console.shot("ops-rerun-form")
    await page.get_by_role("button", name="Re-run task").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("WAITING")
    after = t.task(task["id"])
    assert after["state"] == "WAITING" and after["resolution"]["note"] == "cancelled by mistake"
    await expect(page.get_by_text("Re-run…")).to_have_count(0)


async def test_retention_view_shows_and_saves_the_windows(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    page = console.page
    await console.login(t.key, t.ns)
    await page.get_by_role("link", name="Retention").click()
    facts = page.locator("#view dl.facts")
    await expect(facts).to_contain_text("kept forever")
    await expect(facts).to_contain_text("Rows purged")
    await page.get_by_label("Events (days)", exact=True).fill("14")
    await page.get_by_label("Audit events (days)").fill("90")
    await page.get_by_role("button", name="Save windows").click()
    status = page.locator("#view p[role=status]")
    await expect(status).to_contain_text("Saved (revision 2)")
    await expect(facts).to_contain_text("14 days")
    await console.shot("ops-retention")
    assert t.http.get(t.path("retention")).json()["audit_days"] == 90
    await page.get_by_label("Audit events (days)").fill("3")
    await page.get_by_role("button", name="Save windows").click()
    await expect(status).to_contain_text("400 invalid_request")
    assert t.http.get(t.path("retention")).json()["audit_days"] == 90
