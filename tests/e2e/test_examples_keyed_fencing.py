"""docs/examples/keyed_fencing runs against a real orbit-server with a fleet of worker
processes: a worker paused (SIGSTOP) between read and write loses its lease, the task is
retried on another worker, and when the paused one wakes up its write is refused by the
store's fence. Every entry ends up in its account's document exactly once."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import CliTenant, loads, server_fixture
from conftest import create_database, drop_database
from platform_fixtures import ROOT

from orbit.storage import DSN

pytestmark = pytest.mark.process

EXAMPLE = ROOT / "docs" / "examples" / "keyed_fencing"
sys.path.insert(0, str(EXAMPLE))
from store import Store  # noqa: E402

# Short session and offer leases: a stopped worker's session expires in seconds, so the
# retry is not held back by offers sent to the stopped process.
server = server_fixture(ORBIT_PULSE_SESSION_LEASE_MS="3000", ORBIT_PULSE_OFFER_LEASE_MS="2000")


@pytest.fixture
def store_dsn() -> Iterator[str]:
    d = create_database("orbit_fencing")
    try:
        yield d.url(hide_password=False)
    finally:
        drop_database(d)


class WorkerProc:
    """A worker.py process whose stdout lines are collected by a thread."""

    def __init__(self, t: CliTenant, store: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE / "worker.py"), "--store", store],
            env={**t.env, "ORBIT_NAMESPACE": t.namespace}, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, cwd=str(EXAMPLE),
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("ready")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, f"worker exited {self.proc.returncode}"
                continue
            if line.startswith(prefix):
                return line
        raise AssertionError(f"worker never printed {prefix!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()  # SIGTERM: drain
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wait_state(t: CliTenant, task_id: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = t.api("GET", f"/tasks/{task_id}").json()
        if task["state"] in states:
            return task  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise AssertionError(f"task {task_id} stayed {task['state']}")


def post(t: CliTenant, account: str, n: int, hold_ms: int = 0) -> str:
    payload = json.dumps({"account": account, "entry": {"n": n}, "hold_ms": hold_ms})
    r = t.orbit("tasks", "submit", "ledger", "post_entry", "--payload", payload,
                "--concurrency-key", account, "--retry-safe", "--json")  # fmt: skip
    return str(loads(r)["id"])


def test_a_paused_worker_is_fenced_and_every_entry_lands_once(
    server, dsn: DSN, store_dsn: str
) -> None:
    t = CliTenant.bootstrap(server, dsn)
    t.add_queue("ledger", lease_ms=1000, retry={"max_attempts": 20, "backoff_initial_ms": 50,
                                                "backoff_max_ms": 500, "backoff_multiplier": 2})  # fmt: skip
    store = Store(store_dsn)
    workers = [WorkerProc(t, store_dsn)]
    try:
        # 1. Worker A reads, then "works" for a while before writing; we pause it there.
        zombie = post(t, "acct-0", 0, hold_ms=8000)
        workers[0].expect(f"holding {zombie} generation 1")
        workers[0].proc.send_signal(signal.SIGSTOP)
        # 2. Its lease passes; the task (retry_safe) is retried on worker B: generation 2.
        workers.append(WorkerProc(t, store_dsn))
        done = wait_state(t, zombie, {"SUCCEEDED", "FAILED", "NEEDS_REVIEW"})
        assert done["state"] == "SUCCEEDED" and done["attempts"] >= 2
        # 3. A wakes up and writes what it computed before the pause: the store refuses it.
        workers[0].proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 30
        while not store.rejections() and time.monotonic() < deadline:
            time.sleep(0.2)  # (its handler may be cancelled: the write was already in flight)
        # Fenced by the key's concurrency token: 1 for the paused attempt, 2 for the retry.
        assert store.rejections() == [{"account": "acct-0", "task_id": zombie, "generation": 1,
                                       "token": 1, "reason": "stale_token"}]  # fmt: skip
        doc = store.documents()["acct-0"]
        assert [(e["task_id"], e["generation"]) for e in doc["entries"]] == [
            (zombie, done["attempts"])
        ]

        # 4. The fleet: three workers, 30 entries over 3 accounts, many running at once.
        workers.append(WorkerProc(t, store_dsn))
        ids = {post(t, f"acct-{i % 3 + 1}", i): f"acct-{i % 3 + 1}" for i in range(30)}
        for task_id in ids:
            assert (
                wait_state(t, task_id, {"SUCCEEDED", "FAILED", "NEEDS_REVIEW"})["state"]
                == "SUCCEEDED"
            )
    finally:
        for w in workers:
            w.stop()
    docs = store.documents()
    for account in ("acct-1", "acct-2", "acct-3"):
        entries = [e["task_id"] for e in docs[account]["entries"]]
        expected = sorted(tid for tid, acct in ids.items() if acct == account)
        assert sorted(entries) == expected  # each entry exactly once: no lost update
        assert docs[account]["version"] == 10
    assert len(store.rejections()) == 1  # only the paused writer was ever fenced
    attempts = loads(t.orbit("tasks", "attempts", zombie, "--json"))["items"]
    assert attempts[0]["state"] == "LOST"
