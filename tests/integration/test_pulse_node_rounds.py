"""Node rounds of the worker side: the starts (or reports) of several namespaces and
applications in ONE transaction, each item judged exactly as it would be alone.

* a start round and a report round over three applications (one with two namespaces),
  items interleaved, with failures of one item (not found, stale token, unreadable JSON,
  a replay) that touch nobody else; counters equal a recount in every namespace; result
  sequences gap-free per namespace; one transaction per round;
* an application's start-rate window is shared by all its namespaces inside one round
  (two namespaces of one application never grant more than its limit together);
* the node's group commit mixes namespaces in one round under concurrency.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from pulse_fixtures import Tenant
from pulse_worker_support import FakeConn, check_invariants, connect, open_session, task_row

from orbit.errors import InvalidRequest, StaleToken
from orbit.ids import new_id, parse_id
from orbit.storage import Database, Tx
from pulse import wire
from pulse.attempts import Report
from pulse.batcher import WorkerBatches
from pulse.dispatch import Dispatcher
from pulse.errors import AttemptNotFound
from pulse.hub import Hub
from pulse.report_round import report_round
from pulse.start_round import start_round


async def offered(db: Database, hub: Hub, t: Tenant, n: int, **session: Any) -> tuple[FakeConn, list[wire.Offer]]:
    for _ in range(n):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=n, **session)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == n
    return conn, conn.take_offers()


async def result_seqs(db: Database, ns: bytes) -> list[int]:
    async def run(tx: Tx) -> list[int]:
        rows = await tx.fetchall(
            "SELECT seq FROM orbit_result_events WHERE namespace_id = %s ORDER BY seq", (ns,)
        )
        return [int(r["seq"]) for r in rows]

    return await db.read(run)


def commits(db: Database) -> int:
    return db.stats.commits


async def test_rounds_over_several_namespaces_judge_each_item_alone(db, tenant) -> None:
    hub = Hub("node-rounds")
    a, b = await tenant(), await tenant()
    a2 = await a.other_namespace()  # a second namespace of application a
    tenants = [a, b, a2]
    conns: list[FakeConn] = []
    offers: list[list[wire.Offer]] = []
    for t in tenants:
        conn, got = await offered(db, hub, t, 3)
        conns.append(conn)
        offers.append(got)
    # Interleaved across namespaces; one attempt of another namespace's id given for `b`.
    items: list[tuple[bytes, bytes, bytes]] = []
    for i in range(3):
        for t, conn, got in zip(tenants, conns, offers, strict=True):
            items.append((t.namespace_id, conn.info.session_id, parse_id(got[i].attempt_id)))
    wrong_ns = (b.namespace_id, conns[1].info.session_id, parse_id(offers[0][0].attempt_id))
    missing = (a.namespace_id, conns[0].info.session_id, new_id())
    before = commits(db)
    replies = await start_round(db, [*items[:4], wrong_ns, missing, *items[4:]])
    # One transaction for the whole round. `wrong_ns` names a's attempt under b's
    # namespace: not found there (a namespace never sees another's rows).
    assert commits(db) - before == 1
    by_item = dict(zip([*items[:4], wrong_ns, missing, *items[4:]], replies, strict=True))
    assert isinstance(by_item[wrong_ns], wire.StartDenied) and by_item[wrong_ns].reason == "not_found"
    assert isinstance(by_item[missing], wire.StartDenied) and by_item[missing].reason == "not_found"
    started = {it: by_item[it] for it in items}
    assert all(isinstance(s, wire.Started) and s.generation == 1 for s in started.values())
    for t, got in zip(tenants, offers, strict=True):
        for o in got:
            assert (await task_row(db, t, o.task.id))["state"] == "RUNNING"
        await check_invariants(db, t.namespace_id)

    # The report round: per namespace one stale token, one unreadable result, the rest good;
    # then the same good reports again (replayed) in the next round.
    reports: list[tuple[bytes, Report]] = []
    for n, (ns, _, aid) in enumerate(items):
        s = started[(ns, _, aid)]
        assert isinstance(s, wire.Started)
        if n == 0:
            reports.append((ns, Report("complete", aid, s.execution_token + "x", result=msgspec.Raw(b"1"))))
        elif n == 1:
            reports.append((ns, Report("complete", aid, s.execution_token, result=msgspec.Raw(b'{"x": tru'))))
        else:
            reports.append((ns, Report("complete", aid, s.execution_token, result=msgspec.Raw(f'{{"n": {n}}}'.encode()))))
    before = commits(db)
    outcomes = await report_round(db, reports)
    assert commits(db) - before == 1
    assert isinstance(outcomes[0], StaleToken)
    assert isinstance(outcomes[1], InvalidRequest)
    assert all(isinstance(o, wire.Receipt) and o.outcome == "applied" for o in outcomes[2:])
    again = await report_round(db, reports[2:])
    assert all(isinstance(o, wire.Receipt) and o.outcome == "replayed" for o in again)
    assert [o.receipt_id for o in again] == [o.receipt_id for o in outcomes[2:]]  # type: ignore[union-attr]
    for n, (ns, rep) in enumerate(reports[2:], start=2):
        t = next(t for t in tenants if t.namespace_id == ns)
        task_id = next(o.task.id for got in offers for o in got if parse_id(o.attempt_id) == rep.attempt_id)
        row = await task_row(db, t, task_id)
        assert row["state"] == "SUCCEEDED" and row["result"] == f'{{"n": {n}}}'
    for t in tenants:
        await check_invariants(db, t.namespace_id)
        done = sum(1 for ns, _ in reports[2:] if ns == t.namespace_id)
        assert await result_seqs(db, t.namespace_id) == list(range(1, done + 1))


async def test_an_application_start_window_is_shared_by_its_namespaces(db, tenant) -> None:
    hub = Hub("node-rounds-rate")
    a = await tenant()
    a2 = await a.other_namespace()

    async def set_rate(tx: Tx) -> None:
        await tx.execute(
            "UPDATE orbit_application_resources SET max_starts_per_second = 2"
            " WHERE application_id = %s",
            (a.application_id,),
        )

    await db.transaction(set_rate)
    items = []
    for t in (a, a2):
        conn, got = await offered(db, hub, t, 2)
        items += [(t.namespace_id, conn.info.session_id, parse_id(o.attempt_id)) for o in got]
    replies = await start_round(db, items)
    granted = [r for r in replies if isinstance(r, wire.Started)]
    denied = [r for r in replies if isinstance(r, wire.StartDenied)]
    assert len(granted) == 2, replies
    assert [d.reason for d in denied] == ["rate_limited", "rate_limited"]
    for t in (a, a2):
        await check_invariants(db, t.namespace_id)


async def test_the_node_group_commit_mixes_namespaces(db, tenant) -> None:
    hub = Hub("node-rounds-batcher")
    tenants = [await tenant() for _ in range(4)]
    work: list[tuple[Tenant, FakeConn, wire.Offer]] = []
    for t in tenants:
        conn, got = await offered(db, hub, t, 6)
        work += [(t, conn, o) for o in got]
    batches = WorkerBatches(db, max_batch=64)
    # Every start is queued before the round runs (the round starts on the next turn of the
    # event loop): all four namespaces' starts go in ONE round (per-namespace group commit
    # made four).
    started = await asyncio.gather(*(
        batches.start(t.namespace_id, c.info.session_id, parse_id(o.attempt_id))
        for t, c, o in work
    ))  # fmt: skip
    assert all(isinstance(s, wire.Started) for s in started)
    assert batches.starts.stats.batches == 1 and batches.starts.stats.largest == len(work)
    reps = [
        (t.namespace_id, Report("complete", parse_id(s.attempt_id), s.execution_token, result=msgspec.Raw(b"1")))
        for (t, _, _), s in zip(work, started, strict=True)
    ]
    receipts = await asyncio.gather(*(batches.report(ns, r) for ns, r in reps))
    assert all(r.task_state == "SUCCEEDED" for r in receipts)
    for t in tenants:
        assert await result_seqs(db, t.namespace_id) == list(range(1, 7))
        await check_invariants(db, t.namespace_id)
    assert not [r for r in receipts if isinstance(r, AttemptNotFound)]


def _body(**fields: Any) -> Any:
    from pulse.types import TaskSubmit

    fields.setdefault("queue", "default")
    fields.setdefault("kind", "k")
    return msgspec.json.decode(msgspec.json.encode(fields), type=TaskSubmit)


async def test_a_submit_round_over_namespaces_and_owners_judges_each_item_alone(db, tenant) -> None:
    from pulse_fixtures import recount

    from pulse import submit
    from pulse.errors import QueueNotFound, QueueQuotaExceeded

    a = await tenant(max_unfinished_tasks=2)
    a2 = await a.other_namespace()
    b = await tenant()
    one = submit.SingleSubmit
    items = [
        (a.namespace_id, a.application_id, one(_body(), None, "a-1")),
        (b.namespace_id, b.application_id, one(_body(dedup_key="d"), None, "b-1")),
        (a2.namespace_id, a2.application_id, one(_body(dedup_key="d"), None, "a2-1")),
        (a.namespace_id, a.application_id, one(_body(), None, "a-2")),
        (b.namespace_id, b.application_id, one(_body(dedup_key="d"), None, "b-2")),  # twin
        (a.namespace_id, a.application_id, one(_body(), None, "a-3")),  # a's queue is full
        (a2.namespace_id, a2.application_id, one(_body(queue="nope"), None, "a2-2")),
    ]
    before = commits(db)
    out = await submit.submit_round(db, items)
    assert commits(db) - before == 1
    status = [getattr(o, "status", None) for o in out]
    assert status[:5] == [201, 201, 201, 201, 200]
    assert out[4].json()["id"] == out[1].json()["id"]  # type: ignore[union-attr]
    # The same dedup identity in two namespaces is two tasks (identity is per namespace).
    assert out[2].json()["id"] != out[1].json()["id"]  # type: ignore[union-attr]
    assert isinstance(out[5], QueueQuotaExceeded) and isinstance(out[6], QueueNotFound)
    for t, n in ((a, 2), (a2, 1), (b, 1)):
        counts = await recount(db, t)
        assert counts["usage"] == counts["rows"] and counts["rows"]["unfinished_tasks"] == n

    async def app_unfinished(tx: Tx) -> int:
        return int(await tx.fetchval(
            "SELECT unfinished_tasks FROM orbit_application_resources WHERE application_id = %s",
            (a.application_id,),
        ))  # fmt: skip

    assert await db.read(app_unfinished) == 3  # both namespaces of a count into its row


async def test_a_heartbeat_round_touches_an_instance_at_most_every_ten_seconds(db, tenant) -> None:
    """The session's expiry moves with every heartbeat; its instance's last_seen_at only
    when it is INSTANCE_TOUCH_S old, so most idle heartbeats write one row, not two."""
    from pulse.heartbeat_round import heartbeat_round
    from pulse.store.rounds import INSTANCE_TOUCH_S

    t = await tenant()
    info, _ = await open_session(db, t)

    async def seen() -> tuple[Any, Any]:
        async def run(tx: Tx) -> tuple[Any, Any]:
            i = await tx.fetchone(
                "SELECT last_seen_at FROM pulse_worker_instances WHERE namespace_id = %s"
                " AND id = %s", (info.namespace_id, info.instance_id),
            )  # fmt: skip
            s = await tx.fetchone(
                "SELECT expires_at FROM pulse_worker_sessions WHERE namespace_id = %s"
                " AND id = %s", (info.namespace_id, info.session_id),
            )  # fmt: skip
            assert i is not None and s is not None
            return i["last_seen_at"], s["expires_at"]

        return await db.read(run)

    registered, expires0 = await seen()
    await heartbeat_round(db, [(info.namespace_id, info.session_id, [])])
    touched, expires1 = await seen()
    assert touched == registered and expires1 > expires0  # registered just now: not rewritten
    await db.transaction(
        lambda tx: tx.execute(
            "UPDATE pulse_worker_instances SET last_seen_at = last_seen_at - INTERVAL %s SECOND"
            " WHERE namespace_id = %s AND id = %s",
            (INSTANCE_TOUCH_S + 1, info.namespace_id, info.instance_id),
        )
    )
    old, _ = await seen()
    await heartbeat_round(db, [(info.namespace_id, info.session_id, [])])
    touched, _ = await seen()
    assert touched > old and touched >= registered  # old enough: moved to the round's time


async def test_a_submit_round_writes_every_items_audit_record_in_one_insert(db, tenant) -> None:
    from orbit.audit import Actor
    from orbit.storage import db as storage_db
    from pulse import submit

    a, b = await tenant(), await tenant()
    items = [
        (t.namespace_id, t.application_id,
         submit.SingleSubmit(_body(), Actor(None, t.application_id), f"r-{i}"))
        for i, t in enumerate([a, b, a])
    ]  # fmt: skip
    previous, log = storage_db.STATEMENT_LOG, []
    storage_db.STATEMENT_LOG = log
    try:
        out = await submit.submit_round(db, items)
    finally:
        storage_db.STATEMENT_LOG = previous
    assert [getattr(o, "status", None) for o in out] == [201, 201, 201]
    audits = [s for s in log if "INSERT INTO orbit_audit_events" in s]
    assert len(audits) == 1  # ONE multi-row INSERT for the round

    async def recorded(tx: Tx) -> list[str]:
        rows = await tx.fetchall(
            "SELECT request_id FROM orbit_audit_events WHERE namespace_id IN (%s, %s)"
            " AND request_id LIKE 'r-%%' ORDER BY request_id",
            (a.namespace_id, b.namespace_id),
        )
        return [r["request_id"] for r in rows]

    assert await db.read(recorded) == ["r-0", "r-1", "r-2"]
