"""A real worker process (the SDK's Worker) is killed with SIGKILL mid-task: the server
recovers its attempts per ``retry_safe`` — the retry-safe task runs again on another worker
and succeeds; the other goes to NEEDS_REVIEW with ``effect_uncertain``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_pulse_worker_ws import Live

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import asyncio, sys
from orbit_sdk import Worker

base, key, ns, mode = sys.argv[1:5]
queues = sys.argv[5:]
worker = Worker(base, key, namespace=ns, max_concurrency=4, drain_timeout=1)

async def handler(ctx, payload):
    print("STARTED", ctx.task_id, ctx.generation, flush=True)
    if mode == "hang":
        await asyncio.sleep(3600)
    return {"task": ctx.task_id, "generation": ctx.generation}

for q in queues:
    worker.register(q, "k", handler)
asyncio.run(worker.run(install_signal_handlers=False))
"""


def _spawn(live: Live, key: str, ns: str, mode: str, queues: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "sdk" / "python"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, live.http, key, ns, mode, *queues],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


async def _wait_started(proc: subprocess.Popen[str], n: int, within: float = 30) -> list[str]:
    """Task ids the worker printed as started (reads its stdout in a thread)."""
    assert proc.stdout is not None
    seen: list[str] = []

    async def read() -> None:
        while len(seen) < n:
            line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
            if not line:
                raise AssertionError(
                    "worker exited: " + (proc.stderr.read() if proc.stderr else "")
                )
            if line.startswith("STARTED "):
                seen.append(line.split()[1])

    await asyncio.wait_for(read(), within)
    return seen


async def _task(client: httpx.AsyncClient, t: Any, task_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/namespaces/{t.namespace}/tasks/{task_id}", headers=t.auth)
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


async def _until(client: httpx.AsyncClient, t: Any, task_id: str, state: str,
                 within: float = 30) -> dict[str, Any]:  # fmt: skip
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        task = await _task(client, t, task_id)
        if task["state"] == state:
            return task
        if loop.time() > end:
            raise AssertionError(f"task {task_id} is {task['state']}, expected {state}")
        await asyncio.sleep(0.1)


@pytest.mark.process
async def test_sigkill_mid_task_recovers_per_retry_safe(db, tenant) -> None:
    t = await tenant(lease_ms=1000, retry={"max_attempts": 3, "backoff_initial_ms": 100})
    live = Live(db)
    await live.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        async with httpx.AsyncClient(base_url=live.http, timeout=30) as client:
            base = f"/v1/namespaces/{t.namespace}/tasks"
            safe = (await client.post(base, headers=t.auth, json={
                "queue": t.queue, "kind": "k", "payload": {"n": 1}, "retry_safe": True,
            })).json()  # fmt: skip
            unsafe = (await client.post(base, headers=t.auth, json={
                "queue": t.queue, "kind": "k", "payload": {"n": 2},
            })).json()  # fmt: skip

            first = _spawn(live, t.key, t.namespace, "hang", [t.queue])
            procs.append(first)
            started = await _wait_started(first, 2)
            assert sorted(started) == sorted([safe["id"], unsafe["id"]])
            assert (await _task(client, t, safe["id"]))["state"] == "RUNNING"

            os.kill(first.pid, signal.SIGKILL)  # mid-task: no report, no goodbye
            first.wait(10)

            review = await _until(client, t, unsafe["id"], "NEEDS_REVIEW")
            assert review["effect_uncertain"] is True and review["attempts"] == 1
            assert review["error"]["type"] == "attempt_lost"
            waiting = await _until(client, t, safe["id"], "WAITING")
            assert waiting["effect_uncertain"] is False and waiting["attempts"] == 1

            second = _spawn(live, t.key, t.namespace, "fast", [t.queue])
            procs.append(second)
            done = await _until(client, t, safe["id"], "SUCCEEDED")
            assert done["attempts"] == 2 and done["result"] == {"task": safe["id"], "generation": 2}
            # The uncertain task is not retried by itself.
            await asyncio.sleep(0.5)
            assert (await _task(client, t, unsafe["id"]))["state"] == "NEEDS_REVIEW"

            r = await client.get(f"{base}/{unsafe['id']}/attempts", headers=t.auth)
            assert r.status_code == 200
            body = r.json()
            (attempt,) = body["items"]
            assert attempt["state"] == "LOST"
            assert [e["kind"] for e in attempt["evidence"]] == ["lost"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        await live.stop()
