"""The dispatcher: flow control, dispatch order, what is due, queues and keys a session
takes, node binding, wake-ups, re-sent offers on reconnect."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from event_rows import raw_events
from pulse_worker_support import check_invariants, connect, open_session, task_row

from orbit.ids import id_hex, parse_id
from orbit.storage import Tx
from pulse import attempts, sessions, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub

ISO = "%Y-%m-%dT%H:%M:%S.%fZ"


@pytest.fixture
def hub() -> Hub:
    return Hub("node-dispatch")


async def test_flow_control_never_exceeds_max_concurrency(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(10):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=3)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    assert await d.dispatch_to(conn) == 3
    assert await d.dispatch_to(conn) == 0  # 3 offered: full
    offers = conn.take_offers()
    for offer in offers[:2]:
        started = await attempts.start(
            db, t.namespace_id, info.session_id, parse_id(offer.attempt_id)
        )
        assert isinstance(started, wire.Started)
        if offer is offers[0]:
            first = (parse_id(offer.attempt_id), started.execution_token)
    assert await d.dispatch_to(conn) == 0  # 2 running + 1 offered: still full
    await attempts.report(db, t.namespace_id, Report("complete", first[0], first[1]))
    assert await d.dispatch_to(conn) == 1  # one slot freed
    assert await d.dispatch_to(conn) == 0
    await check_invariants(db, t.namespace_id)


async def test_dispatch_order_priority_availability_deadline(db, tenant, hub) -> None:
    t = await tenant()
    now = await db.now()
    low = await t.submit(priority=0)
    high = await t.submit(priority=9)
    mid = await t.submit(priority=5)
    later = await t.submit(priority=9, delay_ms=5_000)  # not available yet
    await t.submit(deadline_at=(now - timedelta(seconds=1)).strftime(ISO))  # past its deadline
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 3
    assert [o.task.id for o in conn.take_offers()] == [high["id"], mid["id"], low["id"]]
    assert (await task_row(db, t, later["id"]))["state"] == "WAITING"
    assert await Dispatcher(db, hub).dispatch_to(conn, now=now + timedelta(seconds=6)) == 1
    assert [o.task.id for o in conn.take_offers()] == [later["id"]]
    await check_invariants(db, t.namespace_id)


async def test_session_gets_only_its_queues_and_keys_it_handles(db, tenant, hub) -> None:
    t = await tenant()
    await t.add_queue("other")
    mine = await t.submit()
    await t.submit(queue="other")
    keyed = await t.submit(concurrency_key="user-1")
    info, _ = await open_session(db, t, max_concurrency=10)  # default queue, no keys
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    assert [o.task.id for o in conn.take_offers()] == [mine["id"]]
    info2, _ = await open_session(db, t, queues=[t.queue], concurrency_keys=True)
    conn2 = await connect(db, hub, info2)
    assert await Dispatcher(db, hub).dispatch_to(conn2) == 1
    (offer,) = conn2.take_offers()
    assert offer.task.id == keyed["id"] and offer.task.concurrency_key == "user-1"
    await check_invariants(db, t.namespace_id)


async def test_session_held_by_another_node_gets_nothing(db, tenant, hub) -> None:
    t = await tenant()
    await t.submit()
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    other = Hub("node-elsewhere")
    conn_elsewhere = await connect(db, other, info)  # the worker reconnected to another node
    assert await Dispatcher(db, hub).dispatch_to(conn) == 0
    assert conn.closed and hub.get(t.namespace_id, info.session_id) is None
    assert await Dispatcher(db, other).dispatch_to(conn_elsewhere) == 1
    await check_invariants(db, t.namespace_id)


async def test_reconnect_resends_outstanding_offers(db, tenant, hub) -> None:
    t = await tenant()
    await t.submit()
    await t.submit()
    info, _ = await open_session(db, t, max_concurrency=2)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 2
    offered = {o.attempt_id for o in conn.take_offers()}
    started_aid = parse_id(sorted(offered)[0])
    assert isinstance(
        await attempts.start(db, t.namespace_id, info.session_id, started_aid), wire.Started
    )
    again = await sessions.outstanding_offers(db, t.namespace_id, info.session_id)
    assert {o.attempt_id for o in again} == offered - {id_hex(started_aid)}
    assert await sessions.held_attempts(db, t.namespace_id, info.session_id) != []


async def test_new_work_wakes_the_dispatcher_at_once(db, tenant) -> None:
    from pulse.sessions import WorkerSettings

    hub = Hub("node-wake", WorkerSettings(dispatch_poll_ms=10_000))
    t = await tenant()
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    loop = asyncio.create_task(d.run())
    try:
        await asyncio.sleep(0.2)  # the loop is asleep (10 s poll)
        began = time.perf_counter()
        await t.submit()
        hub.notify_new_work(t.namespace_id, t.queue_id)
        while not conn.offers():
            await asyncio.sleep(0.005)
            assert time.perf_counter() - began < 2.0, "no offer within 2 s"
        assert time.perf_counter() - began < 1.0
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_offers_write_leased_events_and_reservations(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(4):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 4

    async def run(tx: Tx) -> tuple[int, int]:
        usage = await tx.fetchone(
            "SELECT reservations FROM pulse_queue_usage WHERE namespace_id = %s AND queue_id = %s",
            (t.namespace_id, t.queue_id),
        )
        events = len(await raw_events(tx, t.namespace_id, type="task.leased"))
        return int(usage["reservations"]), int(events)

    assert await db.read(run) == (4, 4)
    await check_invariants(db, t.namespace_id)
