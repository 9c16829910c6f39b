"""``scripts/demo --serve``: after the batch the demo keeps a live platform running for the
web console — a schedule firing, workflow orders, a trickle of tasks, one NEEDS_REVIEW task —
and stops cleanly on Ctrl-C (SIGINT).

One demo process serves the whole module (fixture ``demo``); the tests check it over HTTP,
in the console in a real headless Chromium (screenshots ``reports/ui/demo-*.png``; skipped
only when no browser or no Playwright), and finally interrupt it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import create_database, drop_database
from platform_fixtures import ROOT
from test_ui_browser import driver_missing

# The module's demo starts inside the first test's timeout (a busy machine: up to ~100 s).
pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

try:
    from playwright.async_api import async_playwright
    from playwright.async_api import expect as pw_expect
except ImportError:  # pragma: no cover - depends on the machine
    async_playwright = None  # type: ignore[assignment]

#: Screenshots are published to reports/ui/ only when asked (ORBIT_PUBLISH_SCREENSHOTS=1);
#: otherwise they go to the run's temporary folder, so a test run changes no tracked file.
REPORTS = (
    ROOT / "reports" / "ui"
    if os.environ.get("ORBIT_PUBLISH_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "orbit-ui-screenshots"
)
TASKS = 60
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _find_browser() -> str | None:
    explicit = os.environ.get("ORBIT_CHROMIUM")
    if explicit and Path(explicit).exists():
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def _children(port: int) -> list[int]:
    """PIDs of the demo's live children (Linux /proc): the server on ``port`` and the workers
    pointed at it."""
    server = ("orbit_cmd.server", f"--port {port}")
    worker = (f"orbit_cmd.demo worker --url http://127.0.0.1:{port} ",)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "State:\tZ" in status:
            continue
        if all(t in cmdline for t in server) or all(t in cmdline for t in worker):
            pids.append(int(entry.name))
    return pids


@dataclass
class Demo:
    proc: subprocess.Popen[bytes]
    err_path: Path
    summary: dict[str, Any]
    serving: dict[str, Any]
    live: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        return str(self.serving["url"])

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"{self.url}/v1/namespaces/{self.serving['namespace']}",
            headers={"Authorization": f"Bearer {self.serving['key']}"}, timeout=10,
        )  # fmt: skip

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    dsn = create_database("orbit_test_demo_serve")
    err_path = tmp_path_factory.mktemp("demo") / "stderr.txt"
    port = _free_port()
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orbit_cmd.demo", "--serve", "--tasks", str(TASKS),
             "--workers", "1", "--timeout", "90", "--port", str(port),
             "--dsn", dsn.url(hide_password=False)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines: list[dict[str, Any]] = []
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and not (lines and "serving" in lines[-1]):
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(b"{"):
                lines.append(json.loads(line))
        text = err_path.read_text(errors="replace")[-3000:]
        assert lines and "serving" in lines[-1], f"the demo never started serving:\n{text}"
        summary, serving = lines[-2], lines[-1]
        yield Demo(proc, err_path, summary, serving)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
        for pid in _children(port):  # never leave children behind, even when a test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        drop_database(dsn)


async def wait_live(demo: Demo, within_s: float = 60) -> dict[str, Any]:
    """Wait until the schedule fired a task that succeeded, an order (workflow instance)
    succeeded, trickled tasks succeeded and the stalled ledger task is in NEEDS_REVIEW."""
    if demo.live:
        return demo.live
    found: dict[str, Any] = {}
    async with demo.http() as http:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert demo.proc.poll() is None, demo.stderr()
            if "tick" not in found:
                occ = (await http.get("/schedules/demo-tick/occurrences?outcome=created")).json()
                for o in occ["items"]:
                    task = (await http.get(f"/tasks/{o['task_id']}")).json()
                    if task["state"] == "SUCCEEDED":
                        found["tick"] = (o, task)
                        break
            if "order" not in found:
                page = (await http.get("/instances?workflow=demo-order&state=SUCCEEDED")).json()
                if page["items"]:
                    found["order"] = (await http.get(f"/instances/{page['items'][0]['id']}")).json()
            if "review" not in found:
                task = (await http.get(f"/tasks/{demo.serving['review_task']}")).json()
                if task["state"] == "NEEDS_REVIEW":
                    found["review"] = task
            queue = (await http.get("/queues/demo")).json()
            succeeded = _count(queue, "SUCCEEDED")
            if succeeded > demo.summary["succeeded"]:
                found["trickle"] = succeeded
            if len(found) == 4:
                demo.live = found
                return found
            await asyncio.sleep(0.5)
    raise AssertionError(f"not live within {within_s} s (have {sorted(found)}):\n{demo.stderr()}")


def _count(queue: dict[str, Any], state: str) -> int:
    counts = queue.get("counts") or {}
    return int(counts.get(state, counts.get(state.lower(), 0)))


async def test_demo_serves_a_schedule_a_workflow_tasks_and_a_review_case(demo: Demo) -> None:
    assert demo.summary["finished"] == TASKS and demo.summary["failed"] == 1  # n = 13
    assert demo.serving["serving"] == demo.url + "/ui/"
    live = await wait_live(demo)
    async with demo.http() as http:
        schedule = (await http.get("/schedules/demo-tick")).json()
        assert schedule["cron"] == "* * * * * */10" and schedule["timezone"] == "Europe/Berlin"
        assert schedule["paused"] is False
        occurrence, tick = live["tick"]
        assert occurrence["fire_at"].endswith(("0.000000Z", "0Z"))  # on a multiple of 10 s
        assert tick["queue"] == "demo-cron" and tick["result"]["zone"] == "Europe/Berlin"
        order = live["order"]
        steps = {s["step"]: s["state"] for s in order["steps"]}
        for step in ("reserve", "approval", "pack", "invoice", "done"):
            assert steps.get(step) == "SUCCEEDED", steps
        assert order["output"]["invoice"].startswith("inv-")
        review = live["review"]
        assert review["queue"] == "demo-ledger" and review["effect_uncertain"] is True
        attempts = (await http.get(f"/tasks/{review['id']}/attempts")).json()
        (lost,) = attempts["items"]
        assert lost["state"] == "LOST" and lost["error"]["reason"] == "lease_expired", lost
        assert [e["kind"] for e in lost["evidence"]][:1] == ["lost"], lost
        assert live["trickle"] > demo.summary["succeeded"]
        sub = (await http.get(f"/subscriptions/{demo.serving['subscription']}")).json()
        assert sub["filter"]["queues"] == ["demo"]


async def test_console_shows_the_demo_schedule_and_workflow(demo: Demo) -> None:
    browser_path = _find_browser()
    if async_playwright is None:
        pytest.skip("Playwright is not installed: scripts/install dev")
    if (missing := driver_missing()) is not None:
        pytest.skip(missing)
    if browser_path is None:
        pytest.skip("no Chromium found: run scripts/test as root (it installs Debian's chromium), "
                    "or sudo apt-get install chromium, or set ORBIT_CHROMIUM")
    live = await wait_live(demo)
    REPORTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=browser_path, args=LAUNCH_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1366, "height": 768})
            context.set_default_timeout(15_000)
            page = await context.new_page()
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            # Sign in as the demo tells the reader to: the console address and the demo key.
            await page.goto(demo.serving["serving"])
            await page.get_by_label("API key").fill(demo.serving["key"])
            await page.get_by_role("button", name="Sign in").click()
            await pw_expect(page.get_by_role("navigation", name="Views")).to_be_visible()
            await pw_expect(page.get_by_role("link", name="demo-ledger", exact=True)).to_be_visible()
            await pw_expect(
                page.get_by_role("link", name="1 review tasks in demo-ledger")
            ).to_be_visible()
            await page.screenshot(path=str(REPORTS / "demo-queues.png"))

            await page.evaluate("h => { window.location.hash = h; }", "#/schedules/demo-tick")
            await pw_expect(
                page.get_by_role("heading", name=re.compile("Schedule demo-tick"))
            ).to_be_visible()
            await pw_expect(page.locator("dl.facts")).to_contain_text("Europe/Berlin")
            created = page.locator("table.grid tbody tr").filter(has_text="CREATED")
            await pw_expect(created.first).to_be_visible()
            await page.screenshot(path=str(REPORTS / "demo-schedules.png"), full_page=True)

            order = live["order"]
            await page.evaluate("h => { window.location.hash = h; }", f"#/instances/{order['id']}")
            heading = page.get_by_role("heading", name=re.compile("^Instance"))
            await pw_expect(heading).to_contain_text("SUCCEEDED")
            graph = page.locator("ol.graph").first
            for step in ("reserve", "approval", "pack", "invoice", "route", "done"):
                await pw_expect(graph).to_contain_text(step)
            await pw_expect(page.get_by_role("heading", name="History")).to_be_visible()
            await page.screenshot(path=str(REPORTS / "demo-workflow.png"), full_page=True)

            await page.evaluate("h => { window.location.hash = h; }", "#/review")
            task_id = live["review"]["id"]
            card = page.locator("li.card").filter(
                has=page.get_by_role("link", name=f"Task {task_id}")
            )
            await pw_expect(card).to_contain_text("effect uncertain")
            await page.screenshot(path=str(REPORTS / "demo-review.png"))
            # Resolve it as the inbox invites: retry; the second attempt does not stall.
            await card.get_by_text("Resolve…").click()
            await card.get_by_label("Retry").check()
            await card.get_by_label(re.compile("^Note")).fill("checked the ledger: not posted")
            await card.get_by_role("button", name="Resolve task").click()
            await pw_expect(card).to_have_count(0)
            await context.close()
        finally:
            await browser.close()
    assert not problems, problems
    async with demo.http() as http:
        for _ in range(100):
            task = (await http.get(f"/tasks/{task_id}")).json()
            if task["state"] == "SUCCEEDED":
                break
            await asyncio.sleep(0.2)
    assert task["state"] == "SUCCEEDED" and task["attempts"] == 2, task
    assert task["resolution"]["note"] == "checked the ledger: not posted"
    for name in ("demo-schedules", "demo-workflow"):
        assert (REPORTS / f"{name}.png").stat().st_size > 10_000


def test_ctrl_c_stops_the_demo_cleanly(demo: Demo) -> None:
    """SIGINT: the schedule is paused, workers drain, the server stops; exit code 0."""
    children = _children(demo.port)
    assert len(children) == 3, children  # the server, one demo worker, the stalling worker
    t0 = time.monotonic()
    demo.proc.send_signal(signal.SIGINT)
    code = demo.proc.wait(30)
    took = time.monotonic() - t0
    assert code == 0, demo.stderr()
    assert took < 30
    assert "stopped: workers drained, server stopped" in demo.stderr()
    with pytest.raises(httpx.HTTPError):
        httpx.get(demo.url + "/readyz", timeout=2)
    assert [p for p in children if Path(f"/proc/{p}").exists()
            and "State:\tZ" not in Path(f"/proc/{p}/status").read_text()] == []  # fmt: skip
