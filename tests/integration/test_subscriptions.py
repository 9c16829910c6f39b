"""Subscriptions and deliveries on a real MariaDB: configuration, pump, lease, ack/nack,
lease expiry, budget, history. The clock is pinned through ``now`` parameters."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import pytest
from subscription_fixtures import SubTenant, append_results, make_tenant

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.deliveries import StaleProof
from orbit.errors import Conflict, InvalidRequest, NotFound, PreconditionFailed
from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx
from orbit.store import deliveries as dstore
from orbit.store import subscriptions as sub_store
from orbit.store.clock import clock_now
from orbit.subscriptions import StartAfterSeq, SubscriptionFilter, SubscriptionPut


async def _put(db: Database, t: SubTenant, name: str = "s", **kw: object):
    body = msgspec.convert(kw, SubscriptionPut)
    return await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, name, body)


def ms(n: int) -> timedelta:
    return timedelta(milliseconds=n)


async def _rows(db: Database, t: SubTenant, sub_id: bytes) -> list[dstore.DeliveryRow]:
    """The subscription's history: its rows and the slots of its ranges, in seq order."""
    return await delivery_history.list_history(
        db, t.namespace_id, sub_id, state=None, after_seq=0, limit=500
    )


async def _seqs(db: Database, t: SubTenant, sub_id: bytes, want: int = 500) -> list[int]:
    """Seqs handed out by one lease."""
    batch = await delivery_pump.lease(db, t.namespace_id, sub_id, want)
    return [d.seq for d in batch.deliveries]


# ----------------------------------------------------------------------------- config


async def test_put_creates_then_updates_then_noop(db: Database) -> None:
    t = await make_tenant(db)
    row, created, changed = await _put(db, t, filter={"queues": ["b", "a", "a"]})
    assert (created, changed, row.revision) == (True, True, 1)
    out = subscriptions.subscription_out(row)
    assert out.filter.queues == ["a", "b"]
    assert (out.ack_timeout_ms, out.max_deliveries, out.max_in_flight) == (30_000, 10, 100)
    assert out.start == "latest"

    row2, created, changed = await _put(db, t, max_in_flight=5)
    assert (created, changed, row2.revision, row2.max_in_flight) == (False, True, 2, 5)
    assert subscriptions.parse_filter(row2.filter).queues == ["a", "b"]  # omitted: kept

    row3, created, changed = await _put(db, t, max_in_flight=5)
    assert (created, changed, row3.revision) == (False, False, 2)


async def test_put_preconditions_and_fixed_start(db: Database) -> None:
    t = await make_tenant(db)
    body = SubscriptionPut(start="earliest")
    with pytest.raises(PreconditionFailed):  # If-Match on a missing subscription
        await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, "s", body, if_match=1)
    await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, "s", body, create_only=True)
    with pytest.raises(PreconditionFailed):
        await subscriptions.put_subscription(
            db, CLI_ACTOR, t.namespace_id, "s", body, create_only=True
        )
    with pytest.raises(PreconditionFailed):
        await subscriptions.put_subscription(
            db, CLI_ACTOR, t.namespace_id, "s", SubscriptionPut(max_deliveries=3), if_match=7
        )
    row, _, changed = await subscriptions.put_subscription(
        db, CLI_ACTOR, t.namespace_id, "s", SubscriptionPut(max_deliveries=3), if_match=1
    )
    assert changed and row.revision == 2
    with pytest.raises(Conflict):
        await _put(db, t, start="latest")
    row, _, changed = await _put(db, t, start="earliest")  # same start: allowed, no change
    assert not changed


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ack_timeout_ms", 10),
        ("max_deliveries", 0),
        ("max_in_flight", 100_000),
        ("filter", {"states": ["RUNNING"]}),
        ("filter", {"queues": []}),
        ("filter", {"owner_id": "xyz"}),
        ("filter", {"queues": ["bad name"]}),
    ],
)
async def test_put_rejects_bad_fields(db: Database, field: str, value: object) -> None:
    t = await make_tenant(db)
    with pytest.raises(InvalidRequest) as err:
        await _put(db, t, **{field: value})
    assert err.value.field is not None and err.value.field.startswith(field)


async def test_start_positions(db: Database) -> None:
    t = await make_tenant(db)
    await append_results(db, t.namespace_id, 3)
    earliest, *_ = await _put(db, t, "e", start="earliest")
    latest, *_ = await _put(db, t, "l", start="latest")
    after, *_ = await _put(db, t, "a", start={"after_seq": 1})
    assert (earliest.after_seq, latest.after_seq, after.after_seq) == (0, 3, 1)
    await append_results(db, t.namespace_id, 2)
    for row, expect in ((earliest, [1, 2, 3, 4, 5]), (latest, [4, 5]), (after, [2, 3, 4, 5])):
        assert await _seqs(db, t, row.id) == expect
        assert (await subscriptions.get_subscription(db, t.namespace_id, row.name)).after_seq == 5
        assert [r.seq for r in await _rows(db, t, row.id)] == expect


# ----------------------------------------------------------------------------- hand-out


async def test_hand_out_applies_filter_and_advances_cursor(db: Database) -> None:
    t = await make_tenant(db)
    owner = new_id()
    row, *_ = await _put(
        db,
        t,
        start="earliest",
        filter={"queues": ["mail"], "states": ["FAILED", "SUCCEEDED"], "owner_id": id_hex(owner)},
    )
    await append_results(db, t.namespace_id, 2, queue="mail", owner_id=owner)  # 1,2 match
    await append_results(db, t.namespace_id, 1, queue="other", owner_id=owner)  # 3 queue
    await append_results(db, t.namespace_id, 1, queue="mail", owner_id=owner, state="CANCELLED")
    await append_results(db, t.namespace_id, 1, queue="mail")  # 5 other owner
    await append_results(db, t.namespace_id, 1, queue="mail", owner_id=owner, state="FAILED")
    sub, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    assert (backlog.pending, backlog.in_flight, backlog.unscanned_events) == (0, 0, 6)
    assert await _seqs(db, t, row.id) == [1, 2, 6]
    assert await _seqs(db, t, row.id) == []
    sub, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    assert (backlog.in_flight, backlog.unscanned_events, backlog.last_seq, sub.after_seq) == (
        3,
        0,
        6,
        6,
    )


async def test_hand_out_stops_the_cursor_at_the_first_event_left(db: Database) -> None:
    t = await make_tenant(db)
    row, *_ = await _put(db, t, start="earliest", filter={"kinds": ["a"]})
    await append_results(db, t.namespace_id, 3, kind="a")
    await append_results(db, t.namespace_id, 2, kind=None)
    await append_results(db, t.namespace_id, 2, kind="a")
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 2)
    assert [d.seq for d in batch.deliveries] == [1, 2] and batch.behind
    assert (await subscriptions.get_subscription(db, t.namespace_id, "s")).after_seq == 2
    assert await _seqs(db, t, row.id, 10) == [3, 6, 7]
    assert (await subscriptions.get_subscription(db, t.namespace_id, "s")).after_seq == 7


async def test_unique_key_is_last_line_of_defence(db: Database) -> None:
    """A second row for the same (subscription, seq) fails the transaction: a materialised
    slot can exist once."""
    t = await make_tenant(db)
    row, *_ = await _put(db, t, start="earliest")
    await append_results(db, t.namespace_id, 1)
    (d,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 1)).deliveries
    await deliveries.nack(db, t.namespace_id, d.delivery_id, d.proof, 0)  # now a row
    existing = (await _rows(db, t, row.id))[0]

    async def dup(tx: Tx) -> None:
        now = await clock_now(tx)
        await dstore.delivery_insert_many(
            tx,
            [
                {
                    "namespace_id": t.namespace_id,
                    "id": new_id(),
                    "subscription_id": row.id,
                    "seq": existing.seq,
                    "event_id": existing.event_id,
                    "state": "PENDING",
                    "proof_digest": None,
                    "attempts": 0,
                    "budget": 1,
                    "lease_expires_at": None,
                    "next_at": now,
                    "acked_at": None,
                    "revision": 1,
                    "created_at": now,
                    "updated_at": now,
                }
            ],
        )

    from orbit.storage import DuplicateKey

    with pytest.raises(DuplicateKey) as err:
        await db.transaction(dup)
    assert err.value.key == dstore.SUBSCRIPTION_SEQ_CONSTRAINT


# ----------------------------------------------------------------------------- lease, ack, nack


async def _ready(db: Database, t: SubTenant, n: int = 1, **put: object):
    row, *_ = await _put(db, t, start="earliest", **put)
    await append_results(db, t.namespace_id, n)
    return row


async def test_ack_is_idempotent_and_checks_the_proof(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t)
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 10)
    (d,) = batch.deliveries
    assert d.attempt == 1 and d.event.seq == 1 and len(d.proof) >= 24
    assert d.proof not in repr(d)  # the proof is never in a repr (logs)
    with pytest.raises(StaleProof):
        await deliveries.ack(db, t.namespace_id, d.delivery_id, "not-the-proof")
    first = await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof)
    again = await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof)
    assert (first.outcome, again.outcome) == ("applied", "replayed")
    assert first.delivery.acked_at == again.delivery.acked_at  # not re-stamped
    stored = await delivery_history.get_delivery(db, t.namespace_id, d.delivery_id)
    assert (stored.state, stored.attempts) == ("ACKED", 1)
    _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    assert (backlog.acked, backlog.pending, backlog.in_flight) == (1, 0, 0)
    with pytest.raises(NotFound):
        await deliveries.ack(db, t.namespace_id, new_id(), d.proof)
    other = await make_tenant(db)  # another namespace never sees it
    with pytest.raises(NotFound):
        await deliveries.ack(db, other.namespace_id, d.delivery_id, d.proof)


async def test_nack_redelivers_with_new_proof_same_id(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t)
    t0 = await db.now()
    (d1,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    info = await deliveries.nack(db, t.namespace_id, d1.delivery_id, d1.proof, 5_000, now=t0)
    assert info.state == "PENDING"
    # Idempotent: a repeat nack changes nothing.
    again = await deliveries.nack(db, t.namespace_id, d1.delivery_id, d1.proof, 0, now=t0)
    assert again == info
    assert not (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(4_999))
    ).deliveries
    (d2,) = (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(5_000))
    ).deliveries
    assert d2.delivery_id == d1.delivery_id and d2.proof != d1.proof and d2.attempt == 2
    with pytest.raises(StaleProof):  # the old proof is superseded
        await deliveries.ack(db, t.namespace_id, d1.delivery_id, d1.proof)
    await deliveries.ack(db, t.namespace_id, d2.delivery_id, d2.proof)
    with pytest.raises(Conflict):
        await deliveries.nack(db, t.namespace_id, d2.delivery_id, d2.proof)


async def test_lease_expiry_redelivers_after_backoff(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, ack_timeout_ms=1_000)
    t0 = await db.now()
    (d1,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    assert d1.lease_expires_at == t0 + ms(1_000)
    # Before expiry: nothing due, and the loop's sweep reclaims nothing.
    assert await delivery_pump.reclaim_subscription(
        db, t.namespace_id, row.id, now=t0 + ms(999)
    ) == (
        0,
        0,
    )
    # Expired at t0+1s; backoff after attempt 1 is 1 s counted from the lease end.
    assert await delivery_pump.reclaim_subscription(
        db, t.namespace_id, row.id, now=t0 + ms(1_500)
    ) == (1, 0)
    stored = await delivery_history.get_delivery(db, t.namespace_id, d1.delivery_id)
    assert (stored.state, stored.next_at) == ("PENDING", t0 + ms(2_000))
    assert not (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(1_999))
    ).deliveries
    (d2,) = (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(2_000))
    ).deliveries
    assert d2.attempt == 2
    # Second expiry: backoff doubles (2 s after the lease end at t0+3s).
    (await delivery_pump.lease(db, t.namespace_id, row.id, 0, now=t0 + ms(3_000)))
    stored = await delivery_history.get_delivery(db, t.namespace_id, d1.delivery_id)
    assert (stored.state, stored.next_at) == ("PENDING", t0 + ms(5_000))


async def test_late_ack_counts_until_the_next_hand_out(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, ack_timeout_ms=1_000)
    t0 = await db.now()
    (d1,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    await delivery_pump.reclaim_subscription(db, t.namespace_id, row.id, now=t0 + ms(1_500))
    res = await deliveries.ack(db, t.namespace_id, d1.delivery_id, d1.proof, now=t0 + ms(1_600))
    assert res.outcome == "applied"
    assert not (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(10_000))
    ).deliveries


async def test_exhausted_then_budget_then_delivered(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, max_deliveries=2)
    t0 = await db.now()
    (d1,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    await deliveries.nack(db, t.namespace_id, d1.delivery_id, d1.proof, 0, now=t0)
    (d2,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    info = await deliveries.nack(db, t.namespace_id, d2.delivery_id, d2.proof, 0, now=t0)
    assert (info.state, info.attempts, info.budget) == ("EXHAUSTED", 2, 2)
    assert not (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(60_000))
    ).deliveries
    page = await delivery_history.list_history(
        db, t.namespace_id, row.id, state="EXHAUSTED", after_seq=0, limit=10
    )
    assert [r.id for r in page] == [d1.delivery_id]
    with pytest.raises(InvalidRequest):
        await delivery_history.add_budget(db, t.namespace_id, d1.delivery_id, 0)
    revived = await delivery_history.add_budget(
        db, t.namespace_id, d1.delivery_id, 1, now=t0, actor=CLI_ACTOR
    )
    assert (revived.state, revived.attempts, revived.budget) == ("PENDING", 2, 3)
    (d3,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    assert d3.delivery_id == d1.delivery_id and d3.attempt == 3  # the counter continues
    assert (await deliveries.ack(db, t.namespace_id, d3.delivery_id, d3.proof)).outcome == "applied"


async def test_lease_expiry_exhausts_when_budget_spent(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, max_deliveries=1, ack_timeout_ms=1_000)
    t0 = await db.now()
    (d1,) = (await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)).deliveries
    assert await delivery_pump.reclaim_subscription(
        db, t.namespace_id, row.id, now=t0 + ms(1_000)
    ) == (0, 1)
    stored = await delivery_history.get_delivery(db, t.namespace_id, d1.delivery_id)
    assert stored.state == "EXHAUSTED"


async def test_max_in_flight_caps_the_whole_subscription(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, 10, max_in_flight=3)
    a = await delivery_pump.lease(db, t.namespace_id, row.id, 2)
    b = await delivery_pump.lease(db, t.namespace_id, row.id, 5)  # another consumer
    assert (len(a.deliveries), len(b.deliveries), b.in_flight) == (2, 1, 3)
    assert not (await delivery_pump.lease(db, t.namespace_id, row.id, 5)).deliveries
    d = a.deliveries[0]
    await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof)
    c = await delivery_pump.lease(db, t.namespace_id, row.id, 5)
    assert len(c.deliveries) == 1
    seqs = [x.seq for x in (*a.deliveries, *b.deliveries, *c.deliveries)]
    assert seqs == [1, 2, 3, 4]  # handed out in sequence order


async def test_release_gives_deliveries_back_at_once(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, 2)
    t0 = await db.now()
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0)
    held = [(d.delivery_id, d.proof) for d in batch.deliveries]
    await deliveries.ack(db, t.namespace_id, *held[0])
    moved = await deliveries.release_many(
        db, t.namespace_id, [*held, (new_id(), "x")], now=t0 + ms(10)
    )
    assert moved == 1  # the acked one and the unknown one are left alone
    (again,) = (
        await delivery_pump.lease(db, t.namespace_id, row.id, 10, now=t0 + ms(10))
    ).deliveries
    assert again.delivery_id == held[1][0] and again.attempt == 2


async def test_history_pages_with_cursor_positions(db: Database) -> None:
    t = await make_tenant(db)
    row = await _ready(db, t, 5)
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 2)  # a range of two
    await deliveries.ack(db, t.namespace_id, batch.deliveries[0].delivery_id,
                         batch.deliveries[0].proof)  # fmt: skip
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 3)  # a range of three
    await deliveries.nack(db, t.namespace_id, batch.deliveries[2].delivery_id,
                          batch.deliveries[2].proof, 60_000)  # fmt: skip
    page1 = await delivery_history.list_history(
        db, t.namespace_id, row.id, state=None, after_seq=0, limit=2
    )
    page2 = await delivery_history.list_history(
        db, t.namespace_id, row.id, state=None, after_seq=page1[-1].seq, limit=2
    )
    page3 = await delivery_history.list_history(
        db, t.namespace_id, row.id, state="PENDING", after_seq=page2[-1].seq, limit=2
    )
    assert [r.seq for r in (*page1, *page2, *page3)] == [1, 2, 3, 4, 5]
    assert [r.state for r in (*page1, *page2)] == ["ACKED", "LEASED", "LEASED", "LEASED"]
    assert [r.state for r in page3] == ["PENDING"]  # the nacked slot is a row now
    for state, expect in (("ACKED", [1]), ("LEASED", [2, 3, 4]), ("PENDING", [5])):
        page = await delivery_history.list_history(
            db, t.namespace_id, row.id, state=state, after_seq=0, limit=10
        )
        assert [r.seq for r in page] == expect, state
    with pytest.raises(InvalidRequest):
        await delivery_history.list_history(
            db, t.namespace_id, row.id, state="NOPE", after_seq=0, limit=2
        )


def test_backoff_schedule() -> None:
    assert [deliveries.backoff_ms(n) for n in (1, 2, 3, 7, 8, 50)] == [
        1_000, 2_000, 4_000, 60_000, 60_000, 60_000,
    ]  # fmt: skip
    t = datetime(2026, 1, 1)
    assert deliveries.after_failure(3, 3, t, 500) == (deliveries.DeliveryState.EXHAUSTED, t)
    assert deliveries.after_failure(2, 3, t, 500) == (deliveries.DeliveryState.PENDING, t + ms(500))


def test_filter_struct_roundtrip() -> None:
    spec = subscriptions.validate_filter(SubscriptionFilter(states=["FAILED", "FAILED"]))
    assert msgspec.json.encode(spec) == b'{"states":["FAILED"]}'
    assert msgspec.convert({"after_seq": 3}, StartAfterSeq).after_seq == 3


async def test_delivery_loop_run_once_wakes_and_sweeps(db: Database) -> None:
    from orbit.delivery_loop import DeliveryHub, DeliveryLoop
    from orbit.metrics import Registry

    t = await make_tenant(db)
    row, *_ = await _put(db, t, start="earliest", ack_timeout_ms=1_000, max_deliveries=2)
    await append_results(db, t.namespace_id, 3)
    hub = DeliveryHub()
    woken = hub.watch(t.namespace_id, row.id)
    registry = Registry()
    loop = DeliveryLoop(db, hub=hub, metrics=registry, sweep_interval_s=0.0,
                        sweep_per_round=100_000)  # fmt: skip
    t0 = await db.now()
    first = await loop.run_once(now=t0)
    assert first.behind >= 1 and woken.is_set()  # woken; nothing written ahead of a hand-out
    assert (await subscriptions.get_subscription(db, t.namespace_id, "s")).after_seq == 0
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 2, now=t0)
    assert len(batch.deliveries) == 2
    # Leases end at t0+1s: the sweep reclaims them (redelivered), budget 2 not yet spent.
    swept = await loop.run_once(now=t0 + ms(1_000))
    assert swept.redelivered >= 2
    again = await delivery_pump.lease(db, t.namespace_id, row.id, 3, now=t0 + ms(2_000))
    assert {d.attempt for d in again.deliveries} == {1, 2}
    final = await loop.run_once(now=t0 + ms(3_000))  # second expiry spends the budget of two
    assert final.exhausted >= 2
    # The gauge is refreshed in the background (a page of subscriptions per round), never on
    # a scrape: one whole pass over the subscriptions.
    from orbit import delivery_gauges

    await delivery_gauges.install(registry, db).refresh_pass()
    text = await registry.render_async()
    assert 'orbit_deliveries{state="EXHAUSTED"}' in text


async def test_pulse_result_events_reach_a_subscription(db: Database) -> None:
    """Contract with Pulse: a real task state change (cancel of a waiting task) writes the
    result event that the pump turns into a delivery, with the API's event fields."""
    from pulse_fixtures import make_tenant as make_pulse_tenant

    from pulse.tasks import cancel_task

    pt = await make_pulse_tenant(db)
    t = SubTenant(pt.application_id, pt.namespace, pt.namespace_id, pt.key)
    row, *_ = await _put(db, t, start="latest", filter={"states": ["CANCELLED"]})
    task = await pt.submit(kind="mail", payload={"to": "x"})
    await cancel_task(db, pt.namespace_id, task["id"])
    (d,) = (await delivery_pump.lease(db, pt.namespace_id, row.id, 10)).deliveries
    event = msgspec.json.decode(deliveries.event_json(d.event))
    assert event["type"] == "task.cancelled" and event["state"] == "CANCELLED"
    assert event["task_id"] == task["id"] and event["kind"] == "mail"
    assert event["owner_id"] == id_hex(pt.application_id) and event["queue"] == pt.queue
    assert set(event) == {
        "seq", "event_id", "type", "created_at", "task_id", "queue", "kind", "owner_id",
        "state", "result", "error", "attempts", "finished_at",
    }  # fmt: skip


async def test_hand_out_writes_one_range_row_and_no_delivery_row(db: Database) -> None:
    """A hand-out of 25 first-time deliveries is ONE inserted row (the range) and nothing
    per delivery; acking all of them is ONE updated row."""
    t = await make_tenant(db)
    row, *_ = await _put(db, t, start="earliest")
    await append_results(db, t.namespace_id, 25)

    async def status(tx: Tx) -> dict[str, int]:
        rows = await tx.fetchall("SHOW SESSION STATUS LIKE 'Handler_%'")
        return {r["Variable_name"]: int(r["Value"]) for r in rows}

    async def hand_out(tx: Tx) -> tuple[int, dict[str, int]]:
        before = await status(tx)
        sub = await sub_store.subscription_lock(tx, t.namespace_id, row.id)
        assert sub is not None
        out, *_ = await delivery_pump.hand_out_locked(
            tx, sub, 100, await clock_now(tx)
        )
        after = await status(tx)
        return len(out), {k: after[k] - before[k] for k in ("Handler_write", "Handler_update")}

    created, counts = await db.transaction(hand_out)
    # one range row inserted; the subscription cursor updated
    assert (created, counts["Handler_write"], counts["Handler_update"]) == (25, 1, 1)
    _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    assert backlog.in_flight == 25

    async def count(tx: Tx) -> int:
        n = await tx.fetchval(
            "SELECT COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s", (t.namespace_id,)
        )
        return int(n)

    assert await db.read(count) == 0


async def test_earliest_on_a_big_namespace_materialises_nothing(db: Database) -> None:
    """60 subscriptions created from "earliest" on a namespace with 2,000 result events
    write no delivery row and no range: storage grows with what is handed out."""
    t = await make_tenant(db)
    for _ in range(4):
        await append_results(db, t.namespace_id, 500)
    subs = [(await _put(db, t, f"s{i}", start="earliest"))[0] for i in range(60)]
    from orbit.delivery_loop import DeliveryHub, DeliveryLoop

    hub = DeliveryHub()
    hub.watch(t.namespace_id, subs[0].id)
    await DeliveryLoop(db, hub=hub, sweep_interval_s=0.0).run_once()

    async def counts(tx: Tx) -> tuple[int, int]:
        rows = await tx.fetchval(
            "SELECT COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s", (t.namespace_id,)
        )
        ranges = await tx.fetchval(
            "SELECT COUNT(*) FROM orbit_delivery_ranges WHERE namespace_id = %s",
            (t.namespace_id,),
        )
        return int(rows), int(ranges)

    assert await db.read(counts) == (0, 0)
    _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s7")
    assert (backlog.pending, backlog.in_flight, backlog.unscanned_events) == (0, 0, 2_000)
    # consuming one subscription writes ranges for it alone, as many as its hand-outs
    got = await _seqs(db, t, subs[7].id, 100)
    assert got == list(range(1, 101))
    assert await db.read(counts) == (0, 1)


async def test_rows_from_before_ranges_are_served_as_exceptions(db: Database) -> None:
    """Deliveries written one row per event (before delivery ranges) keep working: a LEASED
    row is acked with its plain proof, a PENDING row is handed out before new events, and
    the events after the cursor come as a range."""
    from orbit.ids import digest, new_secret

    t = await make_tenant(db)
    row, *_ = await _put(db, t, start="earliest")
    events = await append_results(db, t.namespace_id, 2)
    await append_results(db, t.namespace_id, 2)  # seq 3, 4: after the old pump position
    old_proof = new_secret(24)

    async def legacy(tx: Tx) -> None:
        now = await clock_now(tx)
        base = {"namespace_id": t.namespace_id, "subscription_id": row.id, "budget": 5,
                "acked_at": None, "revision": 1, "created_at": now, "updated_at": now}  # fmt: skip
        await dstore.delivery_insert_many(tx, [
            {**base, "id": new_id(), "seq": events[0], "event_id": new_id(), "state": "LEASED",
             "proof_digest": digest(old_proof), "attempts": 1, "lease_expires_at": now + ms(60_000),
             "next_at": now + ms(60_000)},
            {**base, "id": new_id(), "seq": events[1], "event_id": new_id(), "state": "PENDING",
             "proof_digest": None, "attempts": 0, "lease_expires_at": None, "next_at": now},
        ])  # fmt: skip
        assert await sub_store.subscription_advance_if_position(tx, t.namespace_id, row.id, 0, 2)

    await db.transaction(legacy)
    (leased,) = await delivery_history.list_history(
        db, t.namespace_id, row.id, state="LEASED", after_seq=0, limit=10
    )
    batch = await delivery_pump.lease(db, t.namespace_id, row.id, 10)
    assert [d.seq for d in batch.deliveries] == [2, 3, 4]  # the old PENDING one first
    assert [d.attempt for d in batch.deliveries] == [1, 1, 1]
    assert not batch.deliveries[0].proof.startswith("d1.")  # a row: a plain proof
    assert all(d.proof.startswith("d1.") for d in batch.deliveries[1:])  # a range
    done = await deliveries.ack(db, t.namespace_id, leased.id, old_proof)
    assert done.outcome == "applied"
    outcomes = await deliveries.ack_many(
        db, t.namespace_id, [(d.delivery_id, d.proof) for d in batch.deliveries]
    )
    assert outcomes == ["applied"] * 3
    _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    assert (backlog.acked, backlog.in_flight, backlog.pending) == (4, 0, 0)
