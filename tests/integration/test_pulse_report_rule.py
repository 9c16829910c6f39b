"""Which session may send what: a report is bound to its attempt by the execution token.

The rule (docs/api/workers.md, "Which session may send what"): ``start`` and ``heartbeat``
act on what a session holds and are bound to that session; ``complete``, ``fail``,
``cancelled`` and ``effect`` act on an attempt and are bound to it by its execution token,
whichever session carries them — the one that started it, a newer session of the worker
after a reconnect (on any node), or the HTTP fallback with the token of a session that has
ended. Applied when the attempt is current and its lease live; any other right-token report
is 409 ``stale_token`` and kept as evidence; a wrong token changes nothing.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from platform_fixtures import asgi_client, bearer, make_app, pulse_routes
from pulse_worker_support import check_invariants, connect, evidence_rows, open_session, task_row

from orbit.errors import StaleToken, Unauthenticated
from orbit.ids import id_hex, parse_id
from pulse import attempts, sessions, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.recovery import Recovery

RESULT = msgspec.Raw(b'{"total": 10.50}')


@pytest.fixture
def hub() -> Hub:
    return Hub("node-report-rule")


async def _started(db, hub, t, conn):
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, conn.info.session_id, aid)
    assert isinstance(started, wire.Started), started
    return offer, aid, started


async def test_a_different_report_after_a_newer_generation_started_is_stale_token(
    db, tenant, hub
) -> None:
    """Generation 1 failed (retryable) and generation 2 runs: generation 1's token sent with
    another report answers ``stale_token`` (not ``conflict``), is kept as evidence, and the
    task stays with generation 2."""
    t = await tenant(retry={"max_attempts": 3, "backoff_initial_ms": 0})
    task = await t.submit(retry_safe=True)
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    _, aid1, s1 = await _started(db, hub, t, conn)
    err = wire.FailError(type="Flaky", message="try again")
    first = await attempts.report(
        db, t.namespace_id, Report("fail", aid1, s1.execution_token, error=err, retryable=True)
    )
    assert first.task_state == "WAITING"
    _, aid2, s2 = await _started(db, hub, t, conn)
    assert s2.generation == 2
    with pytest.raises(StaleToken) as stale:
        await attempts.report(
            db, t.namespace_id, Report("complete", aid1, s1.execution_token, result=RESULT)
        )
    assert stale.value.code == "stale_token" and stale.value.status == 409
    assert stale.value.details["evidence"] is True
    assert stale.value.details["applied"] == "fail"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "RUNNING" and row["current_attempt_id"] == aid2  # untouched
    late = [e for e in await evidence_rows(db, t, task["id"]) if e["kind"] == "late_complete"]
    assert len(late) == 1 and late[0]["attempt_id"] == aid1
    assert late[0]["result"] == bytes(RESULT).decode()
    assert msgspec.json.decode(late[0]["data"])["reason"] == "report_already_applied"
    # The same stale report again: the same answer, recorded once.
    with pytest.raises(StaleToken):
        await attempts.report(
            db, t.namespace_id, Report("complete", aid1, s1.execution_token, result=RESULT)
        )
    assert (
        len([e for e in await evidence_rows(db, t, task["id"]) if e["kind"] == "late_complete"])
        == 1
    )
    # The applied report itself still replays its receipt.
    again = await attempts.report(
        db, t.namespace_id, Report("fail", aid1, s1.execution_token, error=err, retryable=True)
    )
    assert again.outcome == "replayed" and again.receipt_id == first.receipt_id
    await check_invariants(db, t.namespace_id)


async def test_a_different_report_on_the_last_attempt_is_stale_token_too(db, tenant, hub) -> None:
    t = await tenant()
    task = await t.submit()
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    _, aid, s = await _started(db, hub, t, conn)
    await attempts.report(
        db, t.namespace_id, Report("complete", aid, s.execution_token, result=RESULT)
    )
    with pytest.raises(StaleToken) as stale:
        await attempts.report(
            db, t.namespace_id,
            Report("fail", aid, s.execution_token, error=wire.FailError(type="X", message="m")),
        )  # fmt: skip
    assert stale.value.details == {
        "attempt_id": id_hex(aid), "attempt_state": "SUCCEEDED",
        "evidence": True, "applied": "complete",
    }  # fmt: skip
    assert (await task_row(db, t, task["id"]))["result"] == bytes(RESULT).decode()
    kinds = [e["kind"] for e in await evidence_rows(db, t, task["id"])]
    assert kinds == ["late_fail"]


async def test_a_report_through_another_session_is_applied_while_the_lease_is_live(
    db, tenant, hub
) -> None:
    """The worker reconnected under a new session (its node died): the report it could not
    deliver goes through the new session and is applied — the token and the live lease
    decide, not the session."""
    t = await tenant()
    task = await t.submit()
    old, _ = await open_session(db, t)
    conn = await connect(db, hub, old)
    _, aid, s = await _started(db, hub, t, conn)
    new, new_token = await open_session(db, t)
    app = make_app(db, pulse_routes)
    async with asgi_client(app) as http:
        reply = await http.post(
            f"/v1/namespaces/{t.namespace}/attempts/{id_hex(aid)}/complete",
            headers=bearer(new_token),
            content=b'{"execution_token": "%s", "result": {"total": 10.50}}'
            % s.execution_token.encode(),
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["outcome"] == "applied" and reply.json()["task_state"] == "SUCCEEDED"
    row = await task_row(db, t, task["id"])
    assert row["state"] == "SUCCEEDED" and row["result"] == '{"total": 10.50}'
    assert new.session_id != old.session_id
    await check_invariants(db, t.namespace_id)


async def test_a_late_report_after_the_session_expired_is_kept_as_evidence(db, tenant, hub) -> None:
    """The session expired (recovery lost its attempt): the worker's report over HTTP with
    that session's token is judged by the attempt — 409 ``stale_token`` with the report
    kept as evidence — instead of a 401 that drops it."""
    t = await tenant()
    task = await t.submit()
    info, token = await open_session(db, t)
    conn = await connect(db, hub, info)
    _, aid, s = await _started(db, hub, t, conn)
    later = await db.now() + timedelta(minutes=5)
    await Recovery(db, hub).run_once(now=later)
    assert (await task_row(db, t, task["id"]))["state"] == "NEEDS_REVIEW"
    with pytest.raises(Unauthenticated):  # the ended session opens nothing else
        await sessions.authenticate(db, t.namespace, token, id_hex(info.session_id))
    app = make_app(db, pulse_routes)
    path = f"/v1/namespaces/{t.namespace}/attempts/{id_hex(aid)}"
    body = b'{"execution_token": "%s", "result": {"total": 10.50}}' % s.execution_token.encode()
    async with asgi_client(app) as http:
        reply = await http.post(f"{path}/complete", headers=bearer(token), content=body)
        assert reply.status_code == 409, reply.text
        error = reply.json()["error"]
        assert error["code"] == "stale_token" and error["details"]["evidence"] is True
        # A wrong execution token through the ended session: nothing is recorded.
        wrong = await http.post(
            f"{path}/complete", headers=bearer(token),
            content=b'{"execution_token": "ext_wrong", "result": 1}',
        )  # fmt: skip
        assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "stale_token"
        # Heartbeats and starts stay bound to a live session.
        beat = await http.post(f"{path}/heartbeat", headers=bearer(token))
        assert beat.status_code == 401
        # A token that is no session token at all is still a 401.
        bad = await http.post(f"{path}/complete", headers=bearer("pws_nope"), content=body)
        assert bad.status_code == 401
    late = [e for e in await evidence_rows(db, t, task["id"]) if e["kind"] == "late_complete"]
    assert len(late) == 1 and late[0]["result"] == '{"total": 10.50}'
    assert (await task_row(db, t, task["id"]))["state"] == "NEEDS_REVIEW"  # untouched
    await check_invariants(db, t.namespace_id)
