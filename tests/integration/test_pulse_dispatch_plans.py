"""Query plans of the node dispatch round at 100,000 waiting tasks (docs/dispatch.md "Queries
and indexes"): the claim parts are ranges of ``ix_pulse_tasks_fair`` that filter
``available_at`` on the rows they read and never read the flooding owner's backlog to reach
another owner's tasks (checked by the handler read counters, not only EXPLAIN); the look is
one index dive per fairness subject, whatever a subject's backlog (a recursive CTE's walk read
every earlier subject's entries at each step: about 200,000 entries here)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fair_dispatch_support import add_owner, flood, submit_as

from orbit.storage import Tx
from pulse.store import dispatch as dispatch_store

Q = dispatch_store.Q


async def _reads(tx: Tx) -> int:
    rows = await tx.fetchall("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(r["Value"]) for r in rows)


async def _flooded(db: Any, tenant: Any) -> tuple[Any, bytes, bytes, Any]:
    t = await tenant()
    template = await t.submit()
    await flood(db, t, template["id"], 100_000)  # owner A: 100,001 waiting tasks
    b, c = await add_owner(db), await add_owner(db)
    await submit_as(db, t, b)
    await submit_as(db, t, c, priority=9)
    return t, b, c, (await db.now()) + timedelta(seconds=1)


async def test_claims_use_the_fair_dispatch_index_at_100k_rows(db, tenant) -> None:
    t, b, _, now = await _flooded(db, tenant)
    ns, q = t.namespace_id, t.queue_id

    async def run(tx: Tx) -> None:
        # A claim part: a range of ix_pulse_tasks_fair, so B's one task is reached without
        # reading A's 100,000.
        args: list[Any] = [ns, q, b, now, now, now, 1, 32]
        plan = await tx.fetchall("EXPLAIN " + Q.round_claim_part, args)
        main = next(r for r in plan if r["table"] == "t")
        assert main["key"] == "ix_pulse_tasks_fair" and main["type"] in ("ref", "range"), plan
        assert "t.available_at <= %s" in Q.round_claim_part
        before = await _reads(tx)
        rows = await dispatch_store.round_claim(tx, [(ns, q, b, True, 32)], now)
        assert [bytes(r["owner_id"]) for r in rows] == [b]
        assert await _reads(tx) - before < 100
        # A claim of 32 of A's tasks reads about 32 entries, not the backlog either.
        before = await _reads(tx)
        rows = await dispatch_store.round_claim(tx, [(ns, q, t.application_id, True, 32)], now)
        assert len(rows) == 32
        assert await _reads(tx) - before < 500

    # Read-only in effect: the claims' locks end with the transaction, nothing is written.
    await db.transaction(run)


async def test_the_look_is_one_dive_per_subject_at_100k_rows(db, tenant) -> None:
    t, b, c, now = await _flooded(db, tenant)
    ns, q = t.namespace_id, t.queue_id
    subjects = sorted([t.application_id, b, c])

    async def run(tx: Tx) -> None:
        # From the first subject, with no hint (more than one round trip: 1 step, then more)
        # and with the last look's count (one round trip); after a subject; cut at 2.
        for after, expect, limit, want in [
            (None, None, 128, subjects),
            (None, {(ns, q): 0}, 128, subjects),
            (None, {(ns, q): 3}, 128, subjects),
            (subjects[0], None, 128, subjects[1:]),
            (None, None, 2, subjects[:2]),
        ]:
            before = await _reads(tx)
            look = await dispatch_store.round_look(tx, [((ns, q), after)], limit, now, expect)
            look_reads = await _reads(tx) - before
            assert [bytes(r["subject"]) for r in look] == want
            assert [int(r["n"]) for r in look] == list(range(1, len(want) + 1))
            firsts = {bytes(r["subject"]): bytes(r["owner_id"]) for r in look}
            assert all(firsts[s] == s for s in want)  # no fairness key: the owner is the subject
            # A few dives per subject (the walk's, its first task's), not 100,000 entries.
            assert look_reads < 100, (after, expect, look_reads)

    await db.read(run)
