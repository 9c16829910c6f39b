"""Priority (docs/dispatch.md#priority): ``dispatch_at = available_at - priority × 30 s``.
A priority-9 task that is due goes before a priority-0 task that became due up to 270 s
earlier, and never before it is actually due — on the queue-wide claim (one owner in play)
and on the per-owner claims of fair dispatch (several owners)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from fair_dispatch_support import add_owner, finish_offers, submit_as
from pulse_worker_support import check_invariants, connect, open_session

from pulse.dispatch import Dispatcher
from pulse.hub import Hub

ISO = "%Y-%m-%dT%H:%M:%S.%fZ"

#: One owner (queue-wide claim) or two (the per-owner claims of fair dispatch).
PATHS = pytest.mark.parametrize("owners", [1, 2], ids=["queue_claim", "owner_claims"])


@pytest.fixture
def hub() -> Hub:
    return Hub("node-priority")


def at(base: datetime, seconds: float) -> str:
    return (base + timedelta(seconds=seconds)).strftime(ISO)


async def _other_owner_busy(db, t, owners: int, base: datetime) -> None:
    """With ``owners == 2``, a second owner with one due task, so the dispatcher takes the
    per-owner claims (the order within each owner is what is checked)."""
    if owners == 2:
        b = await add_owner(db)
        await submit_as(db, t, b, kind="other", available_at=at(base, -3600))


@PATHS
async def test_priority_9_goes_before_priority_0_due_up_to_270s_earlier(
    db, tenant, hub, owners
) -> None:
    t = await tenant()
    base = (await db.now()).replace(microsecond=0)
    await _other_owner_busy(db, t, owners, base)
    p0_late = await t.submit(priority=0, available_at=at(base, -269.9))  # due 269.9 s before p9
    p9 = await t.submit(priority=9, available_at=at(base, 0))
    p0_early = await t.submit(priority=0, available_at=at(base, -270.1))  # 270.1 s: goes first
    p5 = await t.submit(priority=5, available_at=at(base, -119.95))  # dispatch_at: -269.95 s
    info, _ = await open_session(db, t, max_concurrency=1)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    now = base + timedelta(milliseconds=1)
    order = []
    for _ in range(owners * 4):
        # One slot: every round offers the first due task of the owner whose turn it is;
        # the task is then run to completion so the slot frees.
        assert await d.dispatch_to(conn, now=now) == 1
        (offer,) = conn.take_offers()
        if offer.task.kind != "other":
            order.append(offer.task.id)
        await _give_back(db, t, info.session_id, offer)
        if len(order) == 4:
            break
    assert order == [p0_early["id"], p9["id"], p5["id"], p0_late["id"]]
    await check_invariants(db, t.namespace_id)


async def _give_back(db, t, session_id: bytes, offer) -> None:
    """Complete the offered attempt through the real services (frees the session slot)."""
    await finish_offers(db, t, session_id, [offer])


@PATHS
async def test_priority_task_is_never_offered_before_it_is_due(db, tenant, hub, owners) -> None:
    """A priority-9 task available in 20 s has dispatch_at 250 s in the past: it is first in
    dispatch order, yet only offered once available_at passes; a due priority-0 task behind
    it is offered meanwhile. (The pinned clock stays inside the session's 30 s lease.)"""
    t = await tenant()
    base = (await db.now()).replace(microsecond=0)
    await _other_owner_busy(db, t, owners, base)
    future = await t.submit(priority=9, available_at=at(base, 20))
    due = await t.submit(priority=0, available_at=at(base, -10))
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    assert await d.dispatch_to(conn, now=base) == owners  # `due` (+ the other owner's task)
    ids = {o.task.id for o in conn.take_offers()}
    assert due["id"] in ids and future["id"] not in ids
    assert await d.dispatch_to(conn, now=base + timedelta(seconds=19.999)) == 0
    assert await d.dispatch_to(conn, now=base + timedelta(seconds=20)) == 1
    assert [o.task.id for o in conn.take_offers()] == [future["id"]]
    await check_invariants(db, t.namespace_id)


async def test_deadline_passed_and_other_queues_are_not_due(db, tenant, hub) -> None:
    """Past its deadline a waiting task is not offered (the deadline sweep fails it)."""
    t = await tenant()
    base = (await db.now()).replace(microsecond=0)
    await t.submit(priority=9, available_at=at(base, -60), deadline_at=at(base, -1))
    ok = await t.submit(priority=0, available_at=at(base, -60), deadline_at=at(base, 60))
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn, now=base) == 1
    assert [o.task.id for o in conn.take_offers()] == [ok["id"]]
