"""Dispatch keeps going while the retention purge deletes a history: the real task lifecycle
(submit, dispatch, start, complete) runs in a loop while the purge removes a few thousand
finished tasks with their attempts and events in small batches. The bound is generous (it
separates "dispatch waits behind the purge" from "dispatch shares the box with it"); the
figures for a million tasks come from ``python -m bench.retention_purge``."""

from __future__ import annotations

import asyncio

from pulse_fixtures import Tenant, TenantFactory
from pulse_worker_support import connect, open_session

from bench.retention_purge import _lifecycle, _populate, _summary
from orbit import retention
from orbit.audit import CLI_ACTOR
from orbit.context import AppContext
from orbit.retention import RetentionPut
from orbit.retention_purge import RetentionPurge
from orbit.settings import Settings
from orbit.storage import Database, Tx
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.task_purge import TaskPurge, oldest_unfinished_task

TASKS = 3000


async def finished_rows(db: Database, t: Tenant) -> int:
    async def run(tx: Tx) -> int:
        return int(await tx.fetchval(
            "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND kind = 'bench'",
            (t.namespace_id,),
        ))  # fmt: skip

    return await db.read(run)


async def test_dispatch_runs_while_the_purge_deletes(db: Database, tenant: TenantFactory) -> None:
    t = await tenant()
    await _populate(db, t.namespace_id, t.application_id, t.queue_id, TASKS)
    assert await finished_rows(db, t) == TASKS
    hub = Hub("node-purge")
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    await retention.put_retention(
        db, CLI_ACTOR, t.namespace_id, RetentionPut(finished_tasks_days=7, events_days=7)
    )
    purge = RetentionPurge(
        AppContext(db=db, settings=Settings(retention_purge_batch=100)),
        parts=[TaskPurge()], holders=[oldest_unfinished_task],
    )  # fmt: skip
    out: dict[str, list[float]] = {k: [] for k in (
        "submit", "dispatch", "start", "complete", "cycle", "dispatch_retries")}  # fmt: skip
    stop = asyncio.Event()
    probe = asyncio.create_task(
        _lifecycle(db, t.namespace_id, t.application_id, conn, Dispatcher(db, hub), stop, out)
    )
    passes = 0
    try:
        # Passes until every old row is gone: a pass skips a row another transaction holds
        # locked at that moment (SKIP LOCKED), which a later pass takes, so one caught-up
        # pass does not yet mean nothing is left while dispatch runs.
        while passes < 50:
            passes += 1
            res = await purge.purge_namespace(t.namespace_id)
            if res.lag_s == 0 and not res.deleted and await finished_rows(db, t) == 0:
                break
    finally:
        stop.set()
        await probe
    assert await finished_rows(db, t) == 0
    dispatch = _summary(out["dispatch"])
    assert dispatch["n"] >= 5, dispatch  # the lifecycle kept turning during the purge
    assert dispatch["max_ms"] < 5000, dispatch  # never stuck behind the purge
