"""The console's task history and progress in a real headless Chromium against a real
``orbit-server`` process (the fixtures of tests/e2e/test_ui_browser.py): the History table
of a task page lists its raw state events in order; a running task shows the progress its
worker reported with a heartbeat. Screenshots: see test_ui_browser.REPORTS."""

from __future__ import annotations

import pytest
import test_ui_browser as ui
from test_ui_browser import Console, ConsoleServer, bootstrap, expect

from orbit.storage import Database

pytestmark = pytest.mark.process

browser = ui.browser
server = ui.server
console = ui.console


async def test_task_history_timeline(console: Console, server: ConsoleServer, db: Database) -> None:
    t = await bootstrap(server, db)
    t.queue("hist")
    task = t.submit("hist", "k")
    assert t.http.post(t.path("tasks", task["id"], "cancel")).status_code == 200
    r = t.http.post(t.path("tasks", task["id"], "retry"), json={"note": "by mistake"})
    assert r.status_code == 200, r.text
    page = console.page
    await console.login(t.key, t.ns)
    await console.go(f"#/tasks/{task['id']}")
    await expect(page.get_by_role("heading", name="History")).to_be_visible()
    section = page.locator("section[aria-labelledby=history-h]")
    rows = section.locator("tbody tr")
    await expect(rows).to_have_count(3)
    await expect(rows.nth(0)).to_contain_text("task.accepted")
    await expect(rows.nth(1)).to_contain_text("task.cancelled")
    await expect(rows.nth(1)).to_contain_text("CANCELLED")
    await expect(rows.nth(2)).to_contain_text("task.rerun")
    await expect(rows.nth(2)).to_contain_text("WAITING")
    await section.scroll_into_view_if_needed()
    await console.shot("task-history")


async def test_task_progress(console: Console, server: ConsoleServer, db: Database) -> None:
    t = await bootstrap(server, db)
    t.queue("prog")
    task = t.submit("prog", "k")
    r = t.http.post(t.path("workers", "sessions"), json={
        "instance": {"host": "ui-test", "pid": 1, "sdk": "test"}, "queues": ["prog"],
        "max_concurrency": 1,
    })  # fmt: skip
    assert r.status_code == 201, r.text
    session = r.json()
    worker = {"Authorization": f"Bearer {session['session_token']}"}
    sid = session["session_id"]
    offers = t.http.post(
        t.path("workers", "sessions", sid, "poll") + "?wait_ms=5000", headers=worker
    ).json()["offers"]
    aid = offers[0]["attempt_id"]
    assert t.http.post(t.path("attempts", aid, "start"), headers=worker).status_code == 200
    r = t.http.post(
        t.path("attempts", aid, "heartbeat"),
        json={"progress": {"done": 3, "total": 4, "stage": "upload"}}, headers=worker,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    page = console.page
    await console.login(t.key, t.ns)
    await console.go(f"#/tasks/{task['id']}")
    section = page.locator("section.progress-report")
    await expect(section).to_contain_text("75 %")
    await expect(section).to_contain_text('"stage":"upload"')
    await console.shot("task-progress")
