"""The lock order (application resources → queue → task/attempt → permit) in the operator
transactions that change usage counters: a re-run (single and bulk), a schedule trigger, a
backfill and a scheduler step under ``cancel_previous`` that fires into one queue and
cancels in another — checked statement by statement with the recorder of
tests/integration/test_lock_order_all.py."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
from pulse_fixtures import Tenant

from orbit.audit import Actor
from orbit.storage import Database, Tx
from orbit.times import format_time
from pulse import rerun, schedule_controls, schedules, tasks
from pulse.scheduler import advance
from pulse.store import schedules as schedule_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lock_order_all import Checker, install


async def test_operator_transactions_lock_usage_rows_first(
    db: Database, tenant: Callable[..., Awaitable[Tenant]], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = await tenant()
    ns = t.namespace_id
    actor = Actor(t.credential_id, t.application_id)
    await t.add_queue("other", max_unfinished_tasks=100)
    rec = install(monkeypatch)
    c = Checker(rec)

    # Re-run: one task, then every cancelled task of two queues in one batch.
    done = await t.submit()
    await tasks.cancel_task(db, ns, done["id"])
    await c.check("rerun", rerun.rerun_task(db, ns, done["id"], rerun.Rerun(note="n"), actor=actor))
    for queue in ("default", "other", "default"):
        task = await t.submit(queue=queue, kind="bulk")
        await tasks.cancel_task(db, ns, task["id"])
    bulk = msgspec.convert({"note": "n", "kind": "bulk"}, rerun.RerunBulk)
    out = await c.check("rerun bulk (two queues)", rerun.rerun_bulk(db, ns, bulk, actor=actor))
    assert out["retried"] == 3

    # A schedule's trigger and backfill (tasks in its queue), and a scheduler step that
    # cancels the previous run in another queue (the version moved to "other").
    body = msgspec.convert(
        {"queue": "default", "every_ms": 60_000, "task": {"kind": "tick"},
         "overlap": "cancel_previous", "catchup_window_ms": 86_400_000},
        schedules.SchedulePut,
    )  # fmt: skip
    start = (await db.now()).replace(second=0, microsecond=0) - timedelta(minutes=30)
    await schedules.put_schedule(db, ns, t.application_id, "tick", body, now=start)
    await c.check(
        "schedule trigger",
        schedule_controls.trigger_schedule(
            db, ns, "tick", schedule_controls.TriggerBody(), now=start + timedelta(seconds=1)
        ),
    )
    span = msgspec.convert(
        {"from": format_time(start - timedelta(minutes=5)), "to": format_time(start)},
        schedule_controls.BackfillBody,
    )
    await c.check(
        "schedule backfill",
        schedule_controls.backfill_schedule(db, ns, "tick", span, now=start + timedelta(seconds=2)),
    )
    moved = msgspec.convert(
        {"queue": "other", "every_ms": 60_000, "task": {"kind": "tick"},
         "overlap": "cancel_previous", "catchup_window_ms": 86_400_000},
        schedules.SchedulePut,
    )  # fmt: skip
    await schedules.put_schedule(db, ns, t.application_id, "tick", moved,
                                 now=start + timedelta(seconds=3))  # fmt: skip

    async def step(tx: Tx) -> None:
        row = await schedule_store.schedule_get_by_name(tx, ns, "tick", for_update=True)
        assert row is not None
        res = await advance(tx, row, start + timedelta(minutes=3))
        assert res.fired >= 2

    async def cancelled(tx: Tx) -> int:
        n = await tx.fetchval(
            "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND kind = 'tick'"
            " AND state = 'CANCELLED'", (ns,),
        )  # fmt: skip
        return int(n)

    await c.check("scheduler step (cancel_previous, two queues)", db.transaction(step))
    assert await db.read(cancelled) >= 3  # the trigger's run and the runs it replaced

    assert not c.failures, "lock order broken:\n" + "\n".join(
        f"{name}: {p}" for name, ps in c.failures.items() for p in ps
    )
