"""Query plans of the task queries re-planned by migration 0018 (the lean write path: no
ix_pulse_tasks_dispatch, no ix_pulse_tasks_owner, identities in pulse_task_identities), at
20,000 waiting tasks of one owner that are not due: each reads the index it is written for,
and the ones with a bound read about that bound, not the backlog (checked by the handler
read counters, not only EXPLAIN)."""

from __future__ import annotations

from typing import Any

from fair_dispatch_support import add_owner, flood, submit_as

from orbit.storage import Tx
from pulse.store import queue_depth as depth_store
from pulse.store import sessions as session_store
from pulse.store import tasks as task_store
from pulse.store import watchdog as watchdog_store
from pulse.store.queue_depth import Q as DEPTH_Q
from pulse.store.queues import Q as QUEUE_Q
from pulse.store.sessions import Q as SESSION_Q
from pulse.store.tasks import Q as TASK_Q
from pulse.store.watchdog import Q as WATCHDOG_Q

BACKLOG = 20_000


async def _reads(tx: Tx) -> int:
    rows = await tx.fetchall("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(r["Value"]) for r in rows)


async def _explain(tx: Tx, sql: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return list(await tx.fetchall("EXPLAIN " + sql, args))


def _on(plan: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The plan row of pulse_tasks (table ``pulse_tasks``, or a derived table's inner read)
    that uses ``key``."""
    rows = [r for r in plan if r.get("key") == key]
    assert rows, plan
    return rows[0]


async def _not_due_backlog(db: Any, tenant: Any) -> Any:
    t = await tenant()
    template = await t.submit(delay_ms=86_400_000)  # due tomorrow
    await flood(db, t, template["id"], BACKLOG, older_s=-60)  # later still: none is due
    return t


async def test_the_submit_offer_check_reads_a_bounded_head(db, tenant) -> None:
    t = await _not_due_backlog(db, tenant)
    ns, q = t.namespace_id, t.queue_id
    other = await add_owner(db)
    now = await db.now()
    mine = await t.submit()  # due now: sorts before the owner's backlog in its subject
    mine_id = bytes.fromhex(mine["id"])
    args = {"namespace_id": ns, "queue_id": q, "now": now, "ids": (mine_id,), "scan": 17}

    async def run(tx: Tx) -> None:
        plan = await _explain(tx, SESSION_Q.session_queue_has_due_work, args)
        inner = _on(plan, "ix_pulse_tasks_fair")
        assert inner["type"] in ("ref", "range") and "filesort" not in (inner["Extra"] or ""), plan
        before = await _reads(tx)
        # Nothing due but its own task among the first entries, and more WAITING tasks than
        # it reads: counted as due work (the round dispatches), after reading the bound only.
        assert await session_store.session_queue_has_due_work(tx, ns, q, now, [mine_id])
        assert await _reads(tx) - before < 100

    await db.read(run)
    # A due task of another subject: due work, whatever the backlog.
    await submit_as(db, t, other)
    later = await db.now()

    async def run_due(tx: Tx) -> None:
        assert await session_store.session_queue_has_due_work(tx, ns, q, later, [mine_id])

    await db.read(run_due)


async def test_the_submit_offer_check_sees_only_its_own_tasks(db, tenant) -> None:
    t = await tenant()
    created = [bytes.fromhex((await t.submit())["id"]) for _ in range(3)]
    now = await db.now()

    async def run(tx: Tx) -> None:
        ns, q = t.namespace_id, t.queue_id
        assert not await session_store.session_queue_has_due_work(tx, ns, q, now, created)
        assert await session_store.session_queue_has_due_work(tx, ns, q, now, created[:2])

    await db.read(run)


async def test_queue_depth_and_counts_read_the_fair_index(db, tenant) -> None:
    t = await _not_due_backlog(db, tenant)
    ns, q = t.namespace_id, t.queue_id
    now = await db.now()
    base = {"namespace_id": ns, "queue_id": q}

    async def run(tx: Tx) -> None:
        for sql, args in (
            (DEPTH_Q.queue_depth_oldest_waiting, {**base, "head": 1000, "now": now}),
            (DEPTH_Q.queue_depth_needs_review_capped, {**base, "cap": 10}),
            (QUEUE_Q.queue_count_by_state, base),
            (SESSION_Q.session_keyed_waiting, base),
            (WATCHDOG_Q.watchdog_count_stuck_in_queue, base),
        ):
            plan = await _explain(tx, sql, args)
            row = _on(plan, "ix_pulse_tasks_fair")
            assert "filesort" not in (row["Extra"] or ""), (sql, plan)
        # The oldest wait reads its head (1,000 entries, then their materialized copy), not
        # the 20,000.
        before = await _reads(tx)
        assert await depth_store.queue_depth_oldest_waiting(tx, ns, q, 1000, now) == 0.0
        assert await _reads(tx) - before < 2_200
        before = await _reads(tx)
        assert not await session_store.session_keyed_waiting(tx, ns, q)
        assert await _reads(tx) - before < 2_200
        assert await watchdog_store.count_stuck_in_queue(tx, ns, q) == 0

    await db.read(run)


async def test_bulk_cancel_candidates_read_ranges(db, tenant) -> None:
    t = await _not_due_backlog(db, tenant)
    ns, q = t.namespace_id, t.queue_id
    args = {"namespace_id": ns, "owner_id": t.application_id, "queue_id": None, "kind": None,
            "limit": 50}  # fmt: skip

    async def run(tx: Tx) -> None:
        plan = await _explain(tx, TASK_Q.task_cancel_candidates_by_owner, args)
        row = _on(plan, "ix_pulse_tasks_state_age")
        assert row["type"] == "range", plan
        plan = await _explain(tx, TASK_Q.task_cancel_candidates_by_queue, {**args, "queue_id": q})
        row = _on(plan, "ix_pulse_tasks_fair")
        assert row["type"] == "range", plan
        before = await _reads(tx)
        got = await task_store.task_cancel_candidates(tx, ns, t.application_id, None, None, 50)
        assert len(got) == 50 and await _reads(tx) - before < 200
        before = await _reads(tx)
        got = await task_store.task_cancel_candidates(tx, ns, None, q, None, 50)
        assert len(got) == 50 and await _reads(tx) - before < 200

    await db.read(run)


async def test_identity_reads_are_primary_key_reads(db, tenant) -> None:
    t = await tenant()
    task = await t.submit(dedup_key="plan-1")
    ns = t.namespace_id
    one = {"namespace_id": ns, "owner_id": t.application_id, "kind": task["kind"],
           "pipeline_version": task["pipeline_version"], "dedup_key": "plan-1"}  # fmt: skip
    many = {"namespace_id": ns, "owner_id": t.application_id,
            "identities": ((task["kind"], task["pipeline_version"], "plan-1"),
                           (task["kind"], task["pipeline_version"], "plan-2"))}  # fmt: skip

    async def run(tx: Tx) -> None:
        for sql, args in ((TASK_Q.task_get_by_identity, one), (TASK_Q.identity_find_tasks, many)):
            plan = await _explain(tx, sql, args)
            assert all(r["key"] == "PRIMARY" for r in plan if r["table"] is not None), plan
            assert all(r["type"] != "ALL" for r in plan), plan
        row = await task_store.task_get_by_identity(
            tx, ns, t.application_id, task["kind"], task["pipeline_version"], "plan-1"
        )
        assert row is not None and row["id"].hex() == task["id"]
        found = await task_store.task_find_identities(
            tx, ns, t.application_id, many["identities"]
        )
        assert list(found) == [(task["kind"], task["pipeline_version"], "plan-1")]

    await db.read(run)
