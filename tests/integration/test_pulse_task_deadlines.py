"""Task deadlines in pulse_task_deadlines (migration 0018): a row per task submitted with a
deadline, none for the others; the sweep fails the WAITING ones past it through the rows'
due index, keeps the rows of tasks still in flight, and deletes the rows of finished tasks
once their deadline passed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pulse_fixtures import force_state

from orbit.storage import Database, Tx
from pulse import tasks
from pulse.store.tasks import Q


async def _deadline_rows(db: Database, ns: bytes) -> set[str]:
    async def run(tx: Tx) -> set[str]:
        rows = await tx.fetchall(
            "SELECT task_id FROM pulse_task_deadlines WHERE namespace_id = %s", (ns,)
        )
        return {bytes(r["task_id"]).hex() for r in rows}

    return await db.read(run)


async def test_deadline_rows_live_until_the_sweep_drops_them(db: Database, tenant: Any) -> None:
    t = await tenant()
    now = await db.now()
    soon = (now + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    expiring = await t.submit(deadline_at=soon)
    cancelled = await t.submit(deadline_at=soon)
    leased = await t.submit(deadline_at=soon)
    plain = await t.submit()
    await tasks.cancel_task(db, t.namespace_id, cancelled["id"])
    await force_state(db, t, leased["id"], "LEASED")
    ns = t.namespace_id
    # One row per task with a deadline, whatever became of it; none without one.
    assert await _deadline_rows(db, ns) == {expiring["id"], cancelled["id"], leased["id"]}
    assert plain["id"] not in await _deadline_rows(db, ns)
    # Before the deadline: nothing fails, nothing is deleted.
    await tasks.expire_deadlines_once(db, now=now)
    assert len(await _deadline_rows(db, ns)) == 3
    later = now + timedelta(seconds=10)
    assert await tasks.expire_deadlines_once(db, now=later) >= 1  # other tenants' too
    got = await tasks.get_task(db, ns, expiring["id"])
    assert got["state"] == "FAILED" and got["error"]["type"] == "deadline_exceeded"
    assert (await tasks.get_task(db, ns, leased["id"]))["state"] == "LEASED"
    # The finished tasks' rows are gone; the task in flight keeps its row (it may come back
    # to WAITING, and then its deadline still holds).
    assert await _deadline_rows(db, ns) == {leased["id"]}


async def test_the_sweep_reads_the_deadline_index(db: Database) -> None:
    now = await db.now()

    async def run(tx: Tx) -> None:
        for sql in (Q.task_expire_candidates, Q.deadline_stale_rows):
            plan = await tx.fetchall("EXPLAIN " + sql, {"now": now, "limit": 500})
            d = next(r for r in plan if r["table"] == "d")
            assert d["key"] == "ix_pulse_task_deadlines_due" and d["type"] in ("range", "index")
            assert "filesort" not in (d["Extra"] or ""), plan
            t = next(r for r in plan if r["table"] == "t")
            assert t["key"] == "PRIMARY" and t["type"] == "eq_ref", plan

    await db.read(run)
