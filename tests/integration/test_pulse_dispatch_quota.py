"""Application reservation quota at dispatch (``max_reservations``, docs/dispatch.md
"Application reservations quota"): an owner never holds more not-yet-started offers than
its quota — also when the quota is set after the dispatcher last served the owner, and
with several dispatchers racing; the withheld slots are counted as denials."""

from __future__ import annotations

import asyncio

import pytest
from fair_dispatch_support import (
    add_owner,
    leased_of,
    reservations_of,
    set_max_reservations,
    submit_as,
)
from pulse_worker_support import check_invariants, connect, open_session

from orbit.ids import parse_id
from orbit.metrics import Registry
from orbit.storage import Database
from pulse import attempts, wire
from pulse.dispatch import DENIAL_RESERVATIONS, Dispatcher
from pulse.hub import Hub


@pytest.fixture
def hub() -> Hub:
    return Hub("node-quota")


def _denials(metrics: Registry) -> float:
    c = metrics.counter("pulse_dispatch_denials_total", "", ("kind",))
    return c.value(kind=DENIAL_RESERVATIONS)


async def test_quota_caps_offers_and_counts_the_withheld_slots(db, tenant, hub) -> None:
    t = await tenant()
    a = t.application_id
    await set_max_reservations(db, a, 3)
    for _ in range(10):
        await t.submit()
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 3
    assert await reservations_of(db, a) == 3 == await leased_of(db, t, a)
    assert _denials(metrics) == 7  # 10 free slots, 3 allowed
    assert await d.dispatch_to(conn) == 0  # quota used up: nothing, the slots are denied
    assert _denials(metrics) == 14
    offers = conn.take_offers()
    aid = parse_id(offers[0].attempt_id)
    assert aid is not None
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)  # a started attempt is no reservation any more
    assert await d.dispatch_to(conn) == 1
    assert await reservations_of(db, a) == 3
    await check_invariants(db, t.namespace_id)


async def test_quota_set_after_the_owner_was_served_is_still_enforced(db, tenant, hub) -> None:
    """The dispatcher served the owner as unlimited; the quota appears afterwards. It is
    judged on the owner's row as the round locks it, so the next round offers only what the
    quota leaves."""
    t = await tenant()
    a = t.application_id
    for _ in range(10):
        await t.submit()
    d = Dispatcher(db, hub)
    small, _ = await open_session(db, t, max_concurrency=2)
    assert await d.dispatch_to(await connect(db, hub, small)) == 2
    await set_max_reservations(db, a, 3)
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 1
    assert await reservations_of(db, a) == 3 == await leased_of(db, t, a)
    assert await d.dispatch_to(conn) == 0
    await check_invariants(db, t.namespace_id)


async def test_limited_owner_leaves_its_slots_to_the_others(db, tenant, hub) -> None:
    t = await tenant()
    a, b = t.application_id, await add_owner(db)
    await set_max_reservations(db, a, 2)
    for _ in range(10):
        await t.submit()
        await submit_as(db, t, b)
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 10
    assert await leased_of(db, t, a) == 2 == await reservations_of(db, a)
    assert await leased_of(db, t, b) == 8 == await reservations_of(db, b)
    # The round claimed 10 of A's tasks (twice its share of 5) and its quota allowed 2: the
    # 8 claimed rows it held back are the denials.
    assert _denials(metrics) == 8
    await check_invariants(db, t.namespace_id)


async def test_racing_dispatchers_never_pass_the_quota(db, dsn, tenant) -> None:
    """Three nodes (own pools and hubs), two sessions each, all dispatching at once, every
    one of them having served the owner before the quota existed: the owner never holds
    more than its quota of offers."""
    t = await tenant()
    a = t.application_id
    for _ in range(40):
        await t.submit()
    pools = [await Database.connect(dsn, maxsize=3) for _ in range(3)]
    try:
        nodes = []
        for i, pool in enumerate(pools):
            hub = Hub(f"quota-node-{i}")
            d = Dispatcher(pool, hub)
            conns = []
            for _ in range(2):
                info, _ = await open_session(pool, t, max_concurrency=8)
                conns.append(await connect(pool, hub, info))
            nodes.append((d, conns))
        await set_max_reservations(db, a, 5)
        for _ in range(3):
            results = await asyncio.gather(*(d.dispatch_to(c) for d, conns in nodes for c in conns))
            assert sum(results) <= 5
            assert await leased_of(db, t, a) <= 5
        assert await leased_of(db, t, a) == 5 == await reservations_of(db, a)
    finally:
        for p in pools:
            await p.close()
    await check_invariants(db, t.namespace_id)
