"""Targeted scenarios with real processes: a poison task, pool exhaustion, a migration runner
killed between statements. Each test's docstring states the expected behaviour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_support import (
    CliTenant,
    OrbitServer,
    cli_tenant,
    connect,
    get_task,
    kill_connections_of,
    process_env,
    put_queue,
    query,
    record_figures,
    submit,
)
from reliability_support import log_dir as log_dir

from orbit import migrate
from orbit.migrate import DirtySchema
from orbit.storage import DSN

pytestmark = pytest.mark.process

WORKER = r"""
import asyncio, os, signal, sys
from orbit_sdk import Worker

base, key, ns = sys.argv[1:4]
worker = Worker(base, key, namespace=ns, max_concurrency=1, drain_timeout=1)

async def ok(ctx, payload):
    return {"n": payload["n"]}

async def poison(ctx, payload):
    print("POISON", ctx.task_id, ctx.generation, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the task kills its worker, every time

worker.register("work", "ok", ok)
worker.register("work", "poison", poison)
asyncio.run(worker.run(install_signal_handlers=False))
"""


@pytest.fixture(scope="module")
def fast_server(dsn: DSN, log_dir: Path) -> Iterator[OrbitServer]:
    s = OrbitServer(dsn, log_dir, extra_args=["--pool-size", "3", "--pool-timeout", "1"],
                    env={"ORBIT_PULSE_RECOVERY_INTERVAL_MS": "200"})  # fmt: skip
    s.start()
    try:
        yield s
    finally:
        assert s.stop() == 0, s.logs()[-3000:]


def _spawn(server: OrbitServer, t: CliTenant) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, server.url, t.key, t.namespace],
        env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def test_poison_task_ends_failed_after_its_attempts_while_others_flow(
    fast_server: OrbitServer, dsn: DSN
) -> None:
    """Two tasks whose handler SIGKILLs its own worker process, among 20 ordinary tasks, on
    a queue with a 1 s lease and ``max_attempts`` 3; three single-slot SDK workers, restarted
    by a supervisor whenever they die. Expected (docs/retries.md "Recovery"): each killed
    attempt is LOST when its lease passes; the ``retry_safe`` poison is retried until its
    3 attempts are used and then ends FAILED ``attempts_exhausted`` with ``effect_uncertain``
    false (a retry-safe task's effect is idempotent, so nothing is uncertain); the other poison (not retry-safe) goes to NEEDS_REVIEW with
    ``effect_uncertain`` after its first attempt; every ordinary task
    SUCCEEDS meanwhile; no task is left unfinished."""
    t = cli_tenant(dsn)
    put_queue(fast_server.url, t, "work", lease_ms=1000,
              retry={"max_attempts": 3, "backoff_initial_ms": 100, "backoff_max_ms": 200,
                     "backoff_multiplier": 2})  # fmt: skip
    safe = submit(fast_server.url, t, "work", kind="poison", retry_safe=True, payload={"n": -1})
    unsafe = submit(fast_server.url, t, "work", kind="poison", payload={"n": -2})
    ok_ids = [submit(fast_server.url, t, "work", kind="ok", payload={"n": i})["id"] for i in range(20)]
    workers = [_spawn(fast_server, t) for _ in range(3)]
    restarts = 0
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            for i, w in enumerate(workers):
                if w.poll() is not None:
                    restarts += 1
                    workers[i] = _spawn(fast_server, t)
            r = httpx.get(f"{fast_server.url}/v1/namespaces/{t.namespace}/tasks",
                          params={"limit": 500}, headers=t.auth, timeout=30)  # fmt: skip
            states = {item["id"]: item["state"] for item in r.json()["items"]}
            if all(s in ("SUCCEEDED", "FAILED", "NEEDS_REVIEW", "CANCELLED") for s in states.values()):
                break
            time.sleep(0.2)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait(10)
    s_task = get_task(fast_server.url, t, safe["id"])
    u_task = get_task(fast_server.url, t, unsafe["id"])
    record_figures("poison_task", worker_deaths=restarts, safe_attempts=s_task["attempts"],
                   unsafe_attempts=u_task["attempts"], ok_tasks=len(ok_ids),
                   ok_succeeded=sum(states[i] == "SUCCEEDED" for i in ok_ids))  # fmt: skip
    assert s_task["state"] == "FAILED" and s_task["attempts"] == 3, s_task
    assert s_task["effect_uncertain"] is False
    assert s_task["error"]["type"] == "attempts_exhausted", s_task
    assert u_task["state"] == "NEEDS_REVIEW" and u_task["attempts"] == 1, u_task
    assert u_task["effect_uncertain"] is True
    assert all(states[i] == "SUCCEEDED" for i in ok_ids), {i: states[i] for i in ok_ids if states[i] != "SUCCEEDED"}
    assert restarts >= 4  # 3 kills by the safe poison + 1 by the other
    r = httpx.get(f"{fast_server.url}/v1/namespaces/{t.namespace}/tasks/{safe['id']}/attempts", headers=t.auth)
    assert [a["state"] for a in r.json()["items"]] == ["LOST"] * 3


def test_pool_exhaustion_answers_503_fast_and_recovers(fast_server: OrbitServer, dsn: DSN) -> None:
    """Every pooled connection (3) is held by a request blocked on a row lock taken from
    outside (``PUT …/resources`` waits on the application's resources row). Expected: other
    requests that need the database answer ``503 not_ready`` with ``Retry-After`` within
    the pool timeout (1 s here, ``--pool-timeout``), never hang; ``/healthz`` still answers
    200; once the lock goes, everything succeeds again (the blocked PUTs included).
    (Found: before ``Database.acquire_timeout`` such requests queued for the pool without
    bound — a GET waited until the lock holder let go, up to ``innodb_lock_wait_timeout``.)"""
    t = cli_tenant(dsn)
    put_queue(fast_server.url, t, "default")
    task = submit(fast_server.url, t)
    holder = connect(dsn)
    holder.autocommit(False)
    results: list[tuple[int, float]] = []

    def put_resources() -> None:
        t0 = time.monotonic()
        r = httpx.put(f"{fast_server.url}/v1/applications/{t.application_id}/resources",
                      json={"max_unfinished_tasks": 1000}, headers=t.auth, timeout=60)  # fmt: skip
        results.append((r.status_code, time.monotonic() - t0))

    with holder.cursor() as cur:
        cur.execute("SELECT * FROM orbit_application_resources WHERE application_id = UNHEX(%s) FOR UPDATE",
                    (t.application_id,))  # fmt: skip
    blocked = [threading.Thread(target=put_resources) for _ in range(3)]
    for th in blocked:
        th.start()
    time.sleep(0.8)  # the three PUTs hold the three connections, waiting on the lock
    shed: list[dict[str, Any]] = []
    try:
        for path in (f"/v1/namespaces/{t.namespace}/tasks/{task['id']}", f"/v1/namespaces/{t.namespace}/queues"):
            t0 = time.monotonic()
            r = httpx.get(fast_server.url + path, headers=t.auth, timeout=20)
            shed.append({"path": path, "status": r.status_code, "seconds": round(time.monotonic() - t0, 2),
                         "retry_after": r.headers.get("retry-after"), "body": r.json()})  # fmt: skip
        health = httpx.get(fast_server.url + "/healthz", timeout=5).status_code
    finally:
        holder.rollback()
        holder.close()
    for th in blocked:
        th.join(60)
    after = httpx.get(f"{fast_server.url}/v1/namespaces/{t.namespace}/tasks/{task['id']}", headers=t.auth, timeout=20)
    record_figures("pool_exhaustion", shed=[{k: v for k, v in s.items() if k != "body"} for s in shed],
                   blocked_puts=results)  # fmt: skip
    for s in shed:
        assert s["status"] == 503 and s["seconds"] < 3.0 and s["retry_after"], s
        assert s["body"]["error"]["code"] == "not_ready"
        assert s["body"]["error"]["details"].get("reason") == "pool_exhausted", s
    assert health == 200
    assert after.status_code == 200
    assert sorted(code for code, _ in results) in ([200, 200, 200], [200, 200, 503], [200, 503, 503], [503, 503, 503])


# --- a migration runner killed between statements ----------------------------------------------


def test_migration_runner_killed_between_statements_leaves_a_blocking_dirty_mark(
    empty_db: DSN, tmp_path: Path
) -> None:
    """``orbit-migrate up`` is SIGKILLed while statement 2 of 3 runs (a ``SELECT SLEEP``),
    i.e. after statement 1 was applied. While the server still runs that statement (and so
    holds the runner's named lock) ``status`` reports a live run. Once the runner's
    connection is gone too, expected: the dirty mark names the file and the
    statement that was running (state not ``failed``: nobody saw it fail), ``status`` is not
    current, and the next ``up`` refuses (``DirtySchema``, CLI exit 1) without running
    anything — no automatic dirty clearing. The repair paths for a mark are tested in
    tests/integration/test_migrate_failures.py (``test_a_failing_statement_leaves_a_dirty_mark
    _and_up_refuses``, ``test_repair_*``), which cover a statement that *fails*; this one
    covers a runner that dies."""
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_slow.sql").write_text(
        "CREATE TABLE orbit_first (id INT PRIMARY KEY);\n"
        "SELECT SLEEP(30);\n"
        "CREATE TABLE orbit_third (id INT PRIMARY KEY);\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "orbit_cmd.migrate", "--dsn", empty_db.url(hide_password=False),
         "--migrations-dir", str(folder), "up"],
        env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(200):
            running = query(empty_db, "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                                      " WHERE DB = %s AND INFO LIKE 'SELECT SLEEP(30)%%'", (empty_db.database,))  # fmt: skip
            if running[0][0]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the runner never reached statement 2")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # The server still runs the statement and holds the runner's named lock: a live run
        # as far as anyone can tell, and a second runner refuses to start.
        live = migrate.status(empty_db, folder)
        assert live.running == "0001_slow.sql" and not live.current
        # The runner's host is gone for good: its connection dies (here: killed).
        kill_connections_of(empty_db)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    st = migrate.status(empty_db, folder)
    assert not st.current and st.dirty is not None
    assert (st.dirty.file, st.dirty.statement, st.dirty.statements) == ("0001_slow.sql", 2, 3)
    assert st.dirty.state.value != "failed"
    with pytest.raises(DirtySchema):
        migrate.up(empty_db, folder)
    r = subprocess.run(
        [sys.executable, "-m", "orbit_cmd.migrate", "--dsn", empty_db.url(hide_password=False),
         "--migrations-dir", str(folder), "up"],
        env=process_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 1 and "dirty" in r.stderr
    tables = {row[0] for row in query(empty_db, "SELECT TABLE_NAME FROM information_schema.TABLES"
                                                " WHERE TABLE_SCHEMA = %s", (empty_db.database,))}  # fmt: skip
    assert "orbit_first" in tables and "orbit_third" not in tables
    record_figures("migration_killed", dirty_state=st.dirty.state.value, statement=st.dirty.statement)
