"""Recovery: expired offers return to WAITING, lost running attempts are retried when
retry-safe or go to review, expired sessions lose their attempts; safe on many nodes."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec
import pytest
from pulse_worker_support import (
    check_invariants,
    connect,
    evidence_rows,
    open_session,
    task_row,
)

from orbit.ids import parse_id
from orbit.storage import Database, Tx
from pulse import attempts, tasks, wire
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.recovery import Recovery, recover_attempt
from pulse.types import Resolve, ResolveAction


@pytest.fixture
def hub() -> Hub:
    return Hub("node-recovery")


async def _offered(db, hub, t, n=1, **submit):
    ids = [(await t.submit(**submit))["id"] for _ in range(n)]
    info, _ = await open_session(db, t, max_concurrency=max(n, 1))
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == n
    return ids, info, conn, conn.take_offers()


async def _running(db, hub, t, **submit):
    (task_id,), info, conn, (offer,) = await _offered(db, hub, t, **submit)
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)
    return task_id, info, conn, aid, started


async def _result_types(db, t, task_id: str) -> list[str]:
    async def run(tx: Tx) -> list[str]:
        rows = await tx.fetchall(
            "SELECT type FROM orbit_result_events WHERE namespace_id = %s AND task_id = %s"
            " ORDER BY seq",
            (t.namespace_id, bytes.fromhex(task_id)),
        )
        return [r["type"] for r in rows]

    return await db.read(run)


async def test_expired_offer_returns_task_to_waiting(db, tenant, hub) -> None:
    t = await tenant()
    (task_id,), _info, _conn, (offer,) = await _offered(db, hub, t)
    now = await db.now()
    # Not yet expired: nothing happens to it.
    assert await recover_attempt(db, t.namespace_id, parse_id(offer.attempt_id),
                                 reason="offer_expired", now=now) is None  # fmt: skip
    stats = await Recovery(db, hub).run_once(now=now + timedelta(seconds=11))
    assert stats.offers_released >= 1
    row = await task_row(db, t, task_id)
    assert row["state"] == "WAITING" and row["attempts"] == 0 and row["effect_uncertain"] == 0
    assert await evidence_rows(db, t, task_id) == []  # nothing ran: no uncertainty
    await check_invariants(db, t.namespace_id)


async def test_lost_running_attempt_of_retry_safe_task_is_retried(db, tenant, hub) -> None:
    t = await tenant(lease_ms=1000, retry={"max_attempts": 2, "backoff_initial_ms": 500})
    task_id, info, conn, _aid, _started = await _running(db, hub, t, retry_safe=True)
    late = (await db.now()) + timedelta(seconds=2)
    stats = await Recovery(db, hub).run_once(now=late)
    assert stats.attempts_lost >= 1
    row = await task_row(db, t, task_id)
    assert row["state"] == "WAITING" and row["attempts"] == 1 and not row["effect_uncertain"]
    assert row["available_at"] == late + timedelta(milliseconds=500)
    assert [e["kind"] for e in await evidence_rows(db, t, task_id)] == ["lost"]
    await check_invariants(db, t.namespace_id)
    # The worker still connected here was told to stop.
    assert [c.reason for c in conn.cancels()] == ["lease_expired"]

    # Lost again with attempts exhausted: a retry-safe task ends FAILED attempts_exhausted
    # (its effect is idempotent: nothing is uncertain).
    later = late + timedelta(seconds=1)
    assert await Dispatcher(db, hub).dispatch_to(conn, now=later) == 1
    (offer,) = conn.take_offers()
    aid2 = parse_id(offer.attempt_id)
    assert isinstance(await attempts.start(db, t.namespace_id, info.session_id, aid2, now=later),
                      wire.Started)  # fmt: skip
    await Recovery(db, hub).run_once(now=later + timedelta(seconds=2))
    row = await task_row(db, t, task_id)
    assert row["state"] == "FAILED" and row["effect_uncertain"] == 0, row
    assert row["attempts"] == 2 and row["finished_at"] is not None
    error = msgspec.json.decode(row["error"])
    assert error["type"] == "attempts_exhausted" and error["reason"] == "lease_expired"
    assert error["lost_attempt_id"] == offer.attempt_id and "lost" in error["message"]
    assert await _result_types(db, t, task_id) == ["task.failed"]
    assert [e["kind"] for e in await evidence_rows(db, t, task_id)] == ["lost", "lost"]
    await check_invariants(db, t.namespace_id)


async def test_lost_running_attempt_goes_to_review_then_resolve(db, tenant, hub) -> None:
    t = await tenant(lease_ms=1000)
    task_id, _info, conn, aid, _started = await _running(db, hub, t)
    late = (await db.now()) + timedelta(seconds=2)
    await Recovery(db, hub).run_once(now=late)
    row = await task_row(db, t, task_id)
    assert row["state"] == "NEEDS_REVIEW" and row["effect_uncertain"] == 1
    error = msgspec.json.decode(row["error"])
    assert error["type"] == "attempt_lost" and error["reason"] == "lease_expired"
    lost = (await evidence_rows(db, t, task_id))[0]
    assert lost["kind"] == "lost" and lost["attempt_id"] == aid
    assert await _result_types(db, t, task_id) == ["task.needs_review"]
    # A second round (another node) finds nothing more to do.
    await Recovery(db, hub).run_once(now=late)
    assert len(await evidence_rows(db, t, task_id)) == 1
    # The operator retries it; the next attempt is generation 2.
    from orbit.audit import CLI_ACTOR

    await tasks.resolve_task(
        db, t.namespace_id, task_id, Resolve(action=ResolveAction.RETRY, note="checked: not charged"),
        actor=CLI_ACTOR, hub=hub,
    )  # fmt: skip
    row = await task_row(db, t, task_id)
    assert row["state"] == "WAITING" and row["effect_uncertain"] == 0
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    assert offer.task.generation == 2
    await check_invariants(db, t.namespace_id)


async def test_cancel_requested_and_lost(db, tenant, hub) -> None:
    t = await tenant(lease_ms=1000)
    safe_id, _info, _conn, _aid, _ = await _running(db, hub, t, retry_safe=True)
    await tasks.cancel_task(db, t.namespace_id, safe_id)
    unsafe_id, _info2, _conn2, _aid2, _ = await _running(db, hub, t)
    await tasks.cancel_task(db, t.namespace_id, unsafe_id)
    await Recovery(db, hub).run_once(now=(await db.now()) + timedelta(seconds=2))
    assert (await task_row(db, t, safe_id))["state"] == "CANCELLED"
    assert (await task_row(db, t, unsafe_id))["state"] == "NEEDS_REVIEW"
    await check_invariants(db, t.namespace_id)


async def test_expired_session_loses_its_attempts_and_closes_its_stream(db, tenant, hub) -> None:
    t = await tenant(lease_ms=120_000)  # attempt leases outlive the session
    await t.submit()
    await t.submit(retry_safe=True)
    info, _ = await open_session(db, t, max_concurrency=3)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 2
    offers = conn.take_offers()
    aid = parse_id(offers[0].attempt_id)
    assert isinstance(await attempts.start(db, t.namespace_id, info.session_id, aid), wire.Started)
    third = await t.submit()
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1  # 3rd held: offered, not started
    conn.take_offers()
    future = (await db.now()) + timedelta(seconds=31)  # session lease 30 s passed
    # A round takes the oldest expired sessions of the whole database, a batch at a time
    # (the other tests' sessions too): go on, as the recovery loop does, until a round
    # finds less than a full batch.
    recovery = Recovery(db, hub)
    for _ in range(100):
        stats = await recovery.run_once(now=future)
        if stats.sessions_expired < recovery.settings.recovery_batch:
            break
    assert conn.closed and hub.get(t.namespace_id, info.session_id) is None

    async def rows(tx: Tx) -> tuple[dict, list[dict]]:
        s = await tx.fetchone(
            "SELECT state, closed_at FROM pulse_worker_sessions WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, info.session_id),
        )
        a = await tx.fetchall(
            "SELECT state FROM pulse_attempts WHERE namespace_id = %s AND session_id = %s",
            (t.namespace_id, info.session_id),
        )
        return s, a

    session, held = await db.read(rows)
    assert session["state"] == "EXPIRED" and session["closed_at"] == future
    assert sorted(a["state"] for a in held) == ["LOST", "RELEASED", "RELEASED"]
    assert (await task_row(db, t, third["id"]))["state"] == "WAITING"
    await check_invariants(db, t.namespace_id)
    # The expired session cannot come back.
    with pytest.raises(attempts.SessionGone):
        await attempts.heartbeat(db, t.namespace_id, info.session_id, [])


async def test_recovery_on_many_nodes_at_once_recovers_each_attempt_once(
    db, dsn, tenant, hub
) -> None:
    t = await tenant(lease_ms=1000)
    n = 12
    ids, info, _conn, offers = await _offered(db, hub, t, n=n)
    for offer in offers[: n // 2]:
        started = await attempts.start(
            db, t.namespace_id, info.session_id, parse_id(offer.attempt_id)
        )
        assert isinstance(started, wire.Started)
    late = (await db.now()) + timedelta(seconds=15)
    pools = [await Database.connect(dsn, maxsize=3) for _ in range(4)]
    try:
        await asyncio.gather(*(Recovery(p).run_once(now=late) for p in pools))
    finally:
        for p in pools:
            await p.close()

    async def rows(tx: Tx) -> list[dict]:
        return await tx.fetchall(
            "SELECT a.state, (SELECT COUNT(*) FROM pulse_attempt_evidence e"
            "  WHERE e.namespace_id = a.namespace_id AND e.attempt_id = a.id) AS evidence"
            " FROM pulse_attempts a WHERE a.namespace_id = %s",
            (t.namespace_id,),
        )

    got = await db.read(rows)
    assert sorted((r["state"], r["evidence"]) for r in got) == sorted(
        [("LOST", 1)] * (n // 2) + [("RELEASED", 0)] * (n // 2)
    )
    states = [(await task_row(db, t, i))["state"] for i in ids]
    assert sorted(states) == sorted(["NEEDS_REVIEW"] * (n // 2) + ["WAITING"] * (n // 2))
    await check_invariants(db, t.namespace_id)


async def test_recovery_runs_the_deadline_sweep(db, tenant, hub) -> None:
    t = await tenant()
    now = await db.now()
    task = await t.submit(
        deadline_at=(now + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
    stats = await Recovery(db, hub).run_once(now=now + timedelta(seconds=2))
    assert stats.deadlines_expired >= 1
    assert (await task_row(db, t, task["id"]))["state"] == "FAILED"
    await check_invariants(db, t.namespace_id)
