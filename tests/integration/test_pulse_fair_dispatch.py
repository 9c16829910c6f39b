"""Fair dispatch (docs/dispatch.md#fairness-across-owners-queues-and-sessions): within a queue the
dispatcher shares a session's capacity round-robin across the owners with due tasks, so one
owner's flood cannot starve another; with one owner it costs one claim query as before."""

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
    In plain dispatch order B would wait for all 10,000. Fair dispatch: once the owner hint
    is refreshed (at most ``owner_refresh_uses`` dispatches), every round gives B half of
    the session's free slots, so B's 3 tasks are all offered within refresh + 1 rounds."""
    t = await tenant()
    a = t.application_id
    b = await add_owner(db)
    template = await t.submit()
    await flood(db, t, template["id"], 9_999)  # A: 10,000 waiting tasks
    info, _ = await open_session(db, t, max_concurrency=8)
    conn = await connect(db, hub, info)
    refresh = 4
    d = Dispatcher(db, hub, owner_refresh_uses=refresh, owner_refresh_ms=60_000)
    for _ in range(3):  # the hint now knows only A; each round drains the session
        assert await d.dispatch_to(conn) == 8
        offers = conn.take_offers()
        await finish_offers(db, t, info.session_id, offers)
    b_ids = {(await submit_as(db, t, b))["id"] for _ in range(3)}
    rounds, got_b, got_a = 0, set(), 0
    while got_b != b_ids:
        rounds += 1
        assert rounds <= refresh + 1, f"B waited {rounds} rounds (bound {refresh + 1})"
        assert await d.dispatch_to(conn) == 8
        offers = conn.take_offers()
        got_b |= {o.task.id for o in offers} & b_ids
        got_a += sum(o.task.id not in b_ids for o in offers)
        await finish_offers(db, t, info.session_id, offers)
    # A kept flowing meanwhile: its tasks filled every slot B did not need.
    assert got_a == rounds * 8 - len(b_ids)
    hint = d.owner_hint(t.namespace_id, t.queue_id)
    assert hint is not None and set(hint.owners) >= {a}
    await check_invariants(db, t.namespace_id)


async def test_capacity_is_split_round_robin_across_owners(db, tenant, hub) -> None:
    """Three owners with plenty of due tasks: a session with 6 free slots gets 2 of each;
    a session with 1 slot gets them in turn (the rotating offset), 2 each in 6 rounds."""
    t = await tenant()
    owners = [t.application_id, await add_owner(db), await add_owner(db)]
    by_task: dict[str, bytes] = {}
    for owner in owners:
        for _ in range(6):
            by_task[(await submit_as(db, t, owner))["id"]] = owner
    d = Dispatcher(db, hub, owner_refresh_uses=1_000, owner_refresh_ms=60_000)
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
    # First use probes the owners: both are known at once.
    assert await d.dispatch_to(conn) == 10
    ids = [o.task.id for o in conn.take_offers()]
    assert b_task["id"] in ids and len(set(ids)) == 10
    await check_invariants(db, t.namespace_id)


async def test_single_owner_costs_one_claim_and_rare_probes(db, tenant, hub, monkeypatch) -> None:
    """With one owner the dispatcher runs the queue-wide claim once per queue per dispatch
    (as before fairness) and probes the owners only every ``owner_refresh_uses`` uses."""
    calls: Counter[str] = Counter()
    for name in ("task_claim_due_in_queue", "task_claim_due_for_owner", "task_owner_next"):
        original = getattr(dispatch_store, name)

        def counted(*args: Any, _name: str = name, _fn: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _fn(*args, **kw)

        monkeypatch.setattr(dispatch_store, name, counted)
    t = await tenant()
    template = await t.submit()
    await flood(db, t, template["id"], 99)
    metrics = Registry()
    d = Dispatcher(db, hub, metrics=metrics, owner_refresh_uses=8, owner_refresh_ms=60_000)
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    for _ in range(16):
        assert await d.dispatch_to(conn) == 4
        await finish_offers(db, t, info.session_id, conn.take_offers())
    assert calls["task_claim_due_in_queue"] == 16
    assert calls["task_claim_due_for_owner"] == 0
    assert calls["task_owner_next"] == 4  # 2 probes (first use, after 8 uses) × (A, end)
    assert metrics.counter("pulse_dispatch_owner_probes_total", "").value() == 2
    # A full session is dispatch backpressure, counted by kind.
    await d.dispatch_to(conn)
    assert await d.dispatch_to(conn) == 0
    denials = metrics.counter("pulse_dispatch_denials_total", "", ("kind",))
    assert denials.value(kind="session_capacity") == 1
    await check_invariants(db, t.namespace_id)


async def test_new_owner_in_an_idle_queue_is_found_at_once(db, tenant, hub) -> None:
    """The hint is only a hint: an owner it does not list still gets its due tasks by the
    queue-wide claim when no other owner is in play (e.g. right after a restart)."""
    t = await tenant()
    d = Dispatcher(db, hub, owner_refresh_uses=1_000, owner_refresh_ms=60_000)
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 0  # probes: no owner at all
    b = await add_owner(db)
    task = await submit_as(db, t, b)
    assert await d.dispatch_to(conn) == 1
    assert [o.task.id for o in conn.take_offers()] == [task["id"]]
    hint = d.owner_hint(t.namespace_id, t.queue_id)
    assert hint is not None and hint.stale  # it met an owner it did not list: re-probe


async def test_owner_missing_from_the_hint_gets_spare_capacity_at_once(db, tenant, hub) -> None:
    """Two owners known, the hint fresh for a long time: a third owner's task still goes out
    in the very next dispatch when the known owners leave slots free (one queue-wide claim
    after the per-owner ones), and the hint is marked for a new probe."""
    t = await tenant()
    b, c = await add_owner(db), await add_owner(db)
    await t.submit()
    await submit_as(db, t, b)
    d = Dispatcher(db, hub, owner_refresh_uses=1_000, owner_refresh_ms=60_000)
    info, _ = await open_session(db, t, max_concurrency=10)
    conn = await connect(db, hub, info)
    assert await d.dispatch_to(conn) == 2
    conn.take_offers()
    hint = d.owner_hint(t.namespace_id, t.queue_id)
    assert hint is not None and set(hint.owners) == {t.application_id, b}
    await t.submit()
    await submit_as(db, t, b)
    late = await submit_as(db, t, c)
    assert await d.dispatch_to(conn) == 3
    assert late["id"] in {o.task.id for o in conn.take_offers()}
    assert hint.stale
    await check_invariants(db, t.namespace_id)


async def test_restart_loses_only_the_hint(db, tenant, hub) -> None:
    """A fresh dispatcher (a restarted node) has no rotation state: it probes and is fair
    from its first dispatch."""
    t = await tenant()
    b = await add_owner(db)
    template = await t.submit()
    await flood(db, t, template["id"], 99)
    b_ids = {(await submit_as(db, t, b))["id"] for _ in range(2)}
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 4
    assert b_ids <= {o.task.id for o in conn.take_offers()}
