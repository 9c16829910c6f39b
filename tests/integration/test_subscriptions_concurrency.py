"""Concurrency: the result sequence under concurrent producers, and pumps on several pools.

* The per-namespace result sequence stays gap-free and unique, and is committed in order
  (a reader that sees seq n sees every seq < n), with several producer connections appending
  batches of random sizes while a reader scans (Hypothesis picks the shapes).
* Two Database pools (two "server processes") pumping and handing out one subscription
  while producers append never create a duplicate delivery and never skip an event.
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from subscription_fixtures import append_results, make_tenant

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.events import list_result_events
from orbit.storage import DSN, Database
from orbit.subscriptions import SubscriptionFilter, SubscriptionPut


async def _scan_until(db: Database, ns: bytes, total: int, stop: asyncio.Event) -> list[int]:
    """Read the stream like a consumer; assert every read is a contiguous prefix."""
    seen = 0
    observed: list[int] = []
    while True:
        done = stop.is_set()
        events = await list_result_events(db, ns, seen, 1000)
        for ev in events:
            assert ev.seq == seen + 1, f"gap or duplicate after {seen}: got {ev.seq}"
            seen = ev.seq
            observed.append(ev.seq)
        if done and seen >= total:
            return observed
        await asyncio.sleep(0)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=6), min_size=2, max_size=5)
)
async def test_sequence_gapless_unique_under_concurrent_producers(
    db: Database, batches: list[list[int]]
) -> None:
    t = await make_tenant(db)
    stop = asyncio.Event()
    total = sum(sum(b) for b in batches)

    async def producer(sizes: list[int]) -> list[int]:
        got: list[int] = []
        for n in sizes:
            got += await append_results(db, t.namespace_id, n)
            await asyncio.sleep(random.random() / 1000)
        return got

    reader = asyncio.create_task(_scan_until(db, t.namespace_id, total, stop))
    results = await asyncio.gather(*(producer(b) for b in batches))
    stop.set()
    observed = await asyncio.wait_for(reader, 30)
    taken = sorted(s for r in results for s in r)
    assert taken == list(range(1, total + 1))  # unique and gap-free
    assert observed == taken
    for r in results:  # each batch took a consecutive range
        assert r == sorted(r)
    events = await list_result_events(db, t.namespace_id, 0, 1000)
    assert len({e.event_id for e in events}) == total


@pytest.fixture
async def second_db(dsn: DSN):
    other = await Database.connect(dsn, maxsize=6)
    try:
        yield other
    finally:
        await other.close()


async def test_two_pools_handing_out_never_duplicate_or_skip(
    db: Database, second_db: Database
) -> None:
    """Hand-outs from two pools ("server processes") race while producers append: every
    matching event is handed out for the first time exactly once, under one delivery id,
    and none is skipped."""
    t = await make_tenant(db)
    row, *_ = await subscriptions.put_subscription(
        db,
        CLI_ACTOR,
        t.namespace_id,
        "s",
        SubscriptionPut(
            start="earliest", filter=SubscriptionFilter(states=["SUCCEEDED"]), max_in_flight=10_000
        ),
    )
    producing = asyncio.Event()
    producing.set()

    async def produce() -> None:
        for i in range(40):
            await append_results(
                db,
                t.namespace_id,
                random.randint(1, 8),
                state="FAILED" if i % 5 == 0 else "SUCCEEDED",
            )
        producing.clear()

    first: list[tuple[int, bytes]] = []

    async def lease(pool: Database, want: int) -> None:
        while True:
            busy = producing.is_set()
            batch = await delivery_pump.lease(pool, t.namespace_id, row.id, want)
            first.extend((d.seq, d.delivery_id) for d in batch.deliveries if d.attempt == 1)
            if not busy and not batch.deliveries and not batch.behind:
                return

    await asyncio.gather(produce(), lease(db, 3), lease(second_db, 7), lease(second_db, 1))
    events = await list_result_events(db, t.namespace_id, 0, 5000)
    expected = [e.seq for e in events if e.state == "SUCCEEDED"]
    assert sorted(s for s, _ in first) == expected  # exactly once each, none skipped
    assert len({d for _, d in first}) == len(first)
    history = await delivery_history.list_history(
        db, t.namespace_id, row.id, state=None, after_seq=0, limit=5000
    )
    assert [(r.seq, r.id) for r in history] == sorted(first)
    sub = await subscriptions.get_subscription(db, t.namespace_id, "s")
    assert sub.after_seq == events[-1].seq


async def test_concurrent_hand_outs_never_share_a_delivery(
    db: Database, second_db: Database
) -> None:
    t = await make_tenant(db)
    row, *_ = await subscriptions.put_subscription(
        db, CLI_ACTOR, t.namespace_id, "s", SubscriptionPut(start="earliest", max_in_flight=7)
    )
    await append_results(db, t.namespace_id, 60)
    handed: list[bytes] = []
    peak = 0

    async def consumer(pool: Database) -> None:
        nonlocal peak
        for _ in range(200):
            batch = await delivery_pump.lease(pool, t.namespace_id, row.id, 3)
            peak = max(peak, batch.in_flight)
            if not batch.deliveries and len(handed) >= 60:
                return
            for d in batch.deliveries:
                handed.append(d.delivery_id)
                await deliveries.ack(pool, t.namespace_id, d.delivery_id, d.proof)

    await asyncio.gather(consumer(db), consumer(second_db), consumer(db), consumer(second_db))
    assert len(handed) == 60 and len(set(handed)) == 60
    assert peak <= 7


async def test_two_delivery_loops_on_two_pools(db: Database, second_db: Database) -> None:
    """Two nodes' loops sweep the same expired leases at once: each expired delivery is
    reclaimed exactly once (one row per delivery, SKIP LOCKED: nobody waits)."""
    from orbit.delivery_loop import DeliveryLoop

    t = await make_tenant(db)
    row, *_ = await subscriptions.put_subscription(
        db,
        CLI_ACTOR,
        t.namespace_id,
        "s",
        SubscriptionPut(start="earliest", ack_timeout_ms=100, max_in_flight=1000),
    )
    # one sweep page covers every subscription of the test database (other tests' too)
    loops = [
        DeliveryLoop(pool, sweep_interval_s=0.0, sweep_per_round=100_000)
        for pool in (db, second_db)
    ]
    t0 = await db.now()
    handed = 0
    for _ in range(10):
        await append_results(db, t.namespace_id, random.randint(1, 30))
        batch = await delivery_pump.lease(db, t.namespace_id, row.id, 500, now=t0)
        handed += len(batch.deliveries)
    later = t0 + timedelta(seconds=1)
    rounds = await asyncio.gather(*(lp.run_once(now=later) for lp in loops))
    assert all(r.errors == 0 for r in rounds)
    assert sum(r.redelivered for r in rounds) + sum(r.skipped for r in rounds) >= 1
    await loops[0].run_once(now=later)
    history = await delivery_history.list_history(
        db, t.namespace_id, row.id, state=None, after_seq=0, limit=5000
    )
    events = await list_result_events(db, t.namespace_id, 0, 5000)
    assert [r.seq for r in history] == [e.seq for e in events] and len(history) == handed
    assert {r.state for r in history} == {"PENDING"}  # every one reclaimed, once
