"""docs/examples/web_service runs against a real orbit-server: the Starlette app (under
uvicorn) submits with idempotency keys and dedup keys, the worker sends each welcome once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from cli_support import CliTenant, server_fixture
from platform_fixtures import ROOT, free_port

from orbit.storage import DSN

pytestmark = pytest.mark.process

EXAMPLE = ROOT / "docs" / "examples" / "web_service"
server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    tenant = CliTenant.bootstrap(server, dsn)
    tenant.add_queue("emails")
    return tenant


@pytest.fixture
def web(t: CliTenant) -> Iterator[str]:
    port = free_port()
    env = {**t.env, "ORBIT_NAMESPACE": t.namespace}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLE), "app:app",
         "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            try:
                httpx.get(url + "/signups/x", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


def signup(url: str, email: str, key: str | None, name: str = "Ada") -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return httpx.post(url + "/signups", json={"email": email, "name": name}, headers=headers,
                      timeout=30)  # fmt: skip


def test_signups_are_safe_to_retry_and_each_welcome_is_sent_once(
    t: CliTenant, web: str, tmp_path: Path
) -> None:
    first = signup(web, "ada@example.com", "k-1")
    assert first.status_code == 202 and first.json()["deduplicated"] is False
    task_id = first.json()["task_id"]
    retry = signup(web, "ada@example.com", "k-1")  # the client retries the same request
    assert retry.json() == first.json()  # Orbit replayed the original answer
    other_key = signup(web, "ADA@example.com", "k-2")  # a new request for the same person
    assert other_key.json()["task_id"] == task_id and other_key.json()["deduplicated"] is True
    reused = signup(web, "bob@example.com", "k-1")  # same key, different body
    assert reused.status_code == 422
    assert signup(web, "not-an-email", None).status_code == 400

    # 20 people, every request sent twice at the same time (a retrying client or proxy).
    emails = [f"user{i}@example.com" for i in range(20)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda e: signup(web, e, f"key-{e}"), emails * 2))
    assert all(a.status_code == 202 for a in answers)
    ids = {a.json()["task_id"] for a in answers}
    assert len(ids) == 20

    outbox = tmp_path / "outbox.jsonl"
    run = subprocess.run(
        [sys.executable, str(EXAMPLE / "worker.py"), "--outbox", str(outbox), "--burst"],
        env={**t.env, "ORBIT_NAMESPACE": t.namespace}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"succeeded": 21, "failed": 0}
    sent = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert sorted(m["to"] for m in sent) == sorted(["ada@example.com", *emails])
    status = httpx.get(f"{web}/signups/{task_id}", timeout=10).json()
    assert status == {"task_id": task_id, "state": "SUCCEEDED", "attempts": 1}
