"""Fair dispatch with three real ``orbit-server`` processes on one database and real SDK
worker processes (docs/dispatch.md#fairness-across-owners-queues-and-sessions): owner A
floods a queue with 10,000 tasks that all became due an hour before owner B's; B's tasks still complete while A's flood is mostly
waiting. In plain dispatch order B could only finish after all 10,000 of A's — so "A still
has most of its flood waiting when B is done" holds only because dispatch is fair, whatever
the machine's speed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fair_dispatch_support import add_owner, flood, submit_as
from platform_fixtures import ServerProcess

from orbit.storage import Database, Tx

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
FLOOD = 10_000

WORKER = r"""
import asyncio, sys
from orbit_sdk import Worker

base, key, ns, queue = sys.argv[1:5]
worker = Worker(base, key, namespace=ns, max_concurrency=4, drain_timeout=1)

async def handler(ctx, payload):
    await asyncio.sleep(0.02)
    return None

worker.register(queue, "k", handler)
asyncio.run(worker.run(install_signal_handlers=False))
"""


def _spawn_worker(url: str, key: str, namespace: str, queue: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "sdk" / "python"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, url, key, namespace, queue],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip


async def _counts(db: Database, namespace_id: bytes, owner_id: bytes) -> dict[str, int]:
    async def run(tx: Tx) -> dict[str, int]:
        rows = await tx.fetchall(
            "SELECT state, COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
            " AND owner_id = %s GROUP BY state",
            (namespace_id, owner_id),
        )
        return {str(r["state"]): int(r["n"]) for r in rows}

    return await db.read(run)


async def _until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_other_owner_completes_while_the_flood_mostly_waits(db, dsn, tenant) -> None:
    t = await tenant(queue="fair")
    a = t.application_id
    b = await add_owner(db)
    template = await t.submit(kind="k")
    await flood(db, t, template["id"], FLOOD - 1)
    servers = [ServerProcess(dsn) for _ in range(3)]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for s in servers:
            await asyncio.to_thread(s.wait_ready)
        workers = [_spawn_worker(s.url, t.key, t.namespace, t.queue) for s in servers]

        async def flood_flows() -> bool:
            return (await _counts(db, t.namespace_id, a)).get("SUCCEEDED", 0) >= 60

        await _until(flood_flows, 40, "the flood to flow through the three servers")
        b_ids = [(await submit_as(db, t, b, kind="k"))["id"] for _ in range(10)]
        began = time.monotonic()

        async def b_done() -> bool:
            return (await _counts(db, t.namespace_id, b)).get("SUCCEEDED", 0) == len(b_ids)

        await _until(b_done, 40, "owner B's tasks to complete")
        took = time.monotonic() - began
        a_now = await _counts(db, t.namespace_id, a)
        for s in servers:
            assert s.proc.poll() is None, "a server died"
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
        for s in servers:
            s.stop()
    done_a = a_now.get("SUCCEEDED", 0)
    waiting_a = a_now.get("WAITING", 0)
    # B's 10 tasks completed while at least half of A's flood (older, all due) still waits.
    assert waiting_a >= FLOOD // 2, (took, a_now)
    assert done_a < FLOOD // 2, (took, a_now)
    print(f"B's 10 tasks done in {took:.1f} s; A meanwhile: {a_now}")
