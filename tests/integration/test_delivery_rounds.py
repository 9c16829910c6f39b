"""Node rounds of the subscriber leg: the acks of every namespace, subscription and
connection of a process go into one transaction with ONE guarded multi-row UPDATE; a
hand-out leases its deliveries with ONE guarded UPDATE; the first item after a quiet spell
goes alone. Real MariaDB; statements counted from the storage layer's statement log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import msgspec
import pytest
from subscription_fixtures import SubTenant, append_results, make_tenant

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.deliveries import AckItem, AckResult, StaleProof
from orbit.errors import NotFound
from orbit.ids import new_id
from orbit.rounds import NodeRound
from orbit.storage import Database, Tx
from orbit.storage import db as storage_db
from orbit.store import clock
from orbit.subscriptions import SubscriptionPut


class _Recorder(list[str]):
    """Every statement run while installed (and forwarded to the log it replaced)."""

    def __init__(self, inner: list[str] | None) -> None:
        super().__init__()
        self.inner = inner

    def append(self, sql: str) -> None:
        super().append(sql)
        if self.inner is not None:
            self.inner.append(sql)


@contextlib.contextmanager
def recorded() -> Iterator[_Recorder]:
    rec = _Recorder(storage_db.STATEMENT_LOG)
    storage_db.STATEMENT_LOG = rec
    try:
        yield rec
    finally:
        storage_db.STATEMENT_LOG = rec.inner


def _updates(rec: list[str]) -> list[str]:
    return [s for s in rec if s.lstrip("-\n ").upper().startswith("UPDATE") or "\nUPDATE " in s]


async def _sub(db: Database, t: SubTenant, name: str = "s", **kw: object):
    body = msgspec.convert({"start": "earliest", **kw}, SubscriptionPut)
    row, *_ = await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, name, body)
    return row


async def test_ack_round_spans_namespaces_with_one_update(db: Database) -> None:
    a, b = await make_tenant(db), await make_tenant(db)
    sa, sb = await _sub(db, a), await _sub(db, b)
    sb2 = await _sub(db, b, "second")
    await append_results(db, a.namespace_id, 3)
    await append_results(db, b.namespace_id, 2)
    da = (await delivery_pump.lease(db, a.namespace_id, sa.id, 10)).deliveries
    db_ = (await delivery_pump.lease(db, b.namespace_id, sb.id, 10)).deliveries
    db2 = (await delivery_pump.lease(db, b.namespace_id, sb2.id, 10)).deliveries
    assert (len(da), len(db_), len(db2)) == (3, 2, 2)
    items = [AckItem(a.namespace_id, d.delivery_id, d.proof) for d in da]
    items += [AckItem(b.namespace_id, d.delivery_id, d.proof) for d in db_ + db2]
    items.append(AckItem(b.namespace_id, da[0].delivery_id, da[0].proof))  # other namespace
    items.append(AckItem(a.namespace_id, da[1].delivery_id, "not-the-proof"))
    items.append(AckItem(a.namespace_id, da[2].delivery_id, da[2].proof))  # twice: replayed
    with recorded() as rec:
        out = await deliveries.ack_round(db, items)
    applied = [o for o in out[:7] if isinstance(o, AckResult)]
    assert [o.outcome for o in applied] == ["applied"] * 7
    assert isinstance(out[7], NotFound) and isinstance(out[8], StaleProof)
    assert isinstance(out[9], AckResult) and out[9].outcome == "replayed"
    assert out[9].delivery == out[2].delivery  # the answer of the write is the stored row
    ups = [s for s in _updates(rec) if "orbit_delivery_ranges" in s]
    assert len(ups) == 1, ups  # ONE multi-row UPDATE for the whole round (three ranges)
    assert not [s for s in _updates(rec) if "orbit_deliveries" in s]  # no per-delivery row
    assert clock.Q.clock_now not in rec  # the clock came with the ranges' lock
    for t, d in [(a, da[0]), (b, db_[1]), (b, db2[0])]:
        stored = await delivery_history.get_delivery(db, t.namespace_id, d.delivery_id)
        assert (stored.state, stored.attempts) == ("ACKED", 1)
    again = await deliveries.ack(db, a.namespace_id, da[0].delivery_id, da[0].proof)
    assert again.outcome == "replayed" and again.delivery == out[0].delivery


async def test_redeliveries_lease_with_one_update(db: Database) -> None:
    t = await make_tenant(db)
    sub = await _sub(db, t)
    await append_results(db, t.namespace_id, 7)
    first = (await delivery_pump.lease(db, t.namespace_id, sub.id, 10)).deliveries
    assert (
        await deliveries.release_many(db, t.namespace_id, [(d.delivery_id, d.proof) for d in first])
        == 7
    )  # materialised as rows, due at once
    with recorded() as rec:
        batch = await delivery_pump.lease(db, t.namespace_id, sub.id, 10)
    assert len(batch.deliveries) == 7 and len({d.proof for d in batch.deliveries}) == 7
    assert {d.delivery_id for d in batch.deliveries} == {d.delivery_id for d in first}
    assert all(d.attempt == 2 for d in batch.deliveries)
    leases = [s for s in _updates(rec) if "SET state = 'LEASED'" in s]
    assert len(leases) == 1, leases
    for d in batch.deliveries:  # each its own proof: the others' do not ack it
        other = next(x for x in batch.deliveries if x is not d)
        bad = await deliveries.ack_round(db, [AckItem(t.namespace_id, d.delivery_id, other.proof)])
        assert isinstance(bad[0], StaleProof)
    outcomes = await deliveries.ack_many(
        db, t.namespace_id, [(d.delivery_id, d.proof) for d in batch.deliveries]
    )
    assert outcomes == ["applied"] * 7


async def test_node_round_first_alone_then_everything_that_arrived() -> None:
    gate = asyncio.Event()
    seen: list[list[int]] = []

    async def apply(items: list[int]) -> list[int | BaseException]:
        seen.append(list(items))
        if len(seen) == 1:
            await gate.wait()
        return [ValueError(i) if i < 0 else i * 10 for i in items]

    rnd: NodeRound[int, int] = NodeRound(apply, max_items=4, name="test")
    first = asyncio.create_task(rnd.submit(1))
    for _ in range(3):
        await asyncio.sleep(0)
    assert seen == [[1]]  # the first item after a quiet spell goes at once, alone
    rest = asyncio.create_task(rnd.submit_many([2, -3, 4, 5, 6]))
    await asyncio.sleep(0)
    gate.set()
    assert await first == 10
    out = await rest
    assert out[0] == 20 and isinstance(out[1], ValueError) and out[2:] == [40, 50, 60]
    assert seen == [[1], [2, -3, 4, 5], [6]]  # everything that waited, up to max_items
    assert (rnd.stats.rounds, rnd.stats.items, rnd.stats.largest) == (3, 6, 4)


async def test_node_round_isolates_a_failing_round() -> None:
    async def apply(items: list[int]) -> list[int | BaseException]:
        if 13 in items and len(items) > 1:
            raise RuntimeError("poisoned round")
        if items == [13]:
            raise RuntimeError("poisoned item")
        return list(items)

    rnd: NodeRound[int, int] = NodeRound(apply, name="test")
    blocker = asyncio.create_task(rnd.submit(0))
    out = await rnd.submit_many([1, 13, 2])
    assert await blocker == 0
    assert out[0] == 1 and isinstance(out[1], RuntimeError) and out[2] == 2
    assert rnd.stats.isolated == 1


async def test_open_delivery_counts_see_slots_and_events_not_handed_out(db: Database) -> None:
    """The orbit_deliveries gauge's per-subscription count: LEASED includes the open slots of
    ranges, PENDING the given-back rows plus the events after the hand-out cursor."""
    from orbit.store import delivery_counts

    t = await make_tenant(db)
    sub = await _sub(db, t, max_in_flight=4)
    await append_results(db, t.namespace_id, 10)

    async def counts() -> dict[str, int]:
        return await db.read(
            lambda tx: delivery_counts.delivery_count_open_capped(tx, t.namespace_id, sub.id, 100)
        )

    assert await counts() == {"PENDING": 10, "LEASED": 0, "EXHAUSTED": 0}
    batch = (await delivery_pump.lease(db, t.namespace_id, sub.id, 10)).deliveries
    assert len(batch) == 4
    assert await counts() == {"PENDING": 6, "LEASED": 4, "EXHAUSTED": 0}
    await deliveries.nack(db, t.namespace_id, batch[0].delivery_id, batch[0].proof, 60_000)
    await deliveries.ack(db, t.namespace_id, batch[1].delivery_id, batch[1].proof)
    assert await counts() == {"PENDING": 7, "LEASED": 2, "EXHAUSTED": 0}


async def test_wake_round_is_one_read_whatever_the_streams(db: Database) -> None:
    """The delivery loop wakes consumers of namespaces whose result stream moved: no
    statement without consumers, ONE primary-key read with 40 of them, and only the
    namespaces with new events are woken."""
    from orbit.delivery_loop import DeliveryHub, DeliveryLoop

    tenants = [await make_tenant(db) for _ in range(4)]
    hub = DeliveryHub()
    loop = DeliveryLoop(db, hub=hub, sweep_interval_s=3600.0)
    loop._last_sweep = float("inf")  # this test is about the wake round only
    with recorded() as rec:
        await loop.run_once()
    assert list(rec) == []  # nobody watches: nothing is read
    watchers = {}
    for t in tenants:
        for i in range(10):
            watchers[(t.namespace_id, i)] = hub.watch(t.namespace_id, new_id())
    with recorded() as rec:
        first = await loop.run_once()
    assert len(rec) == 1 and first.behind == 4  # first sight of each namespace: wake all
    for ev in watchers.values():
        ev.clear()
    await append_results(db, tenants[2].namespace_id, 3)
    with recorded() as rec:
        rnd = await loop.run_once()
    assert len(rec) == 1 and rnd.behind == 1
    woken = {ns for (ns, _), ev in watchers.items() if ev.is_set()}
    assert woken == {tenants[2].namespace_id}
    with recorded() as rec:
        quiet = await loop.run_once()
    assert len(rec) == 1 and quiet.behind == 0


async def test_wake_round_between_full_reads_reads_only_moved_streams(db: Database) -> None:
    """Between full reads the wake round asks only for the streams that moved lately (a
    quiet node decodes no rows) and still wakes a namespace with new events; a stream
    stamped with an old clock, which that read cannot see, is woken by the next full read."""
    from orbit.delivery_loop import DeliveryHub, DeliveryLoop

    tenants = [await make_tenant(db) for _ in range(3)]
    hub = DeliveryHub()
    loop = DeliveryLoop(db, hub=hub, sweep_interval_s=3600.0, full_read_s=3600.0)
    loop._last_sweep = float("inf")
    watchers = {t.namespace_id: hub.watch(t.namespace_id, new_id()) for t in tenants}
    first = await loop.run_once()  # a namespace seen for the first time: a full read
    assert first.behind == 3
    for ev in watchers.values():
        ev.clear()
    with recorded() as rec:
        quiet = await loop.run_once()
    assert len(rec) == 1 and "updated_at >=" in rec[0] and quiet.behind == 0
    await append_results(db, tenants[1].namespace_id, 2)
    with recorded() as rec:
        moved = await loop.run_once()
    assert len(rec) == 1 and "updated_at >=" in rec[0] and moved.behind == 1
    assert {ns for ns, ev in watchers.items() if ev.is_set()} == {tenants[1].namespace_id}
    watchers[tenants[1].namespace_id].clear()
    await append_results(db, tenants[0].namespace_id, 1)
    await db.transaction(
        lambda tx: tx.execute(
            "UPDATE orbit_event_streams SET updated_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR"
            " WHERE namespace_id = %s",
            (tenants[0].namespace_id,),
        )
    )
    assert (await loop.run_once()).behind == 0  # stamped an hour ago: not in the window
    loop._last_full = float("-inf")  # the next full read is due
    with recorded() as rec:
        full = await loop.run_once()
    assert len(rec) == 1 and "updated_at >=" not in rec[0] and full.behind == 1
    assert {ns for ns, ev in watchers.items() if ev.is_set()} == {tenants[0].namespace_id}


async def test_result_events_committed_here_wake_consumers_without_a_read(db: Database) -> None:
    """While the loop runs, result events this process commits wake the consumers of their
    namespace right after COMMIT, with no round and no read; the next round does not wake
    them again; a transaction that rolls back wakes nobody."""
    from orbit.delivery_loop import DeliveryHub, DeliveryLoop
    from orbit.events import ResultSnapshot, append_result_events

    tenants = [await make_tenant(db) for _ in range(2)]
    hub = DeliveryHub()
    loop = DeliveryLoop(db, hub=hub, interval_s=3600.0, sweep_interval_s=3600.0)
    watchers = {t.namespace_id: hub.watch(t.namespace_id, new_id()) for t in tenants}
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        while set(loop._tops) != set(watchers):  # noqa: ASYNC110 - the first round has read them
            await asyncio.sleep(0.01)
        for ev in watchers.values():
            ev.clear()
        with recorded() as rec:
            await append_results(db, tenants[1].namespace_id, 2)
        assert not [s for s in rec if "orbit_event_streams" in s and "SELECT" in s.upper()
                    and "updated_at" in s]  # fmt: skip
        assert {ns for ns, ev in watchers.items() if ev.is_set()} == {tenants[1].namespace_id}
        watchers[tenants[1].namespace_id].clear()
        assert (await loop.run_once()).behind == 0  # the round knows the new top already

        class Abort(Exception):
            pass

        async def rolled_back(tx: Tx) -> None:
            snap = ResultSnapshot(task_id=new_id(), queue="q", kind="k", owner_id=bytes(16),
                                  state="SUCCEEDED", result={}, attempts=1)  # fmt: skip
            await append_result_events(tx, tenants[0].namespace_id, [snap])
            raise Abort

        with pytest.raises(Abort):
            await db.transaction(rolled_back)
        assert not any(ev.is_set() for ev in watchers.values())
    finally:
        stop.set()
        await task


async def test_hand_out_round_spans_namespaces_in_one_transaction(db: Database) -> None:
    """One node round hands out for several subscriptions of several namespaces: their rows
    locked in ONE statement, one range row each, two asks of one subscription sharing its
    room without overlap, a gone subscription answered alone."""
    a, b = await make_tenant(db), await make_tenant(db)
    sa, sb = await _sub(db, a), await _sub(db, b, max_in_flight=5)
    await append_results(db, a.namespace_id, 4)
    await append_results(db, b.namespace_id, 9)
    asks = [
        delivery_pump.LeaseAsk(a.namespace_id, sa.id, 10),
        delivery_pump.LeaseAsk(b.namespace_id, sb.id, 3),
        delivery_pump.LeaseAsk(b.namespace_id, sb.id, 3),  # a second consumer of sb
        delivery_pump.LeaseAsk(b.namespace_id, new_id(), 3),
    ]
    with recorded() as rec:
        out = await delivery_pump.lease_round(db, asks)
    locks = [s for s in rec if "FROM orbit_subscriptions" in s and "FOR UPDATE" in s]
    assert len(locks) == 1, locks
    assert clock.Q.clock_now not in rec  # the clock came with the rows' lock

    async def ranges(tx: Tx) -> list[int]:
        rows = await tx.fetchall(
            "SELECT n FROM orbit_delivery_ranges WHERE namespace_id IN (%s, %s) ORDER BY n",
            (a.namespace_id, b.namespace_id),
        )
        return [int(r["n"]) for r in rows]

    assert await db.read(ranges) == [4, 5]  # one range per subscription
    got_a, got_b1, got_b2, gone = out
    assert isinstance(gone, NotFound)
    assert [d.seq for d in got_a.deliveries] == [1, 2, 3, 4]
    assert [d.seq for d in got_b1.deliveries] == [1, 2, 3]
    assert [d.seq for d in got_b2.deliveries] == [4, 5]  # max_in_flight 5 across both asks
    assert got_b2.in_flight == 5
    outcomes = await deliveries.ack_round(
        db,
        [AckItem(a.namespace_id, d.delivery_id, d.proof) for d in got_a.deliveries]
        + [AckItem(b.namespace_id, d.delivery_id, d.proof)
           for d in got_b1.deliveries + got_b2.deliveries],
    )  # fmt: skip
    assert all(isinstance(o, AckResult) and o.outcome == "applied" for o in outcomes)


async def test_a_queue_limited_key_sees_deliveries_that_live_in_ranges(db: Database) -> None:
    """Visibility for keys limited to some queues finds a delivery's subscription whether
    the delivery is a row or a range slot."""
    t = await make_tenant(db)
    sub = await _sub(db, t, filter={"queues": ["q"]})
    await append_results(db, t.namespace_id, 2, queue="q")
    d1, d2 = (await delivery_pump.lease(db, t.namespace_id, sub.id, 2)).deliveries
    await deliveries.nack(db, t.namespace_id, d2.delivery_id, d2.proof, 60_000)  # now a row
    for d in (d1, d2):
        await subscriptions.check_delivery_visible(
            db, t.namespace_id, d.delivery_id, frozenset({"q"})
        )
        with pytest.raises(NotFound):
            await subscriptions.check_delivery_visible(
                db, t.namespace_id, d.delivery_id, frozenset({"other"})
            )
    with pytest.raises(NotFound):
        await subscriptions.check_delivery_visible(db, t.namespace_id, new_id(), frozenset({"q"}))


async def test_a_hand_out_skips_the_steps_its_probe_found_nothing_for(db: Database) -> None:
    """The probe before a hand-out saw no lease ended and nothing due: the locked hand-out
    reads neither the expired leases nor the due rows, only new events; once a lease has
    ended, the next hand-out reclaims it."""
    from orbit.store import deliveries as dstore
    from orbit.store import delivery_ranges as rstore

    t = await make_tenant(db)
    sub = await _sub(db, t, ack_timeout_ms=1000)
    await append_results(db, t.namespace_id, 3)
    skipped = (
        rstore.Q.range_list_expired_for_update,
        dstore.Q.delivery_list_expired_for_update,
        dstore.Q.delivery_list_due_for_update,
    )
    with recorded() as rec:
        first = await delivery_pump.lease(db, t.namespace_id, sub.id, 10)
    assert len(first.deliveries) == 3
    assert not [s for s in rec if s in skipped]
    await db.transaction(  # every lease of the range ends now
        lambda tx: tx.execute(
            "UPDATE orbit_delivery_ranges SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
            " WHERE namespace_id = %s AND subscription_id = %s",
            (t.namespace_id, sub.id),
        )
    )
    with recorded() as rec:
        await delivery_pump.lease(db, t.namespace_id, sub.id, 10)
    assert rstore.Q.range_list_expired_for_update in rec  # the probe saw it: reclaimed
    info = await delivery_history.get_delivery(db, t.namespace_id, first.deliveries[0].delivery_id)
    assert info.state != "LEASED" or info.attempts == 2


async def test_a_result_round_of_one_namespace_takes_its_numbers_without_a_read(
    db: Database,
) -> None:
    """The stream row's upsert answers the new top itself once the row exists (the first
    round, which inserts the row, reads it back): consecutive numbers, stamped by the
    database clock, and no read of the stream row."""
    t = await make_tenant(db)
    with recorded() as first:
        assert await append_results(db, t.namespace_id, 2) == [1, 2]
    assert [s for s in first if s.startswith("SELECT namespace_id, last_seq")]  # a new row
    with recorded() as rec:
        assert await append_results(db, t.namespace_id, 3) == [3, 4, 5]
    assert not [s for s in rec if s.startswith("SELECT namespace_id, last_seq")]
    other = await make_tenant(db)
    assert await append_results(db, other.namespace_id, 1) == [1]  # its own numbering

    async def stored(tx: Tx) -> list[tuple[int, bool]]:
        rows = await tx.fetchall(
            "SELECT seq, created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR AS fresh"
            " FROM orbit_result_events WHERE namespace_id = %s ORDER BY seq",
            (t.namespace_id,),
        )
        return [(int(r["seq"]), bool(r["fresh"])) for r in rows]

    assert await db.read(stored) == [(n, True) for n in range(1, 6)]


async def _com_insert(tx: Tx) -> int:
    row = await tx.fetchone("SHOW SESSION STATUS LIKE 'Com_insert'")
    assert row is not None
    return int(row["Value"])


async def test_result_events_and_audit_records_are_one_insert_each(db: Database) -> None:
    """Both INSERTs stamp with an expression in their VALUES, which the drivers' executemany
    would send as one statement per row: the server counts ONE INSERT for each batch."""
    from orbit import audit, events
    from orbit.events import ResultSnapshot

    t = await make_tenant(db)
    await append_results(db, t.namespace_id, 1)  # the stream row exists

    async def run(tx: Tx) -> tuple[int, int]:
        snaps = [
            ResultSnapshot(task_id=new_id(), queue="q", kind="k", owner_id=bytes(16),
                           state="SUCCEEDED", result={"i": i}, attempts=1)
            for i in range(3)
        ]  # fmt: skip
        before = await _com_insert(tx)
        seqs = await events.append_result_events(tx, t.namespace_id, snaps)
        assert seqs == [2, 3, 4]
        mid = await _com_insert(tx)
        actor = audit.Actor(None, bytes(16))
        entries = [
            {"actor": actor, "action": "task.submit", "resource_kind": "task",
             "namespace_id": t.namespace_id, "request_id": f"r-{i}"}
            for i in range(3)
        ]  # fmt: skip
        await audit.record_many(tx, entries)
        return mid - before, await _com_insert(tx) - mid

    results, audits = await db.transaction(run)
    assert results == 2  # the stream row's upsert and ONE INSERT of the three events
    assert audits == 1
