"""A server node dies (SIGKILL) while an SDK worker's handler runs, and comes back a few
seconds later on the same address: the worker reconnects with its session before that
session expires, re-sends the report it could not deliver, and the task SUCCEEDS — it does
not end in NEEDS_REVIEW because one node died.

The worker's backoff is made to grow fast (×6 from 0.5 s, no jitter): without the bound on
reconnect delays while a session may still be alive, its try after 3.5 s would be followed
by one at 21.5 s — after the 14 s session lease — and recovery would mark the attempt LOST.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orbit_sdk import Backoff, OrbitClient, TaskContext, Worker
from platform_fixtures import ServerProcess, new_tenant, unique

#: Short session lease and heartbeat, so the test takes seconds rather than minutes.
ENV = {
    "ORBIT_PULSE_SESSION_LEASE_MS": "14000",
    "ORBIT_PULSE_HEARTBEAT_MS": "1000",
    "ORBIT_PULSE_RECOVERY_INTERVAL_MS": "200",
}


async def test_a_worker_survives_a_node_restart_and_delivers_its_report(dsn, db) -> None:
    first = ServerProcess(dsn, env=ENV)
    second: ServerProcess | None = None
    try:
        await asyncio.to_thread(first.wait_ready)
        tenant = await new_tenant(db)
        queue = unique("restart")
        async with OrbitClient(first.url, tenant.key, namespace=tenant.namespace) as orbit:
            await orbit.queues.put(queue, lease_ms=30_000)
            task = await orbit.tasks.submit(queue, "work", {"n": 1})  # not retry-safe
        started, release = asyncio.Event(), asyncio.Event()
        worker = Worker(
            first.url, tenant.key, namespace=tenant.namespace,
            backoff=Backoff(initial=0.5, maximum=30.0, multiplier=6.0, jitter=0.0),
        )  # fmt: skip

        @worker.task(queue, "work")
        async def work(ctx: TaskContext, payload: Any) -> Any:
            started.set()
            await release.wait()
            return {"done": payload["n"]}

        run = asyncio.create_task(worker.run(max_tasks=1, install_signal_handlers=False))
        await asyncio.wait_for(started.wait(), 30)
        first.proc.kill()  # the node dies with the stream open
        first.proc.wait(10)
        release.set()  # the handler finishes while no node is there: its report waits
        await asyncio.sleep(4.0)  # the worker's tries at 0.5 s and 3.5 s find nobody
        second = ServerProcess(dsn, port=first.port, env=ENV)
        await asyncio.to_thread(second.wait_ready)
        stats = await asyncio.wait_for(run, 60)
        async with OrbitClient(second.url, tenant.key, namespace=tenant.namespace) as orbit:
            final = await orbit.tasks.get(task.id)
        assert final.state == "SUCCEEDED", final
        assert final.attempts == 1 and not final.effect_uncertain
        assert final.decode_result() == {"done": 1}
        assert stats.sessions == 1  # it came back with the same session
        assert stats.outcomes == {"succeeded": 1}
    finally:
        first.stop()
        if second is not None:
            second.stop()
