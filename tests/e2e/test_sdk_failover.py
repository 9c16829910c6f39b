"""SDK failover across server nodes: two real ``orbit-server`` processes on one database,
the SDK given both URLs (and a dead one), one node SIGKILLed while it serves.

* the producer moves to the next node at once (connection refused: nothing was sent);
* a worker whose node dies mid-task reconnects to the other node with the SAME session at
  once — its backoff is set to 20 s, so waiting it out would miss the bound — and the
  running attempt's report is accepted there (one attempt, SUCCEEDED);
* a subscriber keeps receiving through the other node; the blocking subscriber too.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from orbit_sdk import Backoff, OrbitClient, Subscriber, SyncSubscriber, TaskContext, Worker
from platform_fixtures import ServerProcess, free_port, new_tenant

from orbit.storage import DSN, Database

pytestmark = pytest.mark.process

#: Long enough that a client waiting out its backoff cannot meet the bounds below.
SLOW = Backoff(initial=20.0, maximum=20.0, jitter=0.0)


@pytest.fixture
def nodes(dsn: DSN) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    a, b = ServerProcess(dsn), ServerProcess(dsn)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        for s in (a, b):
            s.stop()


def kill(node: ServerProcess) -> None:
    os.kill(node.proc.pid, signal.SIGKILL)
    node.proc.wait(10)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


async def eventually(fn: Any, within: float) -> Any:
    async with asyncio.timeout(within):
        while True:
            got = await fn()
            if got:
                return got
            await asyncio.sleep(0.05)


async def test_the_producer_moves_to_the_next_node(
    nodes: tuple[ServerProcess, ServerProcess], db: Database
) -> None:
    a, b = nodes
    t = await new_tenant(db)
    async with OrbitClient(f"{dead_url()},{a.url},{b.url}", t.key, namespace=t.namespace) as orbit:
        await orbit.queues.put("fo")
        assert orbit.base_url == a.url  # the dead one was skipped at once
        first = await orbit.tasks.submit("fo", "k", {"n": 1})
        kill(a)
        again = await orbit.tasks.submit("fo", "k", {"n": 2})  # a POST without a key
        assert orbit.base_url == b.url
        assert (await orbit.tasks.get(first.id)).id == first.id
        assert again.state == "WAITING"


async def test_a_worker_whose_node_dies_mid_task_goes_on_with_its_session(
    nodes: tuple[ServerProcess, ServerProcess], db: Database
) -> None:
    a, b = nodes
    t = await new_tenant(db)
    running = asyncio.Event()
    release = asyncio.Event()
    worker = Worker([a.url, b.url], t.key, namespace=t.namespace, backoff=SLOW)

    @worker.task("fo-w", "slow")
    async def slow(ctx: TaskContext, payload: object) -> dict[str, bool]:
        running.set()
        await release.wait()
        return {"done": True}

    async with OrbitClient(b.url, t.key, namespace=t.namespace) as orbit:
        await orbit.queues.put("fo-w")
        task = await orbit.tasks.submit("fo-w", "slow", {}, retry_safe=False)
        run = asyncio.create_task(worker.run(install_signal_handlers=False))
        try:
            await asyncio.wait_for(running.wait(), 30)
            assert worker._connection is not None
            session = worker._connection.session
            assert session is not None
            kill(a)  # the worker's node: its stream drops without a close frame
            release.set()

            async def finished() -> bool:
                return (await orbit.tasks.get(task.id)).state == "SUCCEEDED"

            await eventually(finished, within=12.0)  # < the 20 s backoff
            done = await orbit.tasks.get(task.id)
            assert done.attempts == 1 and done.decode_result() == {"done": True}
            assert worker._connection.session is not None
            assert worker._connection.session.session_id == session.session_id  # kept
        finally:
            release.set()
            worker.drain()
            await asyncio.wait_for(run, 30)


async def test_subscribers_keep_receiving_through_the_other_node(
    nodes: tuple[ServerProcess, ServerProcess], db: Database
) -> None:
    a, b = nodes
    t = await new_tenant(db)
    async with OrbitClient(b.url, t.key, namespace=t.namespace) as orbit:
        await orbit.queues.put("fo-s")
        await orbit.subscriptions.put("feed", start="earliest")
        async with Subscriber([a.url, b.url], t.key, t.namespace, "feed", backoff=SLOW) as sub:
            first = await orbit.tasks.submit("fo-s", "k", {})
            await orbit.tasks.cancel(first.id)
            got = await asyncio.wait_for(sub.__anext__(), 20)
            await got.ack()
            assert sub.url == a.url
            kill(a)
            second = await orbit.tasks.submit("fo-s", "k", {})
            await orbit.tasks.cancel(second.id)
            nxt = await asyncio.wait_for(sub.__anext__(), 12)  # < the 20 s backoff
            assert nxt.event_id != got.event_id
            await nxt.ack()
            assert sub.url == b.url

        third = await orbit.tasks.submit("fo-s", "k", {})
        await orbit.tasks.cancel(third.id)

        def pull() -> list[str]:
            with SyncSubscriber(f"{dead_url()},{b.url}", t.key, t.namespace, "feed") as s:
                batch = s.pull(wait_ms=2000)
                for d in batch:
                    d.ack()
                return [d.event_id for d in batch]

        pulled = await asyncio.to_thread(pull)
        assert len(pulled) >= 1
