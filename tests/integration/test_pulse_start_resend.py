"""A lost ``started`` reply: the holding session re-sends ``start`` and gets a NEW execution
token (same generation); the first token is stale from then on; another session, an expired
session or an attempt whose lease passed gets ``start_denied`` (docs/api/workers.md
"Step 2 — start")."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from event_rows import raw_events
from pulse_worker_support import check_invariants, connect, open_session, task_row

from orbit.errors import StaleToken
from orbit.ids import parse_id
from orbit.storage import Tx
from pulse import attempts, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub


@pytest.fixture
def hub() -> Hub:
    return Hub("node-start-resend")


async def _started(db, hub, t, **submit):
    task = await t.submit(**submit)
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    first = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(first, wire.Started), first
    return task, info, aid, first


async def _events(db, t, task_id: str) -> list[dict]:
    async def run(tx: Tx) -> list[dict]:
        return await raw_events(
            tx, t.namespace_id, subject_kind="task", subject_id=bytes.fromhex(task_id)
        )

    return await db.read(run)


async def test_a_resent_start_rotates_the_token(db, tenant, hub) -> None:
    t = await tenant()
    task, info, aid, first = await _started(db, hub, t)
    before = await task_row(db, t, task["id"])
    second = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(second, wire.Started), second
    assert second.generation == first.generation == 1
    assert second.concurrency_token == first.concurrency_token
    assert second.lease_expires_at == first.lease_expires_at  # not extended by a re-send
    assert second.execution_token != first.execution_token
    # The task did not move: same state, attempts, state version.
    after = await task_row(db, t, task["id"])
    assert (after["state"], after["attempts"], after["state_version"]) == (
        before["state"], before["attempts"], before["state_version"],
    )  # fmt: skip
    # The first token is stale: 409 stale_token, nothing changes (no evidence either: a wrong
    # token proves nothing about the attempt).
    with pytest.raises(StaleToken) as caught:
        await attempts.report(
            db, t.namespace_id, Report("complete", aid, first.execution_token,
                                       result=msgspec.Raw(b"1")),
        )  # fmt: skip
    assert not caught.value.details.get("evidence")
    assert (await task_row(db, t, task["id"]))["state"] == "RUNNING"
    # The history shows the re-send.
    resent = [e for e in await _events(db, t, task["id"]) if e["type"] == "task.start_resent"]
    assert len(resent) == 1
    data = msgspec.json.decode(resent[0]["data"])
    assert data["token_rotated"] is True and data["generation"] == 1
    # The new token works.
    receipt = await attempts.report(
        db, t.namespace_id, Report("complete", aid, second.execution_token,
                                   result=msgspec.Raw(b"2")),
    )  # fmt: skip
    assert receipt.outcome == "applied" and receipt.task_state == "SUCCEEDED"
    await check_invariants(db, t.namespace_id)


async def test_a_third_start_rotates_again_and_only_the_last_token_works(db, tenant, hub) -> None:
    t = await tenant()
    _task, info, aid, first = await _started(db, hub, t)
    second = await attempts.start(db, t.namespace_id, info.session_id, aid)
    third = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(second, wire.Started) and isinstance(third, wire.Started)
    assert len({first.execution_token, second.execution_token, third.execution_token}) == 3
    for stale in (first, second):
        with pytest.raises(StaleToken):
            await attempts.report(
                db, t.namespace_id, Report("cancelled", aid, stale.execution_token)
            )
    hb = await attempts.heartbeat(db, t.namespace_id, info.session_id, [third.attempt_id])
    assert hb.reply.attempts[0].ok  # the lease is unaffected
    err = wire.FailError(type="E", message="boom")
    receipt = await attempts.report(
        db, t.namespace_id, Report("fail", aid, third.execution_token, error=err)
    )
    assert receipt.task_state == "FAILED"


async def test_another_session_cannot_rotate_the_token(db, tenant, hub) -> None:
    t = await tenant()
    task, info, aid, first = await _started(db, hub, t)
    other, _ = await open_session(db, t)
    denied = await attempts.start(db, t.namespace_id, other.session_id, aid)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_found"
    # Another namespace neither.
    t2 = await tenant()
    denied = await attempts.start(db, t2.namespace_id, info.session_id, aid)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_found"
    # The first token still works: nothing was rotated.
    receipt = await attempts.report(
        db, t.namespace_id, Report("complete", aid, first.execution_token)
    )
    assert receipt.outcome == "applied"
    assert not [e for e in await _events(db, t, task["id"]) if e["type"] == "task.start_resent"]


async def test_no_rotation_once_the_lease_passed_or_the_session_expired(db, tenant, hub) -> None:
    t = await tenant(lease_ms=1000)
    task, info, aid, first = await _started(db, hub, t)
    late = (await db.now()) + timedelta(seconds=2)  # the running lease (1 s) passed
    denied = await attempts.start(db, t.namespace_id, info.session_id, aid, now=late)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "already_started"
    # The session itself expired (30 s): session_inactive.
    later = late + timedelta(seconds=40)
    denied = await attempts.start(db, t.namespace_id, info.session_id, aid, now=later)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "session_inactive"
    # Nothing was rotated: the first token is still the attempt's (its report is late now,
    # so it becomes evidence rather than being applied).
    with pytest.raises(StaleToken) as caught:
        await attempts.report(
            db, t.namespace_id, Report("complete", aid, first.execution_token), now=late
        )
    assert caught.value.details.get("evidence") is True
    assert (await task_row(db, t, task["id"]))["state"] == "NEEDS_REVIEW"
    await check_invariants(db, t.namespace_id)


async def test_a_finished_attempt_is_not_started_again(db, tenant, hub) -> None:
    t = await tenant()
    _task, info, aid, first = await _started(db, hub, t)
    await attempts.report(db, t.namespace_id, Report("complete", aid, first.execution_token))
    denied = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(denied, wire.StartDenied) and denied.reason == "not_offered"
