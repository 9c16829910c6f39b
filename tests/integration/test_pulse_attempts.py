"""Attempts against the real database: start authorisation, heartbeats, reports with
receipts, stale tokens, late reports as evidence, retry with backoff, deadlines, cancel."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from event_rows import raw_events
from pulse_worker_support import (
    check_invariants,
    connect,
    evidence_rows,
    open_session,
    task_row,
)

from orbit.errors import Conflict, StaleToken
from orbit.ids import id_hex, parse_id
from orbit.storage import Tx
from pulse import attempts, queues, tasks, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.errors import AttemptNotFound
from pulse.hub import Hub
from pulse.recovery import recover_attempt

RESULT = msgspec.Raw(b'{"total": 10.50, "items": [1, 2.0]}')


@pytest.fixture
def hub() -> Hub:
    return Hub("node-attempts")


async def offer_one(db, hub, t, conn=None, **submit):
    """Submit a task and dispatch it to a (new) session; (task, info, conn, offer)."""
    task = await t.submit(**submit)
    if conn is None:
        info, _ = await open_session(db, t)
        conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    assert offer.task.id == task["id"]
    return task, conn.info, conn, offer


async def start_one(db, hub, t, **submit):
    task, info, conn, offer = await offer_one(db, hub, t, **submit)
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started), started
    return task, info, conn, aid, started


async def result_events(db, t, task_id: str) -> list[dict]:
    async def run(tx: Tx) -> list[dict]:
        return await tx.fetchall(
            "SELECT type, state, result, attempts FROM orbit_result_events"
            " WHERE namespace_id = %s AND task_id = %s ORDER BY seq",
            (t.namespace_id, bytes.fromhex(task_id)),
        )

    return await db.read(run)


async def raw_event_types(db, t, task_id: str) -> list[str]:
    async def run(tx: Tx) -> list[str]:
        rows = await raw_events(
            tx, t.namespace_id, subject_kind="task", subject_id=bytes.fromhex(task_id)
        )
        return [r["type"] for r in rows]

    return await db.read(run)


# -- start -----------------------------------------------------------------------------------


async def test_offer_start_complete_keeps_bytes_and_writes_events(db, tenant, hub) -> None:
    t = await tenant()
    task, info, _conn, offer = await offer_one(db, hub, t, payload={"n": 1.50, "s": "é"})
    assert offer.task.generation == 1 and offer.task.queue == t.queue
    assert msgspec.json.decode(bytes(offer.task.payload)) == {"n": 1.5, "s": "é"}
    assert (await task_row(db, t, task["id"]))["state"] == "LEASED"
    await check_invariants(db, t.namespace_id)

    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)
    assert started.generation == 1 and started.concurrency_token is None
    row = await task_row(db, t, task["id"])
    assert row["state"] == "RUNNING" and row["attempts"] == 1
    await check_invariants(db, t.namespace_id)

    receipt = await attempts.report(
        db, t.namespace_id, Report("complete", aid, started.execution_token, result=RESULT)
    )
    assert receipt.outcome == "applied" and receipt.task_state == "SUCCEEDED"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "SUCCEEDED"
    assert row["result"] == bytes(RESULT).decode()  # byte-exact, 10.50 not 10.5
    assert row["finished_at"] is not None
    events = await result_events(db, t, task["id"])
    assert [(e["type"], e["result"]) for e in events] == [
        ("task.succeeded", bytes(RESULT).decode())
    ]
    types = await raw_event_types(db, t, task["id"])
    assert types == ["task.accepted", "task.leased", "task.started", "task.succeeded"]
    await check_invariants(db, t.namespace_id)


async def test_start_checks_session_state_and_repeats(db, tenant, hub) -> None:
    t = await tenant()
    _task, info, _conn, offer = await offer_one(db, hub, t)
    aid = parse_id(offer.attempt_id)
    other, _ = await open_session(db, t)
    denied = await attempts.start(db, t.namespace_id, other.session_id, aid)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_found"
    denied = await attempts.start(db, t.namespace_id, info.session_id, b"\x01" * 16)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_found"
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)
    again = await attempts.start(db, t.namespace_id, info.session_id, aid)  # reply lost
    assert isinstance(again, wire.Started) and again.generation == started.generation
    assert again.execution_token != started.execution_token  # rotated (test_pulse_start_resend)
    # Another namespace never sees the attempt.
    t2 = await tenant()
    denied = await attempts.start(db, t2.namespace_id, info.session_id, aid)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_found"
    await check_invariants(db, t.namespace_id)


async def test_start_after_offer_lease_is_denied_and_released(db, tenant, hub) -> None:
    t = await tenant()
    task, info, conn, offer = await offer_one(db, hub, t)
    aid = parse_id(offer.attempt_id)
    late = (await db.now()) + timedelta(seconds=60)
    denied = await attempts.start(db, t.namespace_id, info.session_id, aid, now=late)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "offer_expired"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "WAITING" and row["attempts"] == 0
    await check_invariants(db, t.namespace_id)
    # Offered again: a new attempt with the same generation (the first never started).
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer2,) = conn.take_offers()
    assert offer2.attempt_id != offer.attempt_id and offer2.task.generation == 1
    started = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer2.attempt_id))
    assert isinstance(started, wire.Started) and started.generation == 1
    await check_invariants(db, t.namespace_id)


async def test_start_denied_while_paused(db, tenant, hub) -> None:
    t = await tenant()
    task, info, conn, offer = await offer_one(db, hub, t)
    await queues.set_queue_paused(db, t.namespace_id, t.queue, True)
    denied = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer.attempt_id))
    assert isinstance(denied, wire.StartDenied) and denied.reason == "paused"
    assert (await task_row(db, t, task["id"]))["state"] == "WAITING"
    assert await Dispatcher(db, hub).dispatch_to(conn) == 0  # closed gate: no offers
    await queues.set_queue_paused(db, t.namespace_id, t.queue, False)
    await queues.set_namespace_paused(db, t.namespace_id, True)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 0
    await queues.set_namespace_paused(db, t.namespace_id, False)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    await check_invariants(db, t.namespace_id)


async def test_deadline_passed_at_start_fails_the_task(db, tenant, hub) -> None:
    t = await tenant()
    now = await db.now()
    deadline = now + timedelta(seconds=5)
    task, info, _conn, offer = await offer_one(
        db, hub, t, deadline_at=deadline.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
    assert offer.task.deadline_at is not None
    denied = await attempts.start(
        db, t.namespace_id, info.session_id, parse_id(offer.attempt_id),
        now=deadline + timedelta(milliseconds=1),
    )  # fmt: skip
    assert isinstance(denied, wire.StartDenied) and denied.reason == "deadline_exceeded"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "FAILED" and row["finished_at"] is not None
    assert msgspec.json.decode(row["error"])["type"] == "deadline_exceeded"
    assert [e["type"] for e in await result_events(db, t, task["id"])] == ["task.failed"]
    await check_invariants(db, t.namespace_id)


async def test_cancel_of_leased_task_denies_start(db, tenant, hub) -> None:
    t = await tenant()
    task, info, _conn, offer = await offer_one(db, hub, t)
    out = await tasks.cancel_task(db, t.namespace_id, task["id"])
    assert out.status == 200 and out.task["state"] == "CANCELLED"
    denied = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer.attempt_id))
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_offered"
    await check_invariants(db, t.namespace_id)


# -- reports ---------------------------------------------------------------------------------


async def test_receipts_replay_conflict_and_stale_token(db, tenant, hub) -> None:
    t = await tenant()
    task, _info, _conn, aid, started = await start_one(db, hub, t)
    token = started.execution_token
    # Wrong token: 409 stale_token, nothing changes.
    with pytest.raises(StaleToken):
        await attempts.report(
            db, t.namespace_id, Report("complete", aid, "ext_nope", result=RESULT)
        )
    assert (await task_row(db, t, task["id"]))["state"] == "RUNNING"
    first = await attempts.report(db, t.namespace_id, Report("complete", aid, token, result=RESULT))
    # The same report, formatted differently (whitespace, key order): replayed.
    same = msgspec.Raw(b'{ "items": [1, 2.0], "total": 10.50 }')
    again = await attempts.report(db, t.namespace_id, Report("complete", aid, token, result=same))
    assert again.outcome == "replayed" and again.receipt_id == first.receipt_id
    assert again.task_state == "SUCCEEDED"
    # A different report after one was applied: the token is stale (kept as evidence).
    with pytest.raises(StaleToken) as err:
        await attempts.report(
            db, t.namespace_id, Report("complete", aid, token, result=msgspec.Raw(b"2"))
        )
    assert err.value.code == "stale_token" and err.value.details["applied"] == "complete"
    with pytest.raises(StaleToken):
        error = wire.FailError(type="X", message="m")
        await attempts.report(db, t.namespace_id, Report("fail", aid, token, error=error))
    with pytest.raises(AttemptNotFound):
        await attempts.report(db, t.namespace_id, Report("complete", b"\x02" * 16, token))
    assert (await task_row(db, t, task["id"]))["result"] == bytes(RESULT).decode()
    await check_invariants(db, t.namespace_id)


async def test_retryable_failure_backs_off_until_max_attempts(db, tenant, hub) -> None:
    t = await tenant(retry={"max_attempts": 2, "backoff_initial_ms": 2000, "backoff_multiplier": 3})
    task, info, conn, aid, started = await start_one(db, hub, t)
    err = wire.FailError(type="Timeout", message="upstream slow", details=msgspec.Raw(b'{"a":1}'))
    now = await db.now()
    receipt = await attempts.report(
        db, t.namespace_id, Report("fail", aid, started.execution_token, error=err, retryable=True),
        now=now,
    )  # fmt: skip
    assert receipt.task_state == "WAITING"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "WAITING" and row["attempts"] == 1
    assert row["available_at"] == now + timedelta(milliseconds=2000)
    error = msgspec.json.decode(row["error"])
    assert error["type"] == "Timeout" and error["details"] == {"a": 1} and error["retryable"]
    assert await Dispatcher(db, hub).dispatch_to(conn) == 0  # not due yet
    assert await Dispatcher(db, hub).dispatch_to(conn, now=now + timedelta(seconds=3)) == 1
    (offer,) = conn.take_offers()
    assert offer.task.generation == 2
    aid2 = parse_id(offer.attempt_id)
    started2 = await attempts.start(
        db, t.namespace_id, info.session_id, aid2, now=now + timedelta(seconds=3)
    )
    assert isinstance(started2, wire.Started) and started2.generation == 2
    receipt = await attempts.report(
        db, t.namespace_id,
        Report("fail", aid2, started2.execution_token, error=err, retryable=True, retry_after_ms=5),
    )  # fmt: skip
    assert receipt.task_state == "FAILED"  # attempts exhausted
    row = await task_row(db, t, task["id"])
    assert row["state"] == "FAILED" and row["attempts"] == 2
    assert [e["type"] for e in await result_events(db, t, task["id"])] == ["task.failed"]
    await check_invariants(db, t.namespace_id)


async def test_retry_after_ms_wins_when_larger_and_permanent_failure_is_final(
    db, tenant, hub
) -> None:
    t = await tenant(retry={"max_attempts": 5, "backoff_initial_ms": 100})
    task, _info, _conn, aid, started = await start_one(db, hub, t)
    err = wire.FailError(type="RateLimited", message="slow down")
    now = await db.now()
    await attempts.report(
        db, t.namespace_id,
        Report("fail", aid, started.execution_token, error=err, retryable=True,
               retry_after_ms=60_000),
        now=now,
    )  # fmt: skip
    assert (await task_row(db, t, task["id"]))["available_at"] == now + timedelta(seconds=60)

    _task2, _info2, _conn2, aid2, started2 = await start_one(db, hub, t)
    receipt = await attempts.report(
        db, t.namespace_id, Report("fail", aid2, started2.execution_token, error=err)
    )
    assert receipt.task_state == "FAILED"  # not retryable: final at once
    await check_invariants(db, t.namespace_id)


def test_backoff_policy() -> None:
    policy = {
        "retry_backoff_initial_ms": 1000,
        "retry_backoff_max_ms": 10_000,
        "retry_backoff_multiplier": 2.0,
    }
    assert [attempts.backoff_ms(policy, n) for n in (1, 2, 3, 4, 5, 50, 5000)] == [
        1000, 2000, 4000, 8000, 10_000, 10_000, 10_000,
    ]  # fmt: skip
    assert attempts.backoff_ms(policy, 1, retry_after_ms=1500) == 1500
    assert attempts.backoff_ms(policy, 3, retry_after_ms=1500) == 4000


async def test_late_complete_after_expiry_is_evidence_not_applied(db, tenant, hub) -> None:
    t = await tenant(retry={"max_attempts": 3})
    task, _info, _conn, aid, started = await start_one(db, hub, t)
    late = (await db.now()) + timedelta(minutes=5)  # the running lease (30 s) passed
    with pytest.raises(StaleToken) as err:
        await attempts.report(
            db, t.namespace_id, Report("complete", aid, started.execution_token, result=RESULT),
            now=late,
        )  # fmt: skip
    assert err.value.details["evidence"] is True
    row = await task_row(db, t, task["id"])
    assert row["state"] == "NEEDS_REVIEW" and row["effect_uncertain"] == 1  # not retry_safe
    assert row["result"] is None
    evidence = {e["kind"]: e for e in await evidence_rows(db, t, task["id"])}
    assert sorted(evidence) == ["late_complete", "lost"]  # same instant: no order between them
    late_row = evidence["late_complete"]
    assert late_row["result"] == bytes(RESULT).decode()
    # Sent again: still stale, recorded once.
    with pytest.raises(StaleToken):
        await attempts.report(
            db, t.namespace_id, Report("complete", aid, started.execution_token, result=RESULT),
            now=late,
        )  # fmt: skip
    assert len(await evidence_rows(db, t, task["id"])) == 2
    await check_invariants(db, t.namespace_id)


async def test_late_report_never_applies_to_a_newer_generation(db, tenant, hub) -> None:
    t = await tenant(lease_ms=1000, retry={"max_attempts": 3, "backoff_initial_ms": 1000})
    task, info, conn, aid, started = await start_one(db, hub, t, retry_safe=True)
    # The first attempt is lost; retry_safe: the task is retried (generation 2 runs).
    late = (await db.now()) + timedelta(seconds=2)  # the 1 s lease passed (session lives 30 s)
    assert (
        await recover_attempt(db, t.namespace_id, aid, reason="lease_expired", now=late) == "lost"
    )
    row = await task_row(db, t, task["id"])
    assert row["state"] == "WAITING" and row["effect_uncertain"] == 0
    later = late + timedelta(seconds=2)  # past the 1 s backoff
    assert await Dispatcher(db, hub).dispatch_to(conn, now=later) == 1
    (offer,) = conn.take_offers()
    aid2 = parse_id(offer.attempt_id)
    started2 = await attempts.start(db, t.namespace_id, info.session_id, aid2, now=later)
    assert isinstance(started2, wire.Started) and started2.generation == 2
    # The old worker reports success with its (right) token: evidence only.
    err = wire.FailError(type="E", message="boom")
    with pytest.raises(StaleToken):
        await attempts.report(
            db, t.namespace_id, Report("fail", aid, started.execution_token, error=err),
            now=later,
        )  # fmt: skip
    row = await task_row(db, t, task["id"])
    assert row["state"] == "RUNNING" and row["current_attempt_id"] == aid2
    kinds = [e["kind"] for e in await evidence_rows(db, t, task["id"])]
    assert kinds == ["lost", "late_fail"]
    # The old token cannot complete the new attempt either.
    with pytest.raises(StaleToken):
        await attempts.report(
            db, t.namespace_id, Report("complete", aid2, started.execution_token, result=RESULT),
            now=later,
        )  # fmt: skip
    receipt = await attempts.report(
        db, t.namespace_id, Report("complete", aid2, started2.execution_token, result=RESULT),
        now=later,
    )  # fmt: skip
    assert receipt.task_state == "SUCCEEDED"
    await check_invariants(db, t.namespace_id)


# -- heartbeats ------------------------------------------------------------------------------


async def test_heartbeat_extends_leases_and_reports_others(db, tenant, hub) -> None:
    t = await tenant(lease_ms=10_000)
    task, info, conn, aid, _started = await start_one(db, hub, t)
    _task2, _, _, offer2 = await offer_one(db, hub, t, conn=conn)
    t0 = await db.now()
    later = t0 + timedelta(seconds=8)
    other, _ = await open_session(db, t)
    res = await attempts.heartbeat(
        db, t.namespace_id, info.session_id,
        [id_hex(aid), offer2.attempt_id, "zz", id_hex(b"\x03" * 16)], now=later,
    )  # fmt: skip
    by_id = {a.attempt_id: a for a in res.reply.attempts}
    assert [a.attempt_id for a in res.reply.attempts][:2] == [id_hex(aid), offer2.attempt_id]
    assert by_id[id_hex(aid)].ok and by_id[id_hex(aid)].lease_expires_at == (
        (later + timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
    assert by_id[offer2.attempt_id].ok  # an offer: ok, lease unchanged
    assert not by_id["zz"].ok and not by_id[id_hex(b"\x03" * 16)].ok
    row = await task_row(db, t, task["id"])
    assert row["lease_expires_at"] == later + timedelta(seconds=10)
    # Another session cannot extend it.
    res = await attempts.heartbeat(db, t.namespace_id, other.session_id, [id_hex(aid)], now=later)
    assert res.reply.attempts[0].ok is False
    # After its lease passed, a heartbeat does not revive it.
    res = await attempts.heartbeat(
        db, t.namespace_id, info.session_id, [id_hex(aid)], now=later + timedelta(seconds=11)
    )
    assert res.reply.attempts[0].ok is False
    await check_invariants(db, t.namespace_id)


async def test_heartbeat_of_expired_session_is_refused(db, tenant, hub) -> None:
    t = await tenant()
    info, _ = await open_session(db, t)
    future = (await db.now()) + timedelta(hours=1)
    with pytest.raises(attempts.SessionGone):
        await attempts.heartbeat(db, t.namespace_id, info.session_id, [], now=future)


# -- cancellation ----------------------------------------------------------------------------


async def test_cancel_running_then_worker_reports(db, tenant, hub) -> None:
    t = await tenant()
    task, info, conn, aid, started = await start_one(db, hub, t)
    token = started.execution_token
    with pytest.raises(Conflict) as err:  # no cancel requested yet
        await attempts.report(db, t.namespace_id, Report("cancelled", aid, token))
    assert err.value.kind == "not_cancel_requested"
    out = await tasks.cancel_task(db, t.namespace_id, task["id"], hub=hub)
    assert out.status == 202
    # The hub pushed `cancel` to the session's transport on this node.
    assert [c.attempt_id for c in conn.cancels()] == [id_hex(aid)]
    res = await attempts.heartbeat(db, t.namespace_id, info.session_id, [id_hex(aid)])
    assert res.reply.attempts[0].cancel_requested is True
    receipt = await attempts.report(db, t.namespace_id, Report("cancelled", aid, token))
    assert receipt.task_state == "CANCELLED"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "CANCELLED" and row["finished_at"] is not None
    assert [e["type"] for e in await result_events(db, t, task["id"])] == ["task.cancelled"]
    await check_invariants(db, t.namespace_id)


async def test_complete_after_cancel_request_stands(db, tenant, hub) -> None:
    t = await tenant()
    task, _info, _conn, aid, started = await start_one(db, hub, t)
    await tasks.cancel_task(db, t.namespace_id, task["id"])
    receipt = await attempts.report(
        db, t.namespace_id, Report("complete", aid, started.execution_token, result=RESULT)
    )
    assert receipt.task_state == "SUCCEEDED"
    # A retryable failure after a cancel request is not retried.
    task2, _, _, aid2, started2 = await start_one(db, hub, t)
    await tasks.cancel_task(db, t.namespace_id, task2["id"])
    err = wire.FailError(type="E", message="stopped")
    receipt = await attempts.report(
        db, t.namespace_id,
        Report("fail", aid2, started2.execution_token, error=err, retryable=True),
    )  # fmt: skip
    assert receipt.task_state == "CANCELLED"
    await check_invariants(db, t.namespace_id)
