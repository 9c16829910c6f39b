"""Capacity from permits (docs/dispatch.md "Capacity from permits"): the dispatcher never
offers more than the queue's ``max_concurrency`` or the owner's ``max_active_attempts``
leaves (running + offered, judged on the usage rows it locked first), so a backlog with free
worker capacity does not turn into a hot loop of offer → start_denied → release → re-offer;
the withheld slots are counted as ``pulse_dispatch_denials_total{kind=queue_permits |
application_active}``; the no-limit path sends exactly as many statements as before."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from fair_dispatch_support import flood
from permits_support import complete, rows, set_app_limits
from pulse_fixtures import Tenant
from pulse_worker_support import FakeConn, check_invariants, connect, open_session

from orbit.ids import parse_id
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from pulse import attempts, wire
from pulse.dispatch import DENIAL_APPLICATION_ACTIVE, DENIAL_QUEUE_PERMITS, Dispatcher
from pulse.hub import Hub

#: How long the dispatch + start loop runs.
#: The loop runs until this many tasks completed (the checks are about what the rounds did,
#: not how fast a loaded machine ran them), or for at most LOOP_S seconds.
LOOP_COMPLETED = 20
LOOP_S = 60.0


@pytest.fixture
def hub() -> Hub:
    return Hub(f"node-capacity-{time.monotonic_ns()}")


def _denials(metrics: Registry, kind: str) -> float:
    return metrics.counter("pulse_dispatch_denials_total", "", ("kind",)).value(kind=kind)


async def _in_flight(db: Database, t: Tenant, **where: bytes) -> int:
    """LEASED + RUNNING tasks of the namespace (optionally of one queue or owner)."""
    cond = "".join(f" AND {col} = %s" for col in where)
    (row,) = await rows(
        db,
        "SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
        " AND state IN ('LEASED', 'RUNNING')" + cond,
        t.namespace_id,
        *where.values(),
    )
    return int(row["n"])


@dataclass
class LoopStats:
    rounds: int = 0
    offers: int = 0
    denied: int = 0  # start_denied replies
    completed: int = 0
    max_in_flight: int = 0


async def _backlog(t: Tenant, n: int, queue: str | None = None) -> None:
    """``n`` WAITING tasks in the queue (one submitted, the rest bulk copies of it)."""
    first = await t.submit(**({"queue": queue} if queue else {}))
    if n > 1:
        await flood(t.db, t, first["id"], n - 1)


async def _run_loop(
    db: Database, t: Tenant, d: Dispatcher, conns: list[FakeConn], seconds: float,
    **where: bytes,
) -> LoopStats:  # fmt: skip
    """Complete what runs, dispatch and start every offer (one start batch per session),
    for ``seconds``: an attempt runs one round, so tasks keep finishing. Tracks the most
    LEASED + RUNNING tasks seen (after dispatch, before starts) and the start denials."""
    s = LoopStats()
    running: list[wire.Started] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and s.completed < LOOP_COMPLETED:
        s.rounds += 1
        for done in running:
            await complete(db, t, done)
            s.completed += 1
        running = []
        s.offers += await d.run_once()
        s.max_in_flight = max(s.max_in_flight, await _in_flight(db, t, **where))
        for conn in conns:
            offered = conn.take_offers()
            if not offered:
                continue
            items = [(conn.info.session_id, parse_id(o.attempt_id)) for o in offered]
            replies = await attempts.start_many(db, t.namespace_id, items)  # type: ignore[arg-type]
            for r in replies:
                if isinstance(r, wire.Started):
                    running.append(r)
                else:
                    s.denied += 1
        s.max_in_flight = max(s.max_in_flight, await _in_flight(db, t, **where))
    for done in running:
        await complete(db, t, done)
        s.completed += 1
    return s


async def _sessions(db: Database, hub: Hub, t: Tenant, n: int, **kw: Any) -> list[FakeConn]:
    return [await connect(db, hub, (await open_session(db, t, **kw))[0]) for _ in range(n)]


async def test_queue_max_concurrency_caps_offers_and_stops_the_denial_loop(db, tenant, hub) -> None:
    t = await tenant(max_concurrency=2)
    await _backlog(t, 200)
    conns = await _sessions(db, hub, t, 3, max_concurrency=10)
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    # One round: the three sessions have 30 free slots; the queue has room for 2.
    assert await d.run_once() == 2
    assert await _in_flight(db, t) == 2
    assert await d.run_once() == 0  # full: nothing is claimed, the slots are denials
    assert _denials(metrics, DENIAL_QUEUE_PERMITS) > 0
    stats = await _run_loop(db, t, d, conns, LOOP_S)
    # Old code (offers ignored the limit): hundreds of denials in the same loop.
    assert stats.denied <= 3, stats
    assert stats.max_in_flight <= 2, stats
    assert stats.completed >= 20, stats  # tasks still progress as attempts finish
    (usage,) = await rows(
        db,
        "SELECT denials_permits, active_attempts, reservations FROM pulse_queue_usage"
        " WHERE namespace_id = %s AND queue_id = %s",
        t.namespace_id,
        t.queue_id,
    )
    assert int(usage["denials_permits"]) == stats.denied
    await check_invariants(db, t.namespace_id)


async def test_application_max_active_attempts_caps_offers_across_queues(db, tenant, hub) -> None:
    t = await tenant()
    other = "second"
    second = await t.add_queue(other)
    await set_app_limits(db, t, max_active_attempts=3)
    await _backlog(t, 100)
    await _backlog(t, 100, queue=other)
    conns = await _sessions(db, hub, t, 3, max_concurrency=10, queues=[t.queue, other])
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    assert await d.run_once() == 3
    assert await _in_flight(db, t) == 3
    assert await d.run_once() == 0
    assert _denials(metrics, DENIAL_APPLICATION_ACTIVE) > 0
    stats = await _run_loop(db, t, d, conns, LOOP_S, owner_id=t.application_id)
    assert stats.denied <= 3, stats
    assert stats.max_in_flight <= 3, stats
    assert stats.completed >= 20, stats
    # Both queues progressed (the owner's room is shared, not taken by one queue only).
    done = {
        bytes(r["queue_id"]): int(r["n"])
        for r in await rows(
            db,
            "SELECT queue_id, COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
            " AND state = 'SUCCEEDED' GROUP BY queue_id",
            t.namespace_id,
        )
    }
    assert done.get(t.queue_id, 0) > 0 and done.get(second, 0) > 0, done
    await check_invariants(db, t.namespace_id)


async def test_reservations_and_active_limits_combine(db, tenant, hub) -> None:
    """The owner's room is the smaller of what max_reservations and max_active_attempts
    leave; the binding limit is the denial kind."""
    t = await tenant(max_concurrency=50)
    await _backlog(t, 30)
    await set_app_limits(db, t, max_active_attempts=4, max_reservations=10)
    (conn,) = await _sessions(db, hub, t, 1, max_concurrency=10)
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    assert await d.dispatch_to(conn) == 4
    assert _denials(metrics, DENIAL_APPLICATION_ACTIVE) == 6
    assert _denials(metrics, DENIAL_QUEUE_PERMITS) == 0
    # Two start, two stay offered: room = 4 - 2 running - 2 offered = 0.
    offered = conn.take_offers()
    items = [(conn.info.session_id, parse_id(o.attempt_id)) for o in offered[:2]]
    replies = await attempts.start_many(db, t.namespace_id, items)  # type: ignore[arg-type]
    assert all(isinstance(r, wire.Started) for r in replies)
    assert await d.dispatch_to(conn) == 0
    await complete(db, t, replies[0])  # type: ignore[arg-type]
    assert await d.dispatch_to(conn) == 1
    await check_invariants(db, t.namespace_id)


# -- the no-limit path costs what it did ------------------------------------------------------


class _Count:
    def __init__(self) -> None:
        self.on = False
        self.sql: list[str] = []


def _count_round_trips(monkeypatch: pytest.MonkeyPatch) -> _Count:
    c = _Count()
    execute, executemany, batch = Tx.execute, Tx.executemany, Tx.execute_batch

    async def rec_execute(self: Tx, sql: str, args: Any = None) -> int:
        if c.on:
            c.sql.append(sql)
        return await execute(self, sql, args)

    async def rec_executemany(self: Tx, sql: str, args: Any) -> int:
        if c.on:
            c.sql.append(sql)
        return await executemany(self, sql, args)

    async def rec_batch(self: Tx, statements: Any) -> list[int]:
        if c.on and len(statements) > 1:  # one statement goes through execute
            c.sql.append(" ;; ".join(s for s, _ in statements))
        return await batch(self, statements)

    monkeypatch.setattr(Tx, "execute", rec_execute)
    monkeypatch.setattr(Tx, "executemany", rec_executemany)
    monkeypatch.setattr(Tx, "execute_batch", rec_batch)
    return c


#: Statements of one node dispatch round that offers tasks of one unlimited owner from one
#: unlimited queue, its look inside the transaction (the last look found work): session
#: lock, gates and look (one round trip), usage lock, claim, lease + counters batch,
#: attempts INSERT, events INSERT (the last three in one round trip).
NO_LIMIT_ROUND_TRIPS = 8


async def test_no_limit_path_sends_no_extra_statement(db, tenant, hub, monkeypatch) -> None:
    t = await tenant()
    await _backlog(t, 40)
    (conn,) = await _sessions(db, hub, t, 1, max_concurrency=5)
    d = Dispatcher(db, hub, metrics=Registry())
    assert await d.dispatch_to(conn) == 5  # its look found work: the next round looks inside
    for o in conn.take_offers():
        aid = parse_id(o.attempt_id)
        assert aid is not None
        started = await attempts.start(db, t.namespace_id, conn.info.session_id, aid)
        assert isinstance(started, wire.Started)
        await complete(db, t, started)
    c = _count_round_trips(monkeypatch)
    c.on = True
    assert await d.dispatch_to(conn) == 5
    c.on = False
    assert len(c.sql) == NO_LIMIT_ROUND_TRIPS, "\n---\n".join(s[:120] for s in c.sql)
    await check_invariants(db, t.namespace_id)
