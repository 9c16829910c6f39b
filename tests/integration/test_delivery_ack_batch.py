"""The subscriber leg at scale (the bench's S4 shape): group-committed acks judge every item alone,
and the per-hand-out queries read one subscription's index range — never every delivery of
the namespace (whose ACKED history only grows). Real MariaDB, EXPLAIN on the real queries."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from subscription_fixtures import SubTenant, append_results, make_tenant

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.deliveries import StaleProof
from orbit.errors import NotFound
from orbit.ids import new_id
from orbit.storage import Database, Tx
from orbit.store import deliveries as dstore
from orbit.store import subscriptions as sub_store
from orbit.subscriptions import SubscriptionPut


async def _sub(db: Database, t: SubTenant, name: str, **kw: object):
    body = msgspec.convert({"start": "earliest", **kw}, SubscriptionPut)
    row, *_ = await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, name, body)
    return row


async def test_ack_many_judges_each_item_alone_in_one_transaction(db: Database) -> None:
    t = await make_tenant(db)
    sub = await _sub(db, t, "s", max_in_flight=10)
    await append_results(db, t.namespace_id, 4)
    d0, d1, d2, d3 = (await delivery_pump.lease(db, t.namespace_id, sub.id, 10)).deliveries
    out = await deliveries.ack_many(
        db,
        t.namespace_id,
        [
            (d0.delivery_id, d0.proof),
            (d1.delivery_id, "not-the-proof"),
            (new_id(), d2.proof),
            (d0.delivery_id, d0.proof),  # the same delivery twice in one batch
            (d2.delivery_id, d2.proof),
        ],
    )
    assert out[0] == "applied" and out[3] == "replayed" and out[4] == "applied"
    assert isinstance(out[1], StaleProof) and isinstance(out[2], NotFound)
    states = {
        d.delivery_id: (
            await delivery_history.get_delivery(db, t.namespace_id, d.delivery_id)
        ).state
        for d in (d0, d1, d2, d3)
    }
    assert [states[d.delivery_id] for d in (d0, d1, d2, d3)] == [
        "ACKED",
        "LEASED",
        "ACKED",
        "LEASED",
    ]
    stored = await delivery_history.get_delivery(db, t.namespace_id, d0.delivery_id)
    assert (stored.state, stored.attempts) == ("ACKED", 1)  # leased once, acked once
    # A replay of the whole batch changes nothing; the same ack through ack() agrees.
    again = await deliveries.ack_many(db, t.namespace_id, [(d0.delivery_id, d0.proof)])
    assert again == ["replayed"]
    single = await deliveries.ack(db, t.namespace_id, d2.delivery_id, d2.proof)
    assert single.outcome == "replayed"
    other = await make_tenant(db)  # another namespace never sees them
    (hidden,) = await deliveries.ack_many(db, other.namespace_id, [(d3.delivery_id, d3.proof)])
    assert isinstance(hidden, NotFound)
    _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    assert (backlog.acked, backlog.in_flight) == (2, 2)
    assert await deliveries.ack_many(db, t.namespace_id, []) == []


async def _history(db: Database, t: SubTenant, sub_id: bytes, n: int, state: str) -> None:
    """``n`` deliveries of ``sub_id`` in ``state`` (ACKED: the history a busy subscription
    leaves; LEASED: a consumer with many in flight, leases ending in an hour)."""
    now = datetime.now(UTC).replace(tzinfo=None)
    later = now + timedelta(hours=1)
    leased = state == "LEASED"

    async def run(tx: Tx) -> None:
        await dstore.delivery_insert_many(
            tx,
            [
                {
                    "namespace_id": t.namespace_id,
                    "id": new_id(),
                    "subscription_id": sub_id,
                    "seq": 1 + i + (0 if leased else 1_000_000),
                    "event_id": new_id(),
                    "state": state,
                    "proof_digest": bytes(32),
                    "attempts": 1,
                    "budget": 10,
                    "lease_expires_at": later if leased else None,
                    "next_at": later if leased else now,
                    "acked_at": None if leased else now,
                    "revision": 3,
                    "created_at": now,
                    "updated_at": now,
                }
                for i in range(n)
            ],
        )

    await db.transaction(run)


async def _explain(db: Database, sql: str, args: dict[str, object]) -> list[dict[str, object]]:
    async def run(tx: Tx) -> list[dict[str, object]]:
        return list(await tx.fetchall("EXPLAIN " + sql, args))

    return await db.read(run)


async def test_hand_out_counts_read_one_subscription_range_not_the_namespace(
    db: Database,
) -> None:
    """A consumer with thousands in flight and a long ACKED history (what S4's 1M-backlog
    run had): the LEASED count is index-only on ix_orbit_deliveries_due. Without the index
    hint MariaDB reads the primary key's namespace prefix here — every delivery of the
    namespace, history included — on every hand-out."""
    t = await make_tenant(db)
    busy = await _sub(db, t, "busy")
    await _history(db, t, busy.id, 3000, "ACKED")
    await _history(db, t, busy.id, 2500, "LEASED")
    now = datetime.now(UTC).replace(tzinfo=None)
    args = {"namespace_id": t.namespace_id, "subscription_id": busy.id, "now": now}
    for name in ("delivery_count_leased", "delivery_expired_exists"):
        (plan,) = await _explain(db, getattr(dstore.Q, name), args)
        assert plan["key"] == "ix_orbit_deliveries_due", (name, plan)
        assert "Using index" in str(plan["Extra"]), (name, plan)  # index-only: no row reads
    # A hand-out's in-flight count (rows and range slots in one statement): each part
    # index-only on its own index.
    parts = {str(p["table"]): p for p in await _explain(db, dstore.Q.delivery_in_flight, args)}
    for table, index in (
        ("orbit_deliveries", "ix_orbit_deliveries_due"),
        ("orbit_delivery_ranges", "ix_orbit_delivery_ranges_open"),
    ):
        assert parts[table]["key"] == index, parts
    assert "Using index" in str(parts["orbit_deliveries"]["Extra"]), parts
    # The ack round's locking read, two namespaces in one statement: primary-key ranges.
    keys = [(t.namespace_id, new_id()) for _ in range(3)] + [(new_id(), new_id())]
    sql, where_args = dstore.expand_keys(dstore.Q.delivery_lock_keys, keys)

    async def plan_of(tx: Tx) -> list[dict[str, object]]:
        return list(await tx.fetchall("EXPLAIN " + sql, where_args))

    (plan,) = await db.read(plan_of)
    assert plan["key"] == "PRIMARY" and int(plan["rows"]) <= 4, plan
    # and the figures are the subscription's own
    leased = await db.read(lambda tx: dstore.delivery_count_leased(tx, t.namespace_id, busy.id))
    assert leased == 2500
    in_flight = await db.read(lambda tx: dstore.delivery_in_flight(tx, t.namespace_id, busy.id))
    assert in_flight == 2500  # no range open
    expired = await db.read(
        lambda tx: dstore.delivery_expired_exists(tx, t.namespace_id, busy.id, now)
    )
    assert not expired


async def _lease_while_locked(db: Database, t: SubTenant, sub_id: bytes, want: int):
    """``lease`` while another transaction holds the subscription row: returns its result
    when it did not need the lock, None when it waited for it (timed out)."""
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold(tx: Tx) -> None:
        await sub_store.subscription_lock(tx, t.namespace_id, sub_id)
        locked.set()
        await release.wait()

    holder = asyncio.create_task(db.transaction(hold))
    await locked.wait()
    try:
        return await asyncio.wait_for(delivery_pump.lease(db, t.namespace_id, sub_id, want), 1.0)
    except TimeoutError:
        return None
    finally:
        release.set()
        await holder


async def test_lease_locks_the_subscription_only_when_there_is_work(db: Database) -> None:
    t = await make_tenant(db)
    sub = await _sub(db, t, "s", max_in_flight=2)
    idle = await _lease_while_locked(db, t, sub.id, 10)  # nothing yet: no lock needed
    assert idle is not None and idle.deliveries == [] and idle.in_flight == 0
    assert idle.subscription.max_in_flight == 2
    await append_results(db, t.namespace_id, 3)
    assert await _lease_while_locked(db, t, sub.id, 10) is None  # behind the stream: locks
    got = await delivery_pump.lease(db, t.namespace_id, sub.id, 10)
    assert [d.seq for d in got.deliveries] == [1, 2] and got.in_flight == 2
    full = await _lease_while_locked(db, t, sub.id, 10)  # one due, but max_in_flight reached
    assert full is not None and full.deliveries == [] and full.in_flight == 2
    await deliveries.ack(db, t.namespace_id, got.deliveries[0].delivery_id, got.deliveries[0].proof)
    assert await _lease_while_locked(db, t, sub.id, 10) is None  # due and room: locks
    (third,) = (await delivery_pump.lease(db, t.namespace_id, sub.id, 10)).deliveries
    assert third.seq == 3
    seen = await db.read(lambda tx: dstore.delivery_lease_probe(tx, t.namespace_id, sub.id))
    assert seen is not None
    row, probe = seen
    assert (row.after_seq, probe.last_seq, probe.due, probe.expired, probe.in_flight) == (
        3,
        3,
        False,
        False,
        2,
    )
    with pytest.raises(NotFound):
        await delivery_pump.lease(db, t.namespace_id, new_id(), 10)


async def test_lease_probe_sees_an_expired_lease(db: Database) -> None:
    t = await make_tenant(db)
    sub = await _sub(db, t, "s", ack_timeout_ms=100)
    await append_results(db, t.namespace_id, 1)
    (d,) = (await delivery_pump.lease(db, t.namespace_id, sub.id, 10)).deliveries
    await asyncio.sleep(0.3)
    seen = await db.read(lambda tx: dstore.delivery_lease_probe(tx, t.namespace_id, sub.id))
    assert seen is not None and seen[1].expired and seen[1].in_flight == 1
    assert await _lease_while_locked(db, t, sub.id, 10) is None  # a lease to reclaim: locks
    await delivery_pump.lease(db, t.namespace_id, sub.id, 10)
    back = await delivery_history.get_delivery(db, t.namespace_id, d.delivery_id)
    assert back.state in ("PENDING", "LEASED") and back.attempts >= 1
