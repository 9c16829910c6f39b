"""The SDK's task history against a real server (tests/sdk_server.py): a real worker runs a
task; ``client.tasks.history`` pages its raw state events, ``iter_history`` follows every
page, the sync facade does the same, and an absent task is NotFound."""

from __future__ import annotations

import asyncio

import pytest
from orbit_sdk import NotFound, SyncOrbitClient, TaskContext, TaskEvent, Worker
from sdk_server import (  # noqa: F401 - env_fixture, server_fixture: fixtures
    Env,
    env_fixture,
    server_fixture,
    unique,
)


async def test_task_history(env: Env) -> None:
    orbit = env.orbit
    queue = unique("q")
    await orbit.queues.put(queue)
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns)

    @worker.task(queue, "echo")
    async def echo(ctx: TaskContext, payload: object) -> object:
        return payload

    running = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        task = await orbit.tasks.submit(queue, "echo", {"n": 1})
        done = await orbit.tasks.wait(task.id, timeout=30)
        assert done.state == "SUCCEEDED"
    finally:
        worker.drain()
        await asyncio.wait_for(running, 30)
    page = await orbit.tasks.history(task.id, limit=2)
    assert page.task_id == task.id and len(page.events) == 2 and page.next_cursor
    assert all(isinstance(e, TaskEvent) for e in page.events)
    every = [e async for e in orbit.tasks.iter_history(task.id, page_size=1)]
    types = [e.type for e in every]
    assert types == ["task.accepted", "task.leased", "task.started", "task.succeeded"]
    assert [e.state for e in every] == ["WAITING", "LEASED", "RUNNING", "SUCCEEDED"]
    assert every[0].created_at is not None and every[0].created_at.tzinfo is not None
    with pytest.raises(NotFound):
        await orbit.tasks.history("0" * 32)

    def blocking() -> list[str]:
        with SyncOrbitClient(env.server.url, env.tenant.key, namespace=env.ns) as sync:
            assert len(sync.tasks.history(task.id).events) == 4
            return [e.type for e in sync.tasks.iter_history(task.id, page_size=3)]

    assert await asyncio.to_thread(blocking) == types
