"""Resolving NEEDS_REVIEW tasks and expiring deadlines, against the real database."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import pytest
from pulse_fixtures import force_state, recount

from orbit.audit import Actor
from orbit.errors import InvalidRequest
from orbit.storage import Database, Tx
from pulse import tasks
from pulse.errors import TaskStateConflict
from pulse.types import Resolve


def resolve_body(**fields) -> Resolve:
    return msgspec.json.decode(msgspec.json.encode(fields), type=Resolve)


async def rows(db: Database, sql: str, *args) -> list[dict]:
    async def run(tx: Tx) -> list[dict]:
        return await tx.fetchall(sql, args)

    return await db.read(run)


async def review_task(db, t) -> dict:
    task = await t.submit(payload={"x": 1})
    await force_state(db, t, task["id"], "NEEDS_REVIEW")
    got = await tasks.get_task(db, t.namespace_id, task["id"])
    assert got["state"] == "NEEDS_REVIEW" and got["effect_uncertain"] is True
    return got


async def test_resolve_retry(db, tenant) -> None:
    t = await tenant(retry={"max_attempts": 1})
    task = await review_task(db, t)
    actor = Actor(t.credential_id, t.application_id)
    view = await tasks.resolve_task(
        db,
        t.namespace_id,
        task["id"],
        resolve_body(action="retry", note="safe to redo"),
        actor=actor,
    )
    assert view["state"] == "WAITING" and view["effect_uncertain"] is False
    assert view["attempts"] == 1 and view["max_attempts"] == 2  # one more attempt allowed
    assert view["resolution"]["action"] == "retry" and view["resolution"]["note"] == "safe to redo"
    assert view["resolution"]["effect_uncertain"] is True
    assert view["resolution"]["by"]["credential_id"] == t.credential_id.hex()
    attempts = await tasks.list_attempts(db, t.namespace_id, task["id"])
    assert [a["state"] for a in attempts["items"]] == ["LOST"]  # history kept
    ev = attempts["items"][0]["evidence"]
    assert [e["kind"] for e in ev] == ["operator_resolution"]
    assert ev[0]["data"]["note"] == "safe to redo"
    audit = await rows(
        db,
        "SELECT action, resource_id FROM orbit_audit_events WHERE namespace_id = %s",
        t.namespace_id,
    )
    assert [(a["action"], a["resource_id"]) for a in audit] == [("tasks.resolve", task["id"])]
    results = await rows(
        db,
        "SELECT type FROM orbit_result_events WHERE namespace_id = %s ORDER BY seq",
        t.namespace_id,
    )
    assert [r["type"] for r in results] == ["task.needs_review"]  # WAITING has no result event
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["usage"]["unfinished_tasks"] == 1


async def test_resolve_succeed_and_fail(db, tenant) -> None:
    t = await tenant()
    a = await review_task(db, t)
    b = await review_task(db, t)
    actor = Actor(t.credential_id, t.application_id)
    body = msgspec.json.decode(
        b'{"action": "succeed", "note": "done by hand", "result": {"v": 1.10}}', type=Resolve
    )
    va = await tasks.resolve_task(db, t.namespace_id, a["id"], body, actor=actor)
    assert va["state"] == "SUCCEEDED" and va["finished_at"] is not None
    assert bytes(va["result"]) == b'{"v": 1.10}'
    vb = await tasks.resolve_task(
        db, t.namespace_id, b["id"], resolve_body(action="fail", note="gave up"), actor=actor
    )
    assert vb["state"] == "FAILED" and vb["error"] == {
        "type": "operator_failed",
        "message": "gave up",
    }
    results = await rows(
        db,
        "SELECT seq, type, result, task_id FROM orbit_result_events WHERE namespace_id = %s"
        " ORDER BY seq",
        t.namespace_id,
    )
    assert [r["type"] for r in results] == [
        "task.needs_review",
        "task.needs_review",
        "task.succeeded",
        "task.failed",
    ]
    assert [r["seq"] for r in results] == [1, 2, 3, 4]
    assert results[2]["result"] == '{"v": 1.10}'
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["usage"]["unfinished_tasks"] == 0
    # resolving again: no longer NEEDS_REVIEW
    with pytest.raises(TaskStateConflict):
        await tasks.resolve_task(
            db, t.namespace_id, a["id"], resolve_body(action="retry", note="again"), actor=actor
        )


async def test_resolve_rules(db, tenant) -> None:
    t = await tenant()
    actor = Actor(t.credential_id, t.application_id)
    waiting = await t.submit()
    with pytest.raises(TaskStateConflict) as info:
        await tasks.resolve_task(
            db, t.namespace_id, waiting["id"], resolve_body(action="retry", note="n"), actor=actor
        )
    assert info.value.details["state"] == "WAITING"
    task = await review_task(db, t)
    with pytest.raises(InvalidRequest):
        await tasks.resolve_task(
            db,
            t.namespace_id,
            task["id"],
            resolve_body(action="retry", note="n", result=1),
            actor=actor,
        )
    with pytest.raises(InvalidRequest):
        await tasks.resolve_task(
            db,
            t.namespace_id,
            task["id"],
            resolve_body(action="succeed", note="n", error={"a": 1}),
            actor=actor,
        )
    with pytest.raises(msgspec.ValidationError):
        resolve_body(action="retry", note="")
    with pytest.raises(msgspec.ValidationError):
        resolve_body(action="delete", note="n")
    assert (await tasks.get_task(db, t.namespace_id, task["id"]))["state"] == "NEEDS_REVIEW"


async def test_expire_deadlines(db, tenant) -> None:
    t = await tenant()
    now = await db.now()
    soon = (now + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    late = (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    expiring = await t.submit(deadline_at=soon)
    keeps = await t.submit(deadline_at=late)
    nodeadline = await t.submit()
    leased = await t.submit(deadline_at=soon)
    await force_state(db, t, leased["id"], "LEASED")  # not WAITING: the start check covers it
    # The sweep covers every namespace: other tests' tenants may have tasks past their
    # deadline already. None of this tenant's is, yet.
    await tasks.expire_deadlines_once(db, now=now)
    for task in (expiring, keeps, nodeadline):
        assert (await tasks.get_task(db, t.namespace_id, task["id"]))["state"] == "WAITING"
    later = now + timedelta(seconds=10)
    n = await tasks.expire_deadlines_once(db, now=later)
    assert n >= 1  # other tests' tenants may have expiring tasks too
    got = await tasks.get_task(db, t.namespace_id, expiring["id"])
    assert got["state"] == "FAILED" and got["error"]["type"] == "deadline_exceeded"
    assert datetime.fromisoformat(got["finished_at"].rstrip("Z")) == later
    for other in (keeps, nodeadline):
        assert (await tasks.get_task(db, t.namespace_id, other["id"]))["state"] == "WAITING"
    assert (await tasks.get_task(db, t.namespace_id, leased["id"]))["state"] == "LEASED"
    results = await rows(
        db,
        "SELECT type, task_id FROM orbit_result_events WHERE namespace_id = %s AND type = %s",
        t.namespace_id,
        "task.failed",
    )
    assert [r["task_id"].hex() for r in results] == [expiring["id"]]
    c = await recount(db, t)
    assert c["usage"] == c["rows"]
    assert (await tasks.get_task(db, t.namespace_id, expiring["id"]))["state_version"] == 2
