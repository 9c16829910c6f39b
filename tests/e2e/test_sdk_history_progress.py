"""The SDK's task history and progress against a real server (tests/sdk_server.py): a real
worker runs a task; ``client.tasks.history`` pages its raw state events, ``iter_history``
follows every page, the sync facade does the same, and an absent task is NotFound. A
handler's ``ctx.set_progress`` reaches the task with the next heartbeat; a document that is
not an object or too large is refused in the handler, before anything is sent."""

from __future__ import annotations

import asyncio

import pytest
from orbit_sdk import NotFound, SyncOrbitClient, Task, TaskContext, TaskEvent, Worker
from sdk_server import (  # noqa: F401 - env_fixture, server_fixture: fixtures
    Env,
    env_fixture,
    eventually,
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


async def test_progress_from_a_handler(env: Env) -> None:
    orbit = env.orbit
    queue = unique("q")
    await orbit.queues.put(queue, lease_ms=3_000)  # heartbeats every second
    release = asyncio.Event()
    refused: list[str] = []
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns)

    @worker.task(queue, "long")
    async def long(ctx: TaskContext, payload: object) -> object:
        for bad in ([1, 2], "half", {"s": "x" * 5000}):
            try:
                ctx.set_progress(bad)
            except (TypeError, ValueError) as exc:
                refused.append(type(exc).__name__)
        ctx.set_progress({"done": 1, "total": 3})
        ctx.set_progress({"done": 2, "total": 3})  # only the latest is sent
        assert ctx.progress == {"done": 2, "total": 3}
        await release.wait()
        return {"ok": True}

    running = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        task = await orbit.tasks.submit(queue, "long", {})

        async def reported() -> Task | None:
            got = await orbit.tasks.get(task.id)
            return got if got.progress is not None else None

        seen = await eventually(reported)
        assert seen.progress == {"done": 2, "total": 3} and seen.progress_at is not None
        assert seen.state == "RUNNING"
        (attempt,) = await orbit.tasks.attempts(task.id)
        assert attempt.progress == {"done": 2, "total": 3}
        release.set()
        done = await orbit.tasks.wait(task.id, timeout=30)
        assert done.state == "SUCCEEDED" and done.progress == {"done": 2, "total": 3}
    finally:
        release.set()
        worker.drain()
        await asyncio.wait_for(running, 30)
    assert refused == ["TypeError", "TypeError", "ValueError"]
