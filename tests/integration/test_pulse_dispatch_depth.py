"""The offer depth (``WorkerSettings.offer_depth_percent``, docs/dispatch.md "Capacity and
backpressure"): while one of its queues is shared by several fairness subjects, a session
holds at most that share of its ``max_concurrency`` as offered attempts not started yet;
started ones free depth, and a connection the depth cut is marked so its next start wakes
the dispatcher. A queue of one subject, or the setting off (0, the default): a session is
offered up to its free slots."""

from __future__ import annotations

import time

from permits_support import complete
from pulse_worker_support import check_invariants, connect, open_session

from orbit.ids import parse_id
from pulse import attempts, sessions, wire
from pulse.dispatch import Dispatcher
from pulse.hub import Hub


async def _start(db, t, conn, offer) -> wire.Started:
    aid = parse_id(offer.attempt_id)
    assert aid is not None
    started = await attempts.start(db, t.namespace_id, conn.info.session_id, aid)
    assert isinstance(started, wire.Started)
    return started


def _hub(percent: int) -> Hub:
    settings = sessions.WorkerSettings(offer_depth_percent=percent)
    return Hub(f"node-depth-{time.monotonic_ns()}", settings)


async def test_a_session_holds_at_most_its_offer_depth_not_started(db, tenant) -> None:
    t = await tenant()
    for i in range(20):
        await t.submit(fairness_key=f"user-{i % 2}")  # two subjects share the queue
    hub = _hub(25)
    conn = await connect(db, hub, (await open_session(db, t, max_concurrency=8))[0])
    d = Dispatcher(db, hub)
    # 8 free slots, a depth of 2 (25 % of 8): two offers, and the connection is marked.
    assert await d.dispatch_to(conn) == 2
    assert conn.depth_capped
    first, second = conn.take_offers()
    assert await d.dispatch_to(conn) == 0  # both still offered: no depth left
    # One started: one more offer (1 offered + 1 new = the depth), 6 slots still free.
    running = await _start(db, t, conn, first)
    assert await d.dispatch_to(conn) == 1
    (third,) = conn.take_offers()
    for offer in (second, third):
        await complete(db, t, await _start(db, t, conn, offer))
    await complete(db, t, running)
    assert await d.dispatch_to(conn) == 2
    await check_invariants(db, t.namespace_id)


async def test_without_an_offer_depth_a_session_gets_its_free_slots(db, tenant) -> None:
    t = await tenant()
    for i in range(10):
        await t.submit(fairness_key=f"user-{i % 2}")
    hub = Hub(f"node-depth-off-{time.monotonic_ns()}")
    conn = await connect(db, hub, (await open_session(db, t, max_concurrency=8))[0])
    assert await Dispatcher(db, hub).dispatch_to(conn) == 8
    assert not conn.depth_capped
    await check_invariants(db, t.namespace_id)


async def test_a_queue_of_one_subject_is_not_held_to_the_depth(db, tenant) -> None:
    t = await tenant()
    for _ in range(10):
        await t.submit()
    hub = _hub(25)
    conn = await connect(db, hub, (await open_session(db, t, max_concurrency=8))[0])
    assert await Dispatcher(db, hub).dispatch_to(conn) == 8
    assert not conn.depth_capped
    await check_invariants(db, t.namespace_id)
