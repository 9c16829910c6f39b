"""Queues and gates against the real database: create/update with revisions and
preconditions, counts and usage, list paging, pause/resume of queue and namespace gates."""

from __future__ import annotations

import asyncio

import pytest
from event_rows import raw_events
from pulse_fixtures import force_state

from orbit.audit import Actor
from orbit.errors import InvalidRequest, PreconditionFailed
from orbit.http.etag import Preconditions
from orbit.storage import Database, Tx
from pulse import queues
from pulse.errors import QueueNotFound
from pulse.types import QueuePut, RetryPolicy


async def _raw_events(db: Database, ns: bytes, kind: str) -> list[dict]:
    async def run(tx: Tx) -> list[dict]:
        return await raw_events(tx, ns, subject_kind=kind)

    return await db.read(run)


async def test_put_creates_then_updates_with_revision(db, tenant) -> None:
    t = await tenant()
    res = await queues.put_queue(
        db, t.namespace_id, "mail", QueuePut(max_concurrency=4, lease_ms=5000)
    )
    assert res.created and res.revision == 1
    assert res.queue["max_concurrency"] == 4 and res.queue["lease_ms"] == 5000
    assert res.queue["usage"]["unfinished_tasks"] == 0
    assert res.queue["counts"]["WAITING"] == 0

    same = await queues.put_queue(
        db, t.namespace_id, "mail", QueuePut(max_concurrency=4, lease_ms=5000)
    )
    assert not same.created and same.revision == 1  # identical PUT: no-op, same ETag

    upd = await queues.put_queue(
        db,
        t.namespace_id,
        "mail",
        QueuePut(max_concurrency=8, retry=RetryPolicy(max_attempts=5)),
        pre=Preconditions(if_match=frozenset({1})),
    )
    assert not upd.created and upd.revision == 2
    assert upd.queue["retry"]["max_attempts"] == 5
    assert upd.queue["lease_ms"] == 30000  # PUT replaces: absent fields take defaults

    types = [e["type"] for e in await _raw_events(db, t.namespace_id, "queue")]
    assert types.count("queue.created") == 2  # default + mail
    assert types.count("queue.updated") == 1


async def test_preconditions(db, tenant) -> None:
    t = await tenant()
    match1 = Preconditions(if_match=frozenset({1}))
    create_only = Preconditions(if_none_match_any=True)
    with pytest.raises(PreconditionFailed):
        await queues.put_queue(db, t.namespace_id, "q", QueuePut(), pre=match1)
    with pytest.raises(PreconditionFailed):
        await queues.put_queue(
            db, t.namespace_id, "q", QueuePut(), pre=Preconditions(if_match_any=True)
        )
    created = await queues.put_queue(db, t.namespace_id, "q", QueuePut(), pre=create_only)
    assert created.created
    with pytest.raises(PreconditionFailed):
        await queues.put_queue(db, t.namespace_id, "q", QueuePut(), pre=create_only)
    with pytest.raises(PreconditionFailed) as info:
        await queues.put_queue(
            db,
            t.namespace_id,
            "q",
            QueuePut(max_concurrency=1),
            pre=Preconditions(if_match=frozenset({7})),
        )
    assert info.value.details["current_revision"] == 1
    # nothing changed by the refused update
    assert (await queues.get_queue(db, t.namespace_id, "q"))["max_concurrency"] is None


async def test_backoff_max_below_initial_is_400(db, tenant) -> None:
    t = await tenant()
    body = QueuePut(retry=RetryPolicy(backoff_initial_ms=5000, backoff_max_ms=10))
    with pytest.raises(InvalidRequest) as info:
        await queues.put_queue(db, t.namespace_id, "bad", body)
    assert info.value.field == "retry.backoff_max_ms"


async def test_concurrent_creates_make_one_queue(db, tenant) -> None:
    t = await tenant()
    results = await asyncio.gather(
        *(queues.put_queue(db, t.namespace_id, "race", QueuePut()) for _ in range(6))
    )
    assert sum(r.created for r in results) == 1
    assert len({r.queue["id"] for r in results}) == 1


async def test_config_change_never_resets_usage(db, tenant) -> None:
    t = await tenant()
    for _ in range(3):
        await t.submit()
    before = await queues.get_queue(db, t.namespace_id, t.queue)
    assert before["usage"]["unfinished_tasks"] == 3
    assert before["counts"]["WAITING"] == 3
    await queues.put_queue(db, t.namespace_id, t.queue, QueuePut(max_unfinished_tasks=1))
    after = await queues.get_queue(db, t.namespace_id, t.queue)
    assert after["revision"] == before["revision"] + 1
    assert after["usage"]["unfinished_tasks"] == 3  # lowering a limit revokes nothing


async def test_counts_by_state(db, tenant) -> None:
    t = await tenant()
    a = await t.submit()
    b = await t.submit()
    await t.submit()
    await force_state(db, t, a["id"], "LEASED")
    await force_state(db, t, b["id"], "RUNNING")
    q = await queues.get_queue(db, t.namespace_id, t.queue)
    assert q["counts"] == {
        "WAITING": 1,
        "LEASED": 1,
        "RUNNING": 1,
        "SUCCEEDED": 0,
        "FAILED": 0,
        "CANCELLED": 0,
        "NEEDS_REVIEW": 0,
    }
    assert q["usage"]["reservations"] == 1 and q["usage"]["active_attempts"] == 1


async def test_get_unknown_and_other_namespace_is_404(db, tenant) -> None:
    t = await tenant()
    other = await tenant()
    await other.add_queue("private")
    with pytest.raises(QueueNotFound):
        await queues.get_queue(db, t.namespace_id, "private")
    with pytest.raises(QueueNotFound):
        await queues.set_queue_paused(db, t.namespace_id, "private", True)


async def test_list_pages_by_name(db, tenant) -> None:
    t = await tenant()
    for name in ("a1", "a2", "a3", "a4"):
        await t.add_queue(name)
    page = await queues.list_queues(db, t.namespace_id, limit=2)
    assert [q["name"] for q in page["items"]] == ["a1", "a2"]
    assert page["next_cursor"]
    page2 = await queues.list_queues(db, t.namespace_id, limit=2, cursor=page["next_cursor"])
    assert [q["name"] for q in page2["items"]] == ["a3", "a4"]
    page3 = await queues.list_queues(db, t.namespace_id, limit=2, cursor=page2["next_cursor"])
    assert [q["name"] for q in page3["items"]] == ["default"]
    assert page3["next_cursor"] is None
    assert "usage" in page["items"][0]
    with pytest.raises(InvalidRequest):
        await queues.list_queues(db, t.namespace_id, cursor="not-a-cursor!")


async def test_pause_resume_queue_gate_idempotent(db, tenant) -> None:
    t = await tenant()
    actor = Actor(t.credential_id, t.application_id)
    q = await queues.set_queue_paused(db, t.namespace_id, t.queue, True, actor=actor)
    assert q["paused"] and q["gate"]["control_revision"] == 1
    q = await queues.set_queue_paused(db, t.namespace_id, t.queue, True, actor=actor)
    assert q["paused"] and q["gate"]["control_revision"] == 1  # idempotent: no bump

    async def closed(tx: Tx) -> bool:
        return await queues.gate_closed(tx, t.namespace_id, t.queue_id)

    assert await db.read(closed)
    q = await queues.set_queue_paused(db, t.namespace_id, t.queue, False, actor=actor)
    assert not q["paused"] and q["gate"]["control_revision"] == 2
    assert not await db.read(closed)
    assert q["revision"] == 1  # the gate has its own revision, the config is untouched

    async def audits(tx: Tx) -> list[str]:
        rows = await tx.fetchall(
            "SELECT action FROM orbit_audit_events WHERE namespace_id = %s ORDER BY created_at",
            (t.namespace_id,),
        )
        return [r["action"] for r in rows]

    assert await db.read(audits) == ["queues.pause", "queues.resume"]


async def test_namespace_gate_closes_every_queue(db, tenant) -> None:
    t = await tenant()
    other_q = await t.add_queue("other")
    gate = await queues.set_namespace_paused(db, t.namespace_id, True)
    assert gate["paused"] and gate["control_revision"] == 1

    async def closed(tx: Tx, qid: bytes) -> bool:
        return await queues.gate_closed(tx, t.namespace_id, qid)

    assert await db.read(lambda tx: closed(tx, t.queue_id))
    assert await db.read(lambda tx: closed(tx, other_q))
    q = await queues.get_queue(db, t.namespace_id, "other")
    assert q["namespace_paused"] and not q["paused"]
    # another namespace is not affected
    o = await tenant()
    assert not await db.read(lambda tx: queues.gate_closed(tx, o.namespace_id, o.queue_id))
    gate = await queues.set_namespace_paused(db, t.namespace_id, False)
    assert not gate["paused"] and gate["control_revision"] == 2
    assert (await queues.get_namespace_gate(db, t.namespace_id))["paused"] is False
