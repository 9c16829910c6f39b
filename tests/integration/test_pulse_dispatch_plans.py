"""Query plans of the dispatcher at 100,000 waiting tasks (docs/dispatch.md "Queries and
indexes"): the owner probe is one index dive per owner, the claims are index ranges that filter
``available_at`` on the rows they read, and none of them reads the flooding owner's backlog
to reach another owner's tasks (checked by the handler read counters, not only EXPLAIN)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fair_dispatch_support import add_owner, flood, submit_as

from orbit.storage import Tx
from pulse.store import dispatch as dispatch_store

Q = dispatch_store.Q


async def _explain(tx: Tx, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return await tx.fetchall("EXPLAIN " + sql, params)


async def _reads(tx: Tx) -> int:
    rows = await tx.fetchall("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(r["Value"]) for r in rows)


async def test_plans_use_the_dispatch_indexes_at_100k_rows(db, tenant) -> None:
    t = await tenant()
    template = await t.submit()
    await flood(db, t, template["id"], 100_000)  # owner A: 100,001 waiting tasks
    b, c = await add_owner(db), await add_owner(db)
    await submit_as(db, t, b)
    await submit_as(db, t, c, priority=9)
    now = (await db.now()) + timedelta(seconds=1)
    base = {"namespace_id": t.namespace_id, "queue_id": t.queue_id, "now": now, "keys_ok": 1}

    async def run(tx: Tx) -> None:
        # Owner probe: one dive per owner (ORDER BY follows the index, LIMIT 1).
        for after in (None, t.application_id):
            plan = await _explain(tx, Q.task_owner_next, {**base, "after": after})
            assert plan[0]["key"] == "ix_pulse_tasks_owner_dispatch", plan
            assert "filesort" not in plan[0]["Extra"] and "temporary" not in plan[0]["Extra"]
        before = await _reads(tx)
        owners, after = [], None
        while (
            found := await dispatch_store.task_owner_next(tx, t.namespace_id, t.queue_id, after)
        ) is not None:
            owners.append(found[0])
            after = found[0]
        probe_reads = await _reads(tx) - before
        assert sorted(owners) == sorted([t.application_id, b, c])
        assert probe_reads < 100, probe_reads  # 4 dives, not 100,000 entries

        # Queue-wide claim (one owner in play): a range of ix_pulse_tasks_dispatch.
        plan = await _explain(tx, Q.task_claim_due_in_queue, {**base, "limit": 32})
        main = next(r for r in plan if r["table"] == "t")
        assert main["key"] == "ix_pulse_tasks_dispatch" and main["type"] == "range", plan
        assert "available_at <= %(now)s" in Q.task_claim_due_in_queue

        # Per-owner claim: a range of ix_pulse_tasks_owner_dispatch, so B's one task is
        # reached without reading A's 100,000.
        for after in (None, (now - timedelta(days=1), bytes(16))):
            params = {**base, "owner_id": b, "limit": 32,
                      "after_at": after and after[0], "after_id": after and after[1]}  # fmt: skip
            plan = await _explain(tx, Q.task_claim_due_for_owner, params)
            main = next(r for r in plan if r["table"] == "t")
            assert main["key"] == "ix_pulse_tasks_owner_dispatch", plan
            assert main["type"] == "range", plan
        assert "available_at <= %(now)s" in Q.task_claim_due_for_owner
        before = await _reads(tx)
        rows = await dispatch_store.task_claim_due_for_owner(
            tx, t.namespace_id, t.queue_id, b, now, True, 32
        )
        claim_reads = await _reads(tx) - before
        assert [r["owner_id"] for r in rows] == [b]
        assert claim_reads < 100, claim_reads
        # The queue-wide claim of 32 reads about 32 entries, not the backlog either.
        before = await _reads(tx)
        rows = await dispatch_store.task_claim_due_in_queue(
            tx, t.namespace_id, t.queue_id, now, True, 32
        )
        assert len(rows) == 32
        assert await _reads(tx) - before < 500

    # Read-only in effect: the claims' locks end with the transaction, nothing is written.
    await db.transaction(run)
