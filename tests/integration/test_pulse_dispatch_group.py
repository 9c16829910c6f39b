"""Sessions served together by the node dispatch round (pulse/dispatch_round.py).

A node's sessions of one namespace that take the same queues (and the same keyed-task
ability) are one pool of the round: the usage rows are locked once, the due tasks are
claimed once for the pool's free slots, dealt out round-robin in claim order (so priority
holds across the pool) and each session is offered at most its free slots. Every offer must
then start through its own session only.
"""

from __future__ import annotations

import pytest
from pulse_worker_support import check_invariants, connect, open_session, task_row

from orbit.ids import parse_id
from orbit.metrics import Registry
from pulse import attempts, wire
from pulse.dispatch import DENIAL_SESSION_CAPACITY, Dispatcher
from pulse.hub import Hub


@pytest.fixture
def hub() -> Hub:
    return Hub("node-group")


def _transactions(metrics: Registry) -> int:
    return metrics.histogram("pulse_dispatch_seconds", "Time of one dispatch transaction").count()


async def test_one_transaction_deals_the_group_its_free_slots_in_priority_order(
    db, tenant, hub
) -> None:
    t = await tenant()
    # Priorities 9..1 once each (the nine to offer), then eleven of priority 0.
    tasks = [await t.submit(priority=p) for p in [*range(10), *[0] * 10]]
    conns = [
        await connect(db, hub, (await open_session(db, t, max_concurrency=c))[0]) for c in (2, 3, 4)
    ]
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    assert await d.run_once() == 9
    assert _transactions(metrics) == 1  # the three sessions: one transaction
    offers = {id(c): c.take_offers() for c in conns}
    assert [len(offers[id(c)]) for c in conns] == [2, 3, 4]
    ids = [o.task.id for c in conns for o in offers[id(c)]]
    assert len(set(ids)) == 9
    # The nine highest priorities, and each session's first offer is among the three best.
    by_priority = [x["id"] for x in sorted(tasks, key=lambda x: -x["priority"])]
    assert [x["priority"] for x in tasks if x["id"] in by_priority[:3]] == [7, 8, 9]
    assert set(ids) == set(by_priority[:9])
    assert {offers[id(c)][0].task.id for c in conns} == set(by_priority[:3])
    for c in conns:
        for offer in offers[id(c)]:
            row = await task_row(db, t, offer.task.id)
            assert row["state"] == "LEASED" and row["session_id"] == c.info.session_id
    # An offer starts through its own session, never through another of the group.
    first, second = conns[0], conns[1]
    mine = parse_id(offers[id(first)][0].attempt_id)
    denied = await attempts.start(db, t.namespace_id, second.info.session_id, mine)
    assert isinstance(denied, wire.StartDenied)
    started = await attempts.start(db, t.namespace_id, first.info.session_id, mine)
    assert isinstance(started, wire.Started)
    assert await d.run_once() == 0  # every session full
    await check_invariants(db, t.namespace_id)


async def test_full_and_gone_members_do_not_hold_the_others_back(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(10):
        await t.submit()
    full = await connect(db, hub, (await open_session(db, t, max_concurrency=1))[0])
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    assert await d.dispatch_to(full) == 1
    full.take_offers()
    gone = await connect(db, hub, (await open_session(db, t, max_concurrency=5))[0])
    ok = await connect(db, hub, (await open_session(db, t, max_concurrency=3))[0])
    await db.transaction(
        lambda tx: tx.execute(
            "UPDATE pulse_worker_sessions SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
            " WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, gone.info.session_id),
        )
    )
    assert await d.run_once() == 3  # one round over the three
    assert len(ok.take_offers()) == 3 and not full.take_offers() and not gone.take_offers()
    assert gone.closed
    assert hub.get(t.namespace_id, gone.info.session_id) is None
    assert (
        metrics.counter("pulse_dispatch_denials_total", "", ("kind",)).value(
            kind=DENIAL_SESSION_CAPACITY
        )
        == 1
    )
    await check_invariants(db, t.namespace_id)


async def test_sessions_of_other_queues_or_key_ability_are_pools_of_one_node_round(
    db, tenant, hub
) -> None:
    t = await tenant()
    await t.add_queue("other")
    plain = await t.submit()
    keyed = await t.submit(concurrency_key="k-1")
    elsewhere = await t.submit(queue="other")
    a = await connect(db, hub, (await open_session(db, t, max_concurrency=5))[0])
    b = await connect(
        db, hub, (await open_session(db, t, max_concurrency=5, concurrency_keys=True))[0]
    )
    c = await connect(db, hub, (await open_session(db, t, queues=["other"]))[0])
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    assert await d.run_once() == 3
    assert _transactions(metrics) == 1  # the node round: every pool in one transaction
    assert [o.task.id for o in c.take_offers()] == [elsewhere["id"]]
    got_a = {o.task.id for o in a.take_offers()}
    got_b = {o.task.id for o in b.take_offers()}
    assert keyed["id"] in got_b and keyed["id"] not in got_a  # only b takes keyed tasks
    assert got_a | got_b == {plain["id"], keyed["id"]}
    await check_invariants(db, t.namespace_id)


async def test_a_large_group_is_served_over_several_transactions(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(12):
        await t.submit()
    conns = [
        await connect(db, hub, (await open_session(db, t, max_concurrency=4))[0]) for _ in range(3)
    ]
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics, pool_cap=5)
    assert await d.run_once() == 5  # capped: one transaction, and more is due
    assert d._more
    assert await d.run_once() == 5
    assert await d.run_once() == 2
    assert _transactions(metrics) == 3
    assert sorted(len(c.take_offers()) for c in conns) == [4, 4, 4]  # each its free slots
    await check_invariants(db, t.namespace_id)
