"""The node dispatch round (pulse/dispatch_round.py): one look and one transaction for every
waiting session of the node, across namespaces and applications; capacity shared by
application → namespace/queue → fairness subject, least recently served first.

* a quiet tenant among 100 flooding ones is served within a bound of rounds;
* within a queue, dispatch rotates across fairness keys: a flooding subject does not hold
  another subject's task back by more than one rotation;
* an idle node costs one statement per round;
* a delayed task wakes its queue when it becomes due, not at the next poll;
* several nodes (their own connections) dispatching one queue at once never offer a task
  twice and never deadlock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest
from pulse_worker_support import check_invariants, connect, open_session

from orbit.storage import Database, Tx
from orbit.storage.db import DSN
from pulse import dispatch_round, sessions
from pulse import submit as submit_service
from pulse.dispatch import Dispatcher
from pulse.hub import Hub


async def _close(db: Database, conns: list[Any]) -> None:
    """Close the sessions (their offers go back to WAITING): the recovery tests of this run
    sweep every namespace's expired offers in bounded batches, so none is left behind."""
    for c in conns:
        await sessions.close_session(db, c.info.namespace_id, c.info.session_id)


def _bodies(queue: str, n: int, **fields: Any) -> list[bytes]:
    return [
        msgspec.json.encode({"queue": queue, "kind": "k", "payload": i, **fields}) for i in range(n)
    ]


async def test_a_quiet_tenant_is_served_within_a_bound_among_100_flooding_ones(
    db: Database, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A round offers at most 40 tasks: the 100 flooding tenants (4 free slots each) ask for
    # 400, so the budget is what they compete for.
    monkeypatch.setattr(dispatch_round, "ROUND_MAX_OFFERS", 40)
    hub = Hub("node-tenants")
    floods = []
    for _ in range(100):
        t = await tenant()
        await submit_service.submit_batch(
            db, t.namespace_id, t.application_id, _bodies(t.queue, 20)
        )
        floods.append(
            (t, await connect(db, hub, (await open_session(db, t, max_concurrency=4))[0]))
        )
    quiet = await tenant()
    quiet_conn = await connect(db, hub, (await open_session(db, quiet, max_concurrency=4))[0])
    d = Dispatcher(db, hub)
    # The floods have been served for a while (rounds in which the quiet tenant had nothing).
    for _ in range(3):
        assert await d.run_once() == 40
    task = await quiet.submit()
    rounds = 0
    while not quiet_conn.offers():
        rounds += 1
        await d.run_once()
        assert rounds <= 1, "the quiet tenant's task waited more than one round"
    assert [o.task.id for o in quiet_conn.take_offers()] == [task["id"]]
    # Every flooding tenant got its share too: 4 rounds × 40 offers spread over them.
    served = sum(1 for _, c in floods if c.offers())
    assert served == 100
    await check_invariants(db, quiet.namespace_id)
    await _close(db, [quiet_conn, *(c for _, c in floods)])


async def test_dispatch_rotates_across_fairness_keys_within_a_queue(
    db: Database, tenant: Any
) -> None:
    t = await tenant()
    # Subject "flood" submits 300 tasks first, then ten other subjects one task each.
    await submit_service.submit_batch(
        db, t.namespace_id, t.application_id, _bodies(t.queue, 300, fairness_key="flood")
    )
    quiet = [await t.submit(fairness_key=f"user-{i}") for i in range(10)]
    conn = await connect(
        db, hub := Hub("node-keys"), (await open_session(db, t, max_concurrency=1000))[0]
    )
    d = Dispatcher(db, hub, pool_cap=5)  # 5 offers per round
    order: list[str] = []
    for _ in range(6):
        await d.run_once()
        order += [o.task.id for o in conn.take_offers()]
    assert len(order) == 30
    positions = [order.index(q["id"]) for q in quiet]
    # Eleven subjects in play and 5 offers a round: every quiet subject's task is offered
    # within the first rotation (11 offers), the flood served alongside (work conserving).
    assert max(positions) < 11, positions
    assert sum(1 for x in order[:11] if x not in {q["id"] for q in quiet}) >= 1
    got = await t.submit(fairness_key="user-0")
    assert got["fairness_key"] == "user-0"
    await check_invariants(db, t.namespace_id)
    await _close(db, [conn])


async def test_an_idle_node_costs_one_statement_per_round(
    db: Database, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = Hub("node-idle")
    for _ in range(5):
        t = await tenant()
        await connect(db, hub, (await open_session(db, t))[0])
    d = Dispatcher(db, hub)
    statements: list[str] = []
    fetchall = Tx.fetchall

    async def counting(self: Tx, sql: str, args: Any = None) -> Any:
        statements.append(sql)
        return await fetchall(self, sql, args)

    monkeypatch.setattr(Tx, "fetchall", counting)
    before = db.stats.commits
    for _ in range(3):
        assert await d.run_once() == 0
    assert len(statements) == 3  # one look per round, over the five sessions' queues
    assert db.stats.commits == before  # and no write transaction


async def test_a_delayed_task_wakes_its_queue_when_due(db: Database, tenant: Any) -> None:
    t = await tenant()
    settings = sessions.WorkerSettings(dispatch_poll_ms=10_000)
    hub = Hub("node-delay", settings)
    conn = await connect(db, hub, (await open_session(db, t))[0])
    d = Dispatcher(db, hub)
    task = await t.submit(delay_ms=400)
    stop = asyncio.Event()
    loop = asyncio.create_task(d.run(stop))
    try:
        began = time.perf_counter()
        while not conn.offers():
            await asyncio.sleep(0.01)
            assert time.perf_counter() - began < 3.0, "the delayed task waited for the poll"
        assert [o.task.id for o in conn.take_offers()] == [task["id"]]
        assert time.perf_counter() - began >= 0.3
    finally:
        stop.set()
        hub.notify_new_work(t.namespace_id, t.queue_id)
        await asyncio.wait_for(loop, 5)


async def test_several_nodes_dispatching_one_queue_never_offer_a_task_twice(
    db: Database, dsn: DSN, tenant: Any
) -> None:
    t = await tenant()
    other = await t.other_namespace()
    for ns_t in (t, other):
        await submit_service.submit_batch(
            db, ns_t.namespace_id, ns_t.application_id,
            _bodies(ns_t.queue, 200, fairness_key="a") + _bodies(ns_t.queue, 100),
        )  # fmt: skip
    nodes: list[tuple[Database, Dispatcher, list[Any]]] = []
    for n in range(3):
        node_db = await Database.connect(dsn, maxsize=4)
        hub = Hub(f"node-race-{n}")
        conns = []
        for ns_t in (t, other):
            for _ in range(2):
                conns.append(
                    await connect(db, hub, (await open_session(db, ns_t, max_concurrency=40))[0])
                )
        nodes.append((node_db, Dispatcher(node_db, hub), conns))
    try:

        async def drive(d: Dispatcher) -> None:
            for _ in range(8):
                await d.run_once()

        await asyncio.gather(*(drive(d) for _, d, _ in nodes))
        offered = [o.task.id for _, _, conns in nodes for c in conns for o in c.offers()]
        assert len(offered) == 480  # 3 nodes × 4 sessions × 40 slots, all filled (600 due)
        assert len(set(offered)) == len(offered)
        assert all(node_db.stats.retries.get(1213, 0) == 0 for node_db, _, _ in nodes)
    finally:
        for node_db, _, _ in nodes:
            await node_db.close()
    await check_invariants(db, t.namespace_id)
    await check_invariants(db, other.namespace_id)
    await _close(db, [c for _, _, conns in nodes for c in conns])


async def test_a_round_spans_one_shard_group_only(db: Database, tenant: Any) -> None:
    import shard_guard
    from test_shard_groups import guarded

    a, b = await tenant(), await tenant()
    hub = Hub("node-shards")
    conns = [await connect(db, hub, (await open_session(db, x))[0]) for x in (a, b)]
    for x in (a, b):
        await x.submit()
    # Under a map with a group per namespace, the dispatcher runs one round per group, and
    # the shard guard sees no transaction spanning two namespaces.
    per_namespace = {a.namespace_id: 1, b.namespace_id: 2}
    d = Dispatcher(db, hub, shard_of=lambda ns: per_namespace.get(bytes(ns), 0))
    with guarded("namespace") as g:
        assert await d.run_once() == 2
    assert isinstance(g, shard_guard.Guard) and g.violations == []
    assert all(len(c.take_offers()) == 1 for c in conns)
    await _close(db, conns)
