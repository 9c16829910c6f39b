"""The web console (/ui) in a real headless Chromium, against a real ``orbit-server`` process.

The browser is Debian's ``chromium`` driven by Playwright (``pip install playwright``; the
system browser, never ``playwright install``). The tests skip only when no browser or no
Playwright can be found. Screenshots of every view land in ``reports/ui/``.

The server is started as ``orbit-server`` (its composition root mounts the console).
"""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from platform_fixtures import ROOT, process_env, run_cli, unique

from orbit.storage import DSN, Database

pytestmark = pytest.mark.process

try:
    from playwright.async_api import Browser, BrowserContext, Page, async_playwright
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
STATIC = ROOT / "orbit" / "http" / "ui_static"
VIEWPORT = {"width": 1366, "height": 768}
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TIMEOUT_MS = 15_000

SERVER = r"""
import sys
import orbit_cmd.server as server
sys.exit(server.main(sys.argv[1:]))
"""


def driver_missing() -> str | None:
    """Why Playwright's bundled driver (a node binary) cannot start here; None when it can.
    It links libatomic, which a minimal Debian does not have."""
    if ctypes.util.find_library("atomic") is None:
        return ("Playwright's driver needs libatomic.so.1: run scripts/test as root (it "
                "installs Debian's libatomic1), or sudo apt-get install libatomic1")
    return None


def find_browser() -> str | None:
    """The system Chromium: $ORBIT_CHROMIUM, else chromium / chromium-browser on PATH."""
    explicit = os.environ.get("ORBIT_CHROMIUM")
    if explicit and Path(explicit).exists():
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


# --------------------------------------------------------------------------- server process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConsoleServer:
    """``orbit-server`` on a free port, with the console mounted."""

    def __init__(self, dsn: DSN) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, "--dsn", dsn.url(hide_password=False),
             "--port", str(self.port), "--plain-logs", "--log-level", "warning"],
            env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"orbit-server exited {self.proc.returncode}: {err}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("orbit-server did not become ready")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr:
            self.proc.stderr.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(dsn: DSN) -> Iterator[ConsoleServer]:
    s = ConsoleServer(dsn)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


class Tenant:
    """A bootstrapped application (``orbit admin bootstrap``) and an API client for it."""

    def __init__(self, url: str, boot: dict[str, str]) -> None:
        self.key = boot["key"]
        self.ns = boot["namespace"]
        self.application_id = boot["application_id"]
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {self.key}"}, timeout=20
        )

    def path(self, *parts: str) -> str:
        return f"/v1/namespaces/{self.ns}/" + "/".join(parts)

    def served(self, method: str, template: str) -> bool:
        doc = self.http.get("/openapi.json").json()
        return method.lower() in doc["paths"].get(template, {})

    def queue(self, name: str, **config: Any) -> dict[str, Any]:
        r = self.http.put(self.path("queues", name), json=config)
        assert r.status_code in (200, 201), r.text
        return r.json()  # type: ignore[no-any-return]

    def submit(self, queue: str, kind: str, payload: str = "{}", **fields: Any) -> dict[str, Any]:
        """Submit with the payload as exact JSON text (kept byte for byte by the server)."""
        extra = "".join(f', "{k}": {json.dumps(v)}' for k, v in fields.items())
        body = f'{{"queue": "{queue}", "kind": "{kind}", "payload": {payload}{extra}}}'
        r = self.http.post(
            self.path("tasks"), content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def task(self, task_id: str) -> dict[str, Any]:
        r = self.http.get(self.path("tasks", task_id))
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


async def bootstrap(server: ConsoleServer, db: Database) -> Tenant:
    """A fresh tenant, bootstrapped in-process (what ``orbit admin bootstrap`` runs)."""
    from orbit.bootstrap import bootstrap as run_bootstrap

    result = await run_bootstrap(db, unique("ui"), unique("ns"))
    return Tenant(server.url, result.to_json())


def bootstrap_cli(server: ConsoleServer, dsn: DSN) -> Tenant:
    """A fresh tenant made by the operator command ``orbit admin bootstrap``."""
    r = run_cli(
        "admin", "bootstrap", "--application", unique("ui"), "--namespace", unique("ns"),
        "--dsn", dsn.url(hide_password=False),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return Tenant(server.url, json.loads(r.stdout.strip().splitlines()[-1]))


# --------------------------------------------------------------------------- browser


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    path = find_browser()
    if async_playwright is None:
        pytest.skip("Playwright is not installed: scripts/install dev")
    if (missing := driver_missing()) is not None:
        pytest.skip(missing)
    if path is None:
        pytest.skip("no Chromium found: run scripts/test as root (it installs Debian's chromium), "
                    "or sudo apt-get install chromium, or set ORBIT_CHROMIUM")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=path, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            await b.close()


class Console:
    """One browser tab on the console, failing the test on any script error or CSP refusal."""

    def __init__(self, context: BrowserContext, page: Page, base: str) -> None:
        self.context = context
        self.page = page
        self.base = base
        self.problems: list[str] = []
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("console", self._console)

    def _console(self, msg: Any) -> None:
        text = msg.text
        if msg.type == "error" and ("Refused" in text or "Trusted" in text or "Uncaught" in text):
            self.problems.append(f"console: {text}")

    async def open(self, hash_: str = "") -> None:
        await self.page.goto(f"{self.base}/ui/{hash_}")

    async def login(self, key: str, namespace: str | None = None) -> None:
        await self.open()
        await self.page.get_by_label("API key").fill(key)
        if namespace is not None:
            await self.page.locator("#login-ns").fill(namespace)
        await self.page.get_by_role("button", name="Sign in").click()
        await pw_expect(self.page.get_by_role("navigation", name="Views")).to_be_visible()

    async def go(self, hash_: str) -> None:
        await self.page.evaluate("h => { window.location.hash = h; }", hash_)

    async def shot(self, name: str, *, full_page: bool = False) -> Path:
        REPORTS.mkdir(parents=True, exist_ok=True)
        path = REPORTS / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=full_page)
        return path

    async def storage(self) -> dict[str, Any]:
        return await self.page.evaluate(  # type: ignore[no-any-return]
            "() => ({session: {...sessionStorage}, local: {...localStorage}, url: location.href,"
            " cookie: document.cookie})"
        )

    def assert_clean(self) -> None:
        assert not self.problems, self.problems


@pytest.fixture
async def console(browser: Browser, server: ConsoleServer) -> AsyncIterator[Console]:
    context = await browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(TIMEOUT_MS)
    page = await context.new_page()
    c = Console(context, page, server.url)
    try:
        yield c
    finally:
        await context.close()
    c.assert_clean()


def expect(locator: Any) -> Any:
    return pw_expect(locator)


# --------------------------------------------------------------------------- no browser needed


def test_console_is_served_with_a_strict_policy(server: ConsoleServer) -> None:
    r = httpx.get(server.url + "/ui", follow_redirects=False)
    assert r.status_code in (301, 307, 308) and r.headers["location"].endswith("/ui/")
    shell = httpx.get(server.url + "/ui/")
    assert shell.status_code == 200 and shell.headers["content-type"].startswith("text/html")
    csp = shell.headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "connect-src 'self'",
                      "frame-ancestors 'none'", "require-trusted-types-for 'script'"):  # fmt: skip
        assert directive in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert shell.headers["cache-control"] == "no-cache"
    assert shell.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in shell.text and not re.search(
        r"\son[a-z]+=", shell.text
    )  # no inline code
    assets = re.findall(r'(?:src|href)="(/ui/assets/[0-9a-f]{16}/[^"]+)"', shell.text)
    assert any(a.endswith("js/app.js") for a in assets) and any(a.endswith(".css") for a in assets)
    for asset in assets:
        a = httpx.get(server.url + asset)
        assert a.status_code == 200, asset
        assert a.headers["cache-control"] == "public, max-age=31536000, immutable"
        again = httpx.get(server.url + asset, headers={"If-None-Match": a.headers["etag"]})
        assert again.status_code == 304
    stale = re.sub(r"/assets/[0-9a-f]{16}/", "/assets/0000000000000000/", assets[0])
    assert httpx.get(server.url + stale).status_code == 404
    assert httpx.post(server.url + "/ui/").status_code == 405
    assert not any(
        p.startswith("/ui") for p in httpx.get(server.url + "/openapi.json").json()["paths"]
    )


def test_asset_addresses_change_with_any_asset(tmp_path: Path) -> None:
    """The build hash covers every asset, so a release never serves stale cached files."""
    from orbit.http.ui import load_bundle

    (tmp_path / "js").mkdir()
    (tmp_path / "index.html").write_text('<script type="module" src="{{ASSET_BASE}}js/a.js">')
    (tmp_path / "js" / "a.js").write_text("export const a = 1;")
    (tmp_path / "notes.txt").write_text("not served")
    first = load_bundle(tmp_path)
    assert set(first.assets) == {"js/a.js"}
    assert f"/ui/assets/{first.build}/js/a.js".encode() in first.shell.body
    (tmp_path / "js" / "a.js").write_text("export const a = 2;")
    second = load_bundle(tmp_path)
    assert second.build != first.build
    (tmp_path / "index.html").unlink()
    with pytest.raises(FileNotFoundError):
        load_bundle(tmp_path)


def test_console_sources_never_write_html_strings() -> None:
    """Data reaches the page through text nodes only (Trusted Types would also refuse)."""
    sinks = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|localStorage\.setItem|document\.cookie\s*="
    )
    files = sorted(STATIC.rglob("*.js"))
    assert len(files) >= 10
    for f in files:
        assert not sinks.search(f.read_text()), (
            f"{f.name} uses an HTML/script sink or persistent storage"
        )


# --------------------------------------------------------------------------- browser tests


async def test_login_queues_pause_resume_and_logout(
    console: Console, server: ConsoleServer, dsn: DSN
) -> None:
    t = bootstrap_cli(server, dsn)
    t.queue("emails", max_concurrency=4, max_unfinished_tasks=1000)
    t.queue("reports")
    for i in range(3):
        t.submit("emails", "send_welcome", f'{{"user": {i}}}')
    page = console.page

    await console.open()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await console.shot("01-login")
    # A wrong key is refused with a message, and nothing is stored.
    await page.get_by_label("API key").fill("orb_" + "0" * 32 + "_nope")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("rejected")
    assert (await console.storage())["session"] == {}

    await console.login(t.key)
    await expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    emails = page.locator("tr[data-queue='emails']")
    await expect(emails.locator("td").nth(1)).to_have_text("3")  # WAITING column
    await expect(emails.get_by_role("link", name="3 waiting tasks in emails")).to_be_visible()
    await expect(page.locator("tr[data-queue='reports']")).to_be_visible()
    # The key lives only in sessionStorage; not in localStorage, cookies or the URL.
    stored = await console.storage()
    assert stored["session"]["orbit.console.key"] == t.key
    assert stored["session"]["orbit.console.namespace"] == t.ns
    assert stored["local"] == {} and stored["cookie"] == ""
    assert t.key not in stored["url"]
    assert await page.get_by_label("API key").input_value() == ""
    await console.shot("02-queues")

    await page.get_by_role("button", name="Pause queue emails").click()
    await expect(page.get_by_role("button", name="Resume queue emails")).to_be_visible()
    await expect(emails.locator("td").first).to_have_text("PAUSED")
    assert t.http.get(t.path("queues", "emails")).json()["paused"] is True
    await expect(page.locator("#announcer")).to_have_text("Queue emails paused")
    await console.shot("03-queue-paused")
    await page.get_by_role("button", name="Resume queue emails").click()
    await expect(page.get_by_role("button", name="Pause queue emails")).to_be_visible()
    assert t.http.get(t.path("queues", "emails")).json()["paused"] is False

    # Live update: a task submitted elsewhere shows up without reloading.
    t.submit("emails", "send_welcome", '{"user": 99}')
    await expect(emails.locator("td").nth(1)).to_have_text("4", timeout=12_000)

    # A hidden tab stops polling (and says so); visible again, it resumes at once.
    await page.evaluate(
        "() => { Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true});"
        " document.dispatchEvent(new Event('visibilitychange')); }"
    )
    await expect(page.locator("#live-state")).to_have_text("Paused (tab hidden)")
    await page.evaluate(
        "() => { Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});"
        " document.dispatchEvent(new Event('visibilitychange')); }"
    )
    await expect(page.locator("#live-state")).to_contain_text("Live · updated")

    # Keyboard: the nav is reachable with Tab, focus is visible (an outline), Enter follows.
    nav = page.get_by_role("navigation", name="Views")
    await nav.get_by_role("link", name="Queues", exact=True).focus()
    await page.keyboard.press("Tab")
    focused = await page.evaluate(
        "() => [document.activeElement.textContent, getComputedStyle(document.activeElement).outlineStyle]"
    )
    assert focused == ["Tasks", "solid"]
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
    await expect(nav.get_by_role("link", name="Tasks", exact=True)).to_have_attribute(
        "aria-current", "page"
    )

    await page.get_by_role("button", name="Log out").click()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    stored = await console.storage()
    assert stored["session"] == {} and stored["local"] == {}
    # After logout a reload does not come back signed in.
    await page.reload()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


async def test_task_search_paging_and_detail_with_exact_json(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    t.queue("billing")
    exact = (
        '{"amount": 1.10, "big": 12345678901234567890, "tags": ["a", "b"], "nested": {"x": 1e3}}'
    )
    first = t.submit("billing", "charge", exact, dedup_key="order-1")
    for i in range(2, 5):
        t.submit("billing", "charge", f'{{"amount": {i}}}', dedup_key=f"order-{i}")
    t.submit("billing", "refund", '{"amount": 5}')
    page = console.page
    await console.login(t.key, t.ns)

    await (
        page.get_by_role("navigation", name="Views")
        .get_by_role("link", name="Tasks", exact=True)
        .click()
    )
    await page.get_by_label("Queue").fill("billing")
    await page.get_by_label("Kind").fill("charge")
    await page.get_by_label("Per page").select_option("25")
    await page.get_by_role("button", name="Search").click()
    rows = page.locator("table.grid tbody tr")
    await expect(rows).to_have_count(4)
    assert "kind=charge" in page.url and "queue=billing" in page.url
    assert t.key not in page.url
    await console.shot("04-task-search")

    # Other filters are applied by the API (the URL carries them, never the key).
    await console.go("#/tasks?queue=billing&kind=charge&dedup_key=order-3")
    await expect(rows).to_have_count(1)
    await console.go("#/tasks?queue=billing&state=WAITING")
    await expect(rows).to_have_count(5)

    # Task detail: facts, the payload's exact text, attempts, timeline.
    await page.get_by_role("link", name=f"Task {first['id']}").click()
    await expect(
        page.get_by_role("heading", name=re.compile("Task " + first["id"]))
    ).to_be_visible()
    await expect(page.locator("dl.facts")).to_contain_text("order-1")
    payload = page.get_by_label("Payload (pretty)")
    await expect(payload).to_contain_text("12345678901234567890")
    await expect(payload).to_contain_text("1.10")
    await expect(payload).to_contain_text("1e3")
    await (
        page.get_by_role("group", name="Payload view")
        .get_by_role("button", name="Exact text")
        .click()
    )
    assert await page.get_by_label("Payload (exact text)").text_content() == exact
    await expect(page.get_by_role("heading", name="Attempts")).to_be_visible()
    await expect(page.get_by_role("heading", name="Timeline")).to_be_visible()
    await console.shot("05-task-detail", full_page=True)

    # Cancel from the detail page (a waiting task ends CANCELLED at once).
    await page.get_by_text("Cancel task…").click()
    await page.get_by_role("button", name="Yes, cancel this task").click()
    await expect(page.locator("h1 .state")).to_have_text("CANCELLED")
    assert t.task(first["id"])["state"] == "CANCELLED"


async def test_paging_with_a_small_page(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    t.queue("bulk")
    ids = [t.submit("bulk", "k", f'{{"i": {i}}}')["id"] for i in range(30)]
    page = console.page
    await console.login(t.key, t.ns)
    await console.go("#/tasks?queue=bulk&limit=25")
    rows = page.locator("table.grid tbody tr")
    await expect(rows).to_have_count(25)
    await expect(page.get_by_text("Page 1 · 25 tasks")).to_be_visible()
    await page.get_by_role("button", name="Next page →").click()
    await expect(rows).to_have_count(5)
    await expect(page.get_by_text("Page 2 · 5 tasks")).to_be_visible()
    shown = await page.locator("table.grid tbody tr th a").evaluate_all(
        "els => els.map(e => e.title)"
    )
    assert shown == ids[25:]
    await page.get_by_role("button", name="← Previous page").click()
    await expect(rows).to_have_count(25)


async def _needs_review(t: Tenant, db: Database) -> dict[str, Any]:
    """A task whose running attempt was lost: NEEDS_REVIEW with effect_uncertain."""
    from pulse.recovery import Recovery

    t.queue("fragile", lease_ms=1000)
    task = t.submit("fragile", "charge_card", '{"card": "4242", "cents": 1999}')
    r = t.http.post(
        t.path("workers", "sessions"),
        json={"instance": {"host": "test", "pid": 1, "sdk": "ui-test"}, "queues": ["fragile"],
              "max_concurrency": 1},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    sid, token = r.json()["session_id"], r.json()["session_token"]
    worker = {"Authorization": f"Bearer {token}"}
    r = t.http.post(
        t.path("workers", "sessions", sid, "poll"), params={"wait_ms": 5000}, headers=worker
    )
    (offer,) = r.json()["offers"]
    r = t.http.post(t.path("attempts", offer["attempt_id"], "start"), headers=worker)
    assert r.json()["type"] == "started", r.text
    recovery = Recovery(db)
    for _ in range(100):  # the attempt's lease (1 s) runs out; recovery decides
        await asyncio.sleep(0.2)
        await recovery.run_once()
        view = t.task(task["id"])
        if view["state"] == "NEEDS_REVIEW":
            return view
    raise AssertionError(f"task never reached NEEDS_REVIEW: {view['state']}")


def _exhaust_one_delivery(t: Tenant, subscription: str) -> str:
    """A result event delivered once and nacked, with a budget of one: EXHAUSTED."""
    t.queue("events-src")
    task = t.submit("events-src", "k", "{}")
    assert t.http.post(t.path("tasks", task["id"], "cancel")).status_code == 200
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = t.http.post(
            t.path("subscriptions", subscription, "pull"), json={"max": 1, "wait_ms": 2000}
        )
        assert r.status_code == 200, r.text
        for d in r.json()["deliveries"]:
            n = t.http.post(
                t.path("deliveries", d["delivery_id"], "nack"), json={"proof": d["proof"]}
            )
            assert n.status_code == 200, n.text
            return str(d["delivery_id"])
    raise AssertionError("no delivery came")


async def test_review_inbox_resolves_a_task(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    stuck = await _needs_review(t, db)
    assert stuck["effect_uncertain"] is True
    page = console.page
    await console.login(t.key, t.ns)
    await expect(page.locator("#review-count")).to_have_text("1")
    await page.get_by_role("link", name=re.compile("Review inbox")).click()
    card = page.locator("li.card").filter(has=page.get_by_role("link", name=f"Task {stuck['id']}"))
    await expect(card).to_contain_text("effect uncertain")
    await card.get_by_text("Resolve…").click()
    await card.get_by_label("Mark succeeded").check()
    await card.get_by_label("Result (JSON, sent exactly as typed)").fill('{"charged": 19.990}')
    await card.get_by_role("button", name="Resolve task").click()
    await expect(card.get_by_role("status")).to_contain_text("Write a note")  # note is required
    await card.get_by_label(re.compile("^Note")).fill("checked the card processor: charged once")
    await console.shot("06-review-inbox")
    await card.get_by_role("button", name="Resolve task").click()
    await expect(page.get_by_text("Nothing needs review.")).to_be_visible()
    done = t.task(stuck["id"])
    assert done["state"] == "SUCCEEDED" and done["effect_uncertain"] is False
    assert done["resolution"]["note"] == "checked the card processor: charged once"
    r = t.http.get(t.path("tasks", stuck["id"]))
    assert '{"charged": 19.990}' in r.text  # sent and stored exactly as typed
    # The detail page shows the exact result, the lost attempt and the resolution.
    await console.go(f"#/tasks/{stuck['id']}")
    await expect(page.get_by_label("Result (pretty)")).to_contain_text("19.990")
    await expect(page.locator("table.grid").first).to_contain_text("LOST")
    await expect(page.get_by_role("heading", name="Resolution")).to_be_visible()
    await console.shot("07-task-resolved", full_page=True)


async def test_other_views_work_or_say_not_available(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    t = await bootstrap(server, db)
    t.queue("nightly")
    page = console.page
    await console.login(t.key, t.ns)
    unavailable = page.get_by_role("heading", name="Not available on this server")

    # Schedules
    if t.served("PUT", "/v1/namespaces/{ns}/schedules/{name}"):
        r = t.http.put(t.path("schedules", "nightly-report"), json={
            "queue": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris",
            "task": {"kind": "report", "payload": {"full": True}},
        })  # fmt: skip
        assert r.status_code == 201, r.text
        await console.go("#/schedules/nightly-report")
        await expect(
            page.get_by_role("heading", name=re.compile("Schedule nightly-report"))
        ).to_be_visible()
        await expect(page.locator("dl.facts")).to_contain_text("0 3 * * *")
        await expect(page.locator("dl.facts")).to_contain_text("local")  # next fire time
        await console.shot("08-schedule-detail")
        await page.get_by_role("button", name="Pause schedule").click()
        await expect(page.get_by_role("button", name="Resume schedule")).to_be_visible()
        # An interval schedule fires while we watch: its occurrences appear live.
        r = t.http.put(t.path("schedules", "heartbeat"), json={
            "queue": "nightly", "every_ms": 1000, "task": {"kind": "ping", "payload": {}},
        })  # fmt: skip
        assert r.status_code == 201, r.text
        await console.go("#/schedules/heartbeat")
        created = page.locator("table.grid tbody tr").filter(has_text="CREATED")
        await expect(created.first).to_be_visible(timeout=20_000)
        await expect(created.first.get_by_role("link", name=re.compile("^Task "))).to_be_visible()
        await console.go("#/schedules")
        await expect(page.get_by_role("link", name="nightly-report")).to_be_visible()
        await expect(page.get_by_role("link", name="heartbeat")).to_be_visible()
        await console.shot("08-schedules")
        t.http.post(t.path("schedules", "heartbeat", "pause"))
    else:
        await console.go("#/schedules")
        await expect(unavailable).to_be_visible()

    # Subscriptions
    if t.served("PUT", "/v1/namespaces/{ns}/subscriptions/{name}"):
        r = t.http.put(t.path("subscriptions", "inbox"),
                       json={"filter": {}, "start": "earliest", "max_deliveries": 1})  # fmt: skip
        assert r.status_code == 201, r.text
        exhausted = _exhaust_one_delivery(t, "inbox")
        await console.go("#/subscriptions")
        await page.get_by_label("Subscription name").fill("inbox")
        await page.get_by_role("button", name="Open").click()
        await expect(page.get_by_role("heading", name="Subscription inbox")).to_be_visible()
        await expect(page.get_by_role("group", name="Backlog")).to_contain_text("Exhausted")
        button = page.get_by_role("button", name=f"Add budget to delivery {exhausted}")
        await expect(button).to_be_visible()
        await console.shot("09-subscription")
        await page.get_by_label("Deliveries to add").fill("2")
        await button.click()
        await expect(page.get_by_text("No exhausted delivery.")).to_be_visible()
        r = t.http.get(t.path("subscriptions", "inbox", "deliveries"))
        (revived,) = [d for d in r.json()["items"] if d["delivery_id"] == exhausted]
        assert revived["state"] != "EXHAUSTED" and revived["budget"] >= 2
        await console.go("#/subscriptions")
        await expect(
            page.get_by_role("link", name="inbox", exact=True)
        ).to_be_visible()  # remembered
    else:
        await console.go("#/subscriptions")
        await expect(unavailable).to_be_visible()

    # Workflows: definitions and the step graph of a version; instances when served.
    if t.served("POST", "/v1/namespaces/{ns}/workflows/{name}/versions"):
        definition = {"steps": [
            {"id": "charge", "type": "task", "queue": "nightly", "kind": "charge", "on_failure": "failed"},
            {"id": "fan", "type": "parallel", "branches": [
                {"name": "mail", "steps": [{"id": "mail", "type": "task", "queue": "nightly", "kind": "mail"}]},
                {"name": "ship", "steps": [{"id": "ship", "type": "wait_signal", "signal": "shipped"}]}]},
            {"id": "fan_join", "type": "join", "parallel": "fan"},
            {"id": "done", "type": "succeed"},
            {"id": "failed", "type": "fail", "error": "charge_failed"}]}  # fmt: skip
        r = t.http.post(t.path("workflows", "order", "versions"), json={"definition": definition})
        assert r.status_code == 201, r.text
        await console.go("#/workflows")
        await page.get_by_role("link", name="order").click()
        await expect(page.get_by_role("heading", name="Workflow order")).to_be_visible()
        graph = page.locator("ol.graph").first
        await expect(graph).to_contain_text("charge")
        await expect(graph.locator("ul.branches")).to_contain_text("Branch ship")
        await console.shot("10-workflow", full_page=True)
    else:
        await console.go("#/workflows")
        await expect(unavailable).to_be_visible()
    if t.served("POST", "/v1/namespaces/{ns}/workflows/{name}/instances") and t.served(
        "POST", "/v1/namespaces/{ns}/workflows/{name}/versions"
    ):
        r = t.http.post(t.path("workflows", "order", "instances"),
                        json={"input": {"order": 7}, "business_key": "order-7"})  # fmt: skip
        assert r.status_code == 201, r.text
        instance = r.json()
        await console.go("#/workflows")
        await page.get_by_role("link", name=f"Instance {instance['id']}").click()
        await expect(page.get_by_role("heading", name=re.compile("^Instance"))).to_contain_text(
            "RUNNING"
        )
        graph = page.locator("ol.graph").first
        await expect(graph.locator("li.step").first).to_contain_text("charge")
        await expect(graph.locator("li.step-NOT_REACHED").first).to_be_visible()
        await expect(page.get_by_role("heading", name="History")).to_be_visible()
        await page.get_by_role("button", name="Pause instance").click()
        await expect(page.get_by_role("button", name="Resume instance")).to_be_visible()
        await console.shot("11-instance", full_page=True)
        await page.get_by_role("button", name="Cancel instance").click()
        await expect(page.get_by_role("heading", name=re.compile("^Instance"))).to_contain_text(
            "CANCELLED"
        )
    elif not t.served("GET", "/v1/namespaces/{ns}/instances/{id}"):
        await console.go("#/instances/" + "0" * 32)
        await expect(unavailable).to_be_visible()
        await console.shot("11-instances-not-available")

    # Activity: result events, live.
    if t.served("GET", "/v1/namespaces/{ns}/events"):
        task = t.submit("nightly", "report", "{}")
        t.http.post(t.path("tasks", task["id"], "cancel"))
        await console.go("#/events")
        await expect(page.locator("table.grid tbody")).to_contain_text("task.cancelled")
        await console.shot("12-activity")

    # An unknown view and an absent task answer clearly.
    await console.go("#/nowhere")
    await expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    await console.go("#/tasks/" + "f" * 32)
    await expect(page.get_by_role("alert")).to_contain_text("404")


async def test_a_revoked_key_returns_to_the_login_form(
    console: Console, server: ConsoleServer, db: Database, dsn: DSN
) -> None:
    t = await bootstrap(server, db)
    t.queue("q1")
    page = console.page
    await console.login(t.key, t.ns)
    await expect(page.locator("tr[data-queue='q1']")).to_be_visible()
    # Rotating the bootstrap key (`--rotate`) issues a new key; the old one stops working,
    # and the next call (here: opening another view) signs the tab out.
    boot = rotate_bootstrap_key(dsn, t)
    assert boot["key"] != t.key
    await console.go("#/tasks")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await expect(page.locator("#login-error")).to_contain_text("no longer accepts this key")
    assert (await console.storage())["session"] == {}


def rotate_bootstrap_key(dsn: DSN, t: Tenant) -> dict[str, str]:
    app = httpx.get(
        str(t.http.base_url) + "/v1/whoami", headers={"Authorization": f"Bearer {t.key}"}
    ).json()
    name = t.http.get(f"/v1/applications/{app['application_id']}").json()["name"]
    r = run_cli(
        "admin", "bootstrap", "--application", name, "--namespace", t.ns, "--rotate",
        "--dsn", dsn.url(hide_password=False),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def test_views_degrade_when_the_server_lacks_their_api(
    console: Console, server: ConsoleServer, db: Database
) -> None:
    """An older or partial server: routes it does not know answer 404 ("route not found")
    or 405. Here the browser's calls to schedules and subscriptions are answered that way,
    and /openapi.json is filtered so workflows look absent: each view says so plainly, and
    the others keep working."""
    t = await bootstrap(server, db)
    t.queue("q")
    page = console.page
    missing = json.dumps(
        {"error": {"code": "not_found", "message": "route not found", "details": {}}}
    )

    async def no_route(route: Any) -> None:
        await route.fulfill(status=404, body=missing, content_type="application/json")

    async def not_allowed(route: Any) -> None:
        body = {
            "error": {"code": "method_not_allowed", "message": "Method Not Allowed", "details": {}}
        }
        await route.fulfill(status=405, body=json.dumps(body), content_type="application/json")

    doc = t.http.get("/openapi.json").json()

    async def without_workflows(route: Any) -> None:
        doc["paths"] = {
            p: v for p, v in doc["paths"].items() if "workflows" not in p and "instances" not in p
        }
        await route.fulfill(status=200, body=json.dumps(doc), content_type="application/json")

    await page.route(re.compile(r".*/v1/namespaces/[^/]+/schedules.*"), no_route)
    await page.route(re.compile(r".*/v1/namespaces/[^/]+/subscriptions/.*"), not_allowed)
    await page.route(re.compile(r".*/openapi\.json$"), without_workflows)
    await console.login(t.key, t.ns)
    unavailable = page.get_by_role("heading", name="Not available on this server")

    await console.go("#/schedules")
    await expect(unavailable).to_be_visible()
    await console.shot("13-not-available")
    await console.go("#/subscriptions/inbox")
    await expect(unavailable).to_be_visible()
    await console.go("#/workflows")
    await expect(unavailable).to_be_visible()
    await console.go("#/instances/" + "0" * 32)
    await expect(unavailable).to_be_visible()
    # The views whose API exists still work.
    await console.go("#/queues")
    await expect(page.locator("tr[data-queue='q']")).to_be_visible()
    await expect(unavailable).to_have_count(0)
