"""Keyed tasks and the SDK worker: a default ``Worker`` accepts tasks with a
``concurrency_key`` (its handler gets the key's fencing token); a worker that opts out
(``concurrency_keys=False``) is told by the server when keyed tasks wait on its queues and
says so in its log."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest
from orbit_sdk import TaskContext, Worker
from sdk_server import Env, env_fixture, eventually, server_fixture, unique  # noqa: F401


async def test_a_default_worker_runs_keyed_tasks_with_their_fencing_token(env: Env) -> None:
    queue = unique("keyed")
    await env.orbit.queues.put(queue)
    task = await env.orbit.tasks.submit(queue, "k", {"n": 1}, concurrency_key="account-7")
    tokens: list[int | None] = []
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns)  # defaults only

    @worker.task(queue, "k")
    async def handle(ctx: TaskContext, payload: Any) -> Any:
        tokens.append(ctx.concurrency_token)
        return {"key": ctx.concurrency_key}

    await asyncio.wait_for(worker.run(max_tasks=1, install_signal_handlers=False), 30)
    done = await env.orbit.tasks.wait(task.id, timeout=30)
    assert done.state == "SUCCEEDED" and done.decode_result() == {"key": "account-7"}
    assert len(tokens) == 1 and isinstance(tokens[0], int) and tokens[0] >= 1


async def test_an_opted_out_worker_logs_that_keyed_work_waits(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique("keyed")
    await env.orbit.queues.put(queue)
    keyed = await env.orbit.tasks.submit(queue, "k", {}, concurrency_key="account-8")
    plain = await env.orbit.tasks.submit(queue, "k", {})
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns, concurrency_keys=False)

    @worker.task(queue, "k")
    async def handle(ctx: TaskContext, payload: Any) -> Any:
        return "ok"

    with caplog.at_level(logging.WARNING, logger="orbit_sdk.connection"):
        await asyncio.wait_for(worker.run(max_tasks=1, install_signal_handlers=False), 30)
    assert (await env.orbit.tasks.wait(plain.id, timeout=30)).state == "SUCCEEDED"
    assert (await env.orbit.tasks.get(keyed.id)).state == "WAITING"  # left for another worker
    warnings = [r.getMessage() for r in caplog.records if "concurrency_key" in r.getMessage()]
    assert warnings and queue in warnings[0] and "concurrency_keys=False" in warnings[0]


async def test_keyed_work_submitted_after_the_worker_connected_is_logged_too(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The session was created with nothing keyed waiting; keyed work submitted later is told
    in a heartbeat answer (``keyed_waiting``, every ``keyed_check_ms``) and logged."""
    hub = env.server.node.pulse.hub
    saved = hub.settings
    hub.settings = dataclasses.replace(saved, keyed_check_ms=300)
    queue = unique("keyed")
    await env.orbit.queues.put(queue, lease_ms=3_000)  # heartbeats every second
    plain = await env.orbit.tasks.submit(queue, "k", {})
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns, concurrency_keys=False)

    @worker.task(queue, "k")
    async def handle(ctx: TaskContext, payload: Any) -> Any:
        return "ok"

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if "concurrency_key" in r.getMessage()]

    async def told_yet() -> list[str]:
        return told()

    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        with caplog.at_level(logging.WARNING, logger="orbit_sdk.connection"):
            assert (await env.orbit.tasks.wait(plain.id, timeout=30)).state == "SUCCEEDED"
            assert told() == []  # nothing keyed waited when the session was created
            keyed = await env.orbit.tasks.submit(queue, "k", {}, concurrency_key="account-9")
            await eventually(told_yet, within=15)
        (warning,) = told()
        assert queue in warning and "concurrency_keys=False" in warning
        assert (await env.orbit.tasks.get(keyed.id)).state == "WAITING"
    finally:
        hub.settings = saved
        worker.drain()
        await asyncio.wait_for(run, 30)
