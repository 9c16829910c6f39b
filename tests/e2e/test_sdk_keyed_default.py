"""Keyed tasks and the SDK worker: a default ``Worker`` accepts tasks with a
``concurrency_key`` (its handler gets the key's fencing token); a worker that opts out
(``concurrency_keys=False``) is told by the server when keyed tasks wait on its queues and
says so in its log."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from orbit_sdk import TaskContext, Worker
from sdk_server import Env, env_fixture, server_fixture, unique  # noqa: F401


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
