"""Fair dispatch across owners (docs/dispatch.md#the-node-dispatch-round), through a session's
own dispatch (``Dispatcher.dispatch_to``: the node round over that session): within a queue
the capacity is shared across the owners with due tasks, least recently served first, so one
owner's flood cannot starve another; with one owner it costs one look and one claim."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from fair_dispatch_support import add_owner, finish_offers, flood, submit_as
from pulse_worker_support import check_invariants, connect, open_session

from orbit.metrics import Registry
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.store import dispatch as dispatch_store


@pytest.fixture
def hub() -> Hub:
    return Hub("node-fair")


def _owners(offers: list[Any], by_task: dict[str, bytes]) -> Counter[bytes]:
    return Counter(by_task.get(o.task.id, b"A") for o in offers)


async def test_flooding_owner_does_not_starve_another_within_bounded_rounds(
    db, tenant, hub
) -> None:
    """Owner A has 10,000 waiting tasks that all became due an hour before owner B's few.
    In plain dispatch order B would wait for all 10,000. Fair dispatch: the round's look
    sees B's subject at once and the round gives it its share of the session's free slots,
    so B's 3 tasks are all offered in the first dispatch after they are submitted."""
    t = await tenant()
    b = await add_owner(db)
    template = await t.submit()
    await flood(db, t, template["id"], 9_999)  # A: 10,000 waiting tasks
    info, _ = await open_session(db, t, max_concurrency=8)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    for _ in range(3):  # only A has due work; each round drains the session
        assert await d.dispatch_to(conn) == 8
        offers = conn.take_offers()
        await finish_offers(db, t, info.session_id, offers)
    b_ids = {(await submit_as(db, t, b))["id"] for _ in range(3)}
    rounds, got_b, got_a = 0, set(), 0
    while got_b != b_ids:
        rounds += 1
        assert rounds <= 1, f"B waited {rounds} rounds"
        assert await d.dispatch_to(conn) == 8
        offers = conn.take_offers()
        got_b |= {o.task.id for o in offers} & b_ids
        got_a += sum(o.task.id not in b_ids for o in offers)
        await finish_offers(db, t, info.session_id, offers)
    # A kept flowing meanwhile: its tasks filled every slot B did not need.
    assert got_a == rounds * 8 - len(b_ids)
    await check_invariants(db, t.namespace_id)


async def test_capacity_is_split_round_robin_across_owners(db, tenant, hub) -> None:
    """Three owners with plenty of due tasks: a session with 6 free slots gets 2 of each;
    a session with 1 slot gets them in turn (least recently served first), 2 each in 6
    rounds."""
    t = await tenant()
    owners = [t.application_id, await add_owner(db), await add_owner(db)]
    by_task: dict[str, bytes] = {}
    for owner in owners:
        for _ in range(6):
            by_task[(await submit_as(db, t, owner))["id"]] = owner
    d = Dispatcher(db, hub)
    info, _ = await open_session(db, t, max_concurrency=6)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 6
    assert _owners(conn.take_offers(), by_task) == Counter({o: 2 for o in owners})
    one, _ = await open_session(db, t, max_concurrency=1)
    conn1 = await connect(db, hub, one)
    seen: list[bytes] = []
    for _ in range(6):
        assert await d.dispatch_to(conn1) == 1
        (offer,) = conn1.take_offers()
        seen.append(by_task[offer.task.id])
        await finish_offers(db, t, one.session_id, [offer])
    assert Counter(seen) == Counter({o: 2 for o in owners})
    assert all(seen[i] != seen[i + 1] for i in range(len(seen) - 1))  # strictly in turn
    await check_invariants(db, t.namespace_id)


async def test_unused_share_goes_to_the_other_owners(db, tenant, hub) -> None:
    """B has 1 due task, A has many: a session with 10 slots gets B's 1 and 9 of A's (the
    slots B could not use are not wasted)."""
    t = await tenant()
    b = await add_owner(db)
    template = await t.submit()
    await flood(db, t, template["id"], 49)
    b_task = await submit_as(db, t, b)
    d = Dispatcher(db, hub)
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    # The look sees both owners' subjects at once.
    assert await d.dispatch_to(conn) == 10
    ids = [o.task.id for o in conn.take_offers()]
    assert b_task["id"] in ids and len(set(ids)) == 10
    await check_invariants(db, t.namespace_id)


async def test_single_owner_costs_one_look_and_one_claim(db, tenant, hub, monkeypatch) -> None:
    """With one owner every dispatch of the session runs one look (before the round, or
    inside it once the last look found work) and one claim statement."""
    calls: Counter[str] = Counter()
    for name in ("round_look", "round_claim"):
        original = getattr(dispatch_store, name)

        def counted(*args: Any, _name: str = name, _fn: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _fn(*args, **kw)

        monkeypatch.setattr(dispatch_store, name, counted)
    t = await tenant()
    template = await t.submit()
    await flood(db, t, template["id"], 99)
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics)
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    for _ in range(16):
        assert await d.dispatch_to(conn) == 4
        await finish_offers(db, t, info.session_id, conn.take_offers())
    assert calls == Counter({"round_look": 16, "round_claim": 16})
    # A full session is dispatch backpressure, counted by kind.
    await d.dispatch_to(conn)
    assert await d.dispatch_to(conn) == 0
    denials = metrics.counter("pulse_dispatch_denials_total", "", ("kind",))
    assert denials.value(kind="session_capacity") == 1
    await check_invariants(db, t.namespace_id)


async def test_new_owner_in_an_idle_queue_is_found_at_once(db, tenant, hub) -> None:
    """The dispatcher keeps no list of a queue's owners: a new owner's due task on a queue
    that had none is offered by the next dispatch."""
    t = await tenant()
    d = Dispatcher(db, hub)
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 0  # the look: no work at all
    b = await add_owner(db)
    task = await submit_as(db, t, b)
    assert await d.dispatch_to(conn) == 1
    assert [o.task.id for o in conn.take_offers()] == [task["id"]]


async def test_a_third_owner_gets_spare_capacity_at_once(db, tenant, hub) -> None:
    """Two owners served: a third owner's task goes out in the very next dispatch when the
    others leave slots free (each look walks the queue's subjects anew)."""
    t = await tenant()
    b, c = await add_owner(db), await add_owner(db)
    await t.submit()
    await submit_as(db, t, b)
    d = Dispatcher(db, hub)
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 2
    conn.take_offers()
    await t.submit()
    await submit_as(db, t, b)
    late = await submit_as(db, t, c)
    assert await d.dispatch_to(conn) == 3
    assert late["id"] in {o.task.id for o in conn.take_offers()}
    await check_invariants(db, t.namespace_id)


async def test_restart_loses_only_the_serving_order(db, tenant, hub) -> None:
    """A fresh dispatcher (a restarted node) remembers no one as served: it is fair from its
    first dispatch."""
    t = await tenant()
    b = await add_owner(db)
    template = await t.submit()
    await flood(db, t, template["id"], 99)
    b_ids = {(await submit_as(db, t, b))["id"] for _ in range(2)}
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 4
    assert b_ids <= {o.task.id for o in conn.take_offers()}
