"""The SDK against the real server code: uvicorn serving the platform and Pulse routes with
the dispatcher and recovery loops, on the session's migrated database.

The server runs in the test's event loop (as tests/e2e/test_pulse_worker_ws.py does), so the
SDK's WebSocket worker and HTTP client talk to a real socket. Tenants come from the
platform's bootstrap. Skipped until the Pulse HTTP package exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import uvicorn
from orbit_sdk import (
    OrbitClient,
    PermanentError,
    RetryableError,
    RetryPolicy,
    SyncOrbitClient,
    TaskContext,
    TaskSpec,
    Worker,
)

import pulse.http
from orbit.bootstrap import bootstrap
from orbit.context import AppContext
from orbit.http.app import build_app
from pulse.runtime import PulseRuntime
from pulse.sessions import WorkerSettings


@dataclass
class Server:
    url: str
    key: str
    namespace: str
    hub: Any = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # the worker under test owns the signals
        yield


@pytest.fixture
async def server(db: Any) -> AsyncIterator[Server]:
    port = _free_port()
    ctx = AppContext(db=db, node_id=f"sdk-e2e-{port}")
    rt = PulseRuntime.build(
        ctx, workers=WorkerSettings(dispatch_poll_ms=100, recovery_interval_ms=200)
    )
    app = build_app(ctx, pulse.http.routes(rt))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    uv = _Uvicorn(config)
    tasks = [asyncio.create_task(uv.serve())]
    stop = asyncio.Event()
    tasks += [asyncio.create_task(loop(stop)) for loop in rt.loops()]
    try:
        async with asyncio.timeout(10):
            while not uv.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
                await asyncio.sleep(0.01)
        boot = await bootstrap(db, f"sdk-{secrets.token_hex(4)}", "sdk")
        yield Server(f"http://127.0.0.1:{port}", boot.key, boot.namespace, rt.hub)
    finally:
        uv.should_exit = True
        for t in tasks[1:]:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(t, 10)


@pytest.fixture
async def orbit(server: Server) -> AsyncIterator[OrbitClient]:
    async with OrbitClient(server.url, server.key, namespace=server.namespace) as client:
        yield client


async def new_queue(orbit: OrbitClient, **config: Any) -> str:
    name = f"q-{secrets.token_hex(4)}"
    config.setdefault("lease_ms", 3000)
    config.setdefault(
        "retry", RetryPolicy(max_attempts=3, backoff_initial_ms=10, backoff_max_ms=50)
    )
    queue = await orbit.queues.put(name, **config)
    assert queue.created
    return name


def new_worker(server: Server, **kwargs: Any) -> Worker:
    return Worker(server.url, server.key, namespace=server.namespace, **kwargs)


async def wait_all(orbit: OrbitClient, ids: list[str]) -> list[Any]:
    return [await orbit.tasks.wait(i, timeout=30, interval=0.05) for i in ids]


async def test_batch_flows_through_a_real_worker_byte_exact(
    server: Server, orbit: OrbitClient
) -> None:
    queue = await new_queue(orbit)
    worker = new_worker(server, max_concurrency=4)

    @worker.task(queue, "echo")
    async def echo(ctx: TaskContext, payload: Any) -> Any:
        return msgspec.Raw(bytes(ctx.payload_raw))

    payloads = [
        f'{{"n": {i}, "price": 1.10, "big": 123456789012345678901}}'.encode() for i in range(20)
    ]
    items = await orbit.tasks.submit_batch(
        [TaskSpec(queue=queue, kind="echo", payload=msgspec.Raw(p)) for p in payloads]
    )
    assert all(i.ok and i.task is not None for i in items)
    runner = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        done = await wait_all(orbit, [i.task.id for i in items if i.task])
    finally:
        worker.drain()
        stats = await asyncio.wait_for(runner, 30)
    assert [t.state for t in done] == ["SUCCEEDED"] * 20
    assert [bytes(t.result) for t in done] == payloads
    assert stats.succeeded == 20
    ids = {t.id for t in done}
    seen: dict[str, Any] = {}
    page = await orbit.tasks.events(after_seq=0, limit=500)
    while page.items:
        seen.update({e.task_id: e for e in page.items if e.task_id in ids})
        page = await orbit.tasks.events(after_seq=page.next_after_seq or 0, limit=500)
    assert set(seen) == ids and {e.type for e in seen.values()} == {"task.succeeded"}
    assert sorted(e.decode_result()["n"] for e in seen.values()) == list(range(20))


async def test_the_worker_stream_batches_frames(server: Server, orbit: OrbitClient) -> None:
    """The SDK offers the batch subprotocol; the server then writes the frames it sends
    together (offers of a dispatch round, replies of frames that came together) as one
    ``batch`` frame, and takes the worker's batches: fewer transport writes than frames."""
    queue = await new_queue(orbit)
    worker = new_worker(server, max_concurrency=16)

    @worker.task(queue, "noop")
    async def noop(ctx: TaskContext, payload: Any) -> Any:
        return {"n": payload["n"]}

    items = await orbit.tasks.submit_batch(
        [TaskSpec(queue=queue, kind="noop", payload={"n": i}) for i in range(40)]
    )
    runner = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        done = await wait_all(orbit, [i.task.id for i in items if i.task])
        conns = [c for c in server.hub.connections() if getattr(c, "batch", False)]
        assert conns, "the stream did not negotiate batch frames"
        writes = sum(c.writes for c in conns)
        frames = sum(c.frames_sent for c in conns)
    finally:
        worker.drain()
        await asyncio.wait_for(runner, 30)
    assert [t.state for t in done] == ["SUCCEEDED"] * 40
    assert [t.decode_result()["n"] for t in done] == list(range(40))
    # 40 offers, 40 `started`, 40 receipts at least; several went out in one write.
    assert frames >= 120 and writes < frames, (writes, frames)


async def test_failures_retries_and_effects(server: Server, orbit: OrbitClient) -> None:
    queue = await new_queue(orbit)
    worker = new_worker(server)
    charges: list[str] = []

    @worker.task(queue, "pay")
    async def pay(ctx: TaskContext, payload: Any) -> Any:
        receipt = await ctx.effect(
            "charge", lambda: charges.append(ctx.task_id) or {"charge": "ch_1"}
        )
        if ctx.generation == 1:
            raise RetryableError("flaky after the charge", retry_after_ms=10)
        return receipt

    @worker.task(queue, "bad")
    async def bad(ctx: TaskContext, payload: Any) -> None:
        raise PermanentError("invalid order", type="Validation")

    pay_task = await orbit.tasks.submit(queue, "pay", {"order": 1}, max_attempts=3)
    bad_task = await orbit.tasks.submit(queue, "bad", {"order": 2}, max_attempts=3)
    runner = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        paid, failed = await wait_all(orbit, [pay_task.id, bad_task.id])
    finally:
        worker.drain()
        await asyncio.wait_for(runner, 30)
    assert paid.state == "SUCCEEDED" and paid.attempts == 2
    assert paid.decode_result() == {"charge": "ch_1"}
    assert charges == [pay_task.id], "the committed effect ran once across both attempts"
    assert failed.state == "FAILED" and failed.attempts == 1
    assert "Validation" in json.dumps(failed.error)


async def test_cancel_a_running_task_through_the_sdk(server: Server, orbit: OrbitClient) -> None:
    queue = await new_queue(orbit)
    worker = new_worker(server)
    entered = asyncio.Event()
    cancelled: list[bool] = []

    @worker.task(queue, "slow")
    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(ctx.cancel_requested)
            raise

    task = await orbit.tasks.submit(queue, "slow", None)
    runner = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(entered.wait(), 20)
        answer = await orbit.tasks.cancel(task.id)
        assert answer.cancel_requested
        final = (await wait_all(orbit, [task.id]))[0]
    finally:
        worker.drain()
        await asyncio.wait_for(runner, 30)
    assert final.state == "CANCELLED" and cancelled == [True]


async def test_drain_gives_unfinished_work_back(server: Server, orbit: OrbitClient) -> None:
    queue = await new_queue(orbit)
    worker = new_worker(server, drain_timeout=0.2)
    entered = asyncio.Event()

    @worker.task(queue, "forever")
    async def forever(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await asyncio.sleep(60)

    task = await orbit.tasks.submit(queue, "forever", None, max_attempts=5)
    runner = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(entered.wait(), 20)
    worker.drain()
    stats = await asyncio.wait_for(runner, 30)
    assert stats.outcomes == {"drained": 1}
    after = await orbit.tasks.get(task.id)
    assert after.state in ("WAITING", "LEASED"), "a drained task goes back for a retry"
    attempts = await orbit.tasks.attempts(task.id)
    assert attempts[0].generation == 1 and attempts[0].state == "FAILED"
    assert attempts[0].error["type"] == "Drained" and attempts[0].retryable is True
    # The retry may already have been offered to the closing session, but was never started.
    assert all(a.started_at is None for a in attempts[1:])
    await orbit.tasks.cancel(task.id)


async def test_sync_client_against_the_server(server: Server) -> None:
    def script() -> None:
        with SyncOrbitClient(server.url, server.key, namespace=server.namespace) as orbit:
            name = f"q-{secrets.token_hex(4)}"
            orbit.queues.put(name, lease_ms=3000)
            task = orbit.tasks.submit(name, "k", {"x": 1}, dedup_key="d-1")
            again = orbit.tasks.submit(name, "k", {"x": 1}, dedup_key="d-1")
            assert again.deduplicated and again.id == task.id
            assert [t.id for t in orbit.tasks.iter(queue=name)] == [task.id]
            assert orbit.tasks.cancel(task.id).state == "CANCELLED"

    await asyncio.to_thread(script)  # the server runs in this loop; the script needs its own
