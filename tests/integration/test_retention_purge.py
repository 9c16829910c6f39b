"""The retention purge against the real database: each window (finished tasks, raw events,
result events with their deliveries, audit), what is kept whatever its age (unfinished
tasks and their events, attempts in flight, evidence younger than the window, result
events a subscription still needs), tenant isolation, and the delete triggers, which still
refuse every ordinary delete and every delete of a row younger than its window."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pymysql
import pytest
from pulse_fixtures import Tenant, TenantFactory

from orbit import audit, idempotency, retention
from orbit.audit import CLI_ACTOR
from orbit.context import AppContext
from orbit.events import append_event
from orbit.ids import new_id, parse_id
from orbit.retention import RetentionPut
from orbit.retention_purge import RetentionPurge
from orbit.settings import Settings
from orbit.storage import Database, Tx
from orbit.subscriptions import SubscriptionPut, delete_subscription, put_subscription
from pulse import tasks as task_service
from pulse.task_purge import TaskPurge, oldest_unfinished_task
from weave.retention import oldest_running_instance, running_instance_tasks

DAY = timedelta(days=1)
EARLIEST = SubscriptionPut(start="earliest")


def purger(db: Database, **settings: Any) -> RetentionPurge:
    ctx = AppContext(db=db, settings=Settings(**settings))
    return RetentionPurge(
        ctx, parts=[TaskPurge(running_instance_tasks)],
        holders=[oldest_unfinished_task, oldest_running_instance],
    )  # fmt: skip


async def set_retention(t: Tenant, **windows: int | None) -> dict[str, Any]:
    return await retention.put_retention(t.db, CLI_ACTOR, t.namespace_id, RetentionPut(**windows))


async def finished_task(t: Tenant, at: datetime, **fields: Any) -> bytes:
    """A task submitted and cancelled at ``at`` (its events and result event dated then)."""
    task = await t.submit(**fields)
    res = await task_service.cancel_task(t.db, t.namespace_id, task["id"], now=at)
    assert res.task["state"] == "CANCELLED"
    return parse_id(task["id"])


async def count(db: Database, sql: str, *args: Any) -> int:
    async def run(tx: Tx) -> int:
        return int(await tx.fetchval(sql, args))

    return await db.read(run)


async def task_exists(t: Tenant, task_id: bytes) -> bool:
    sql = "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND id = %s"
    return await count(t.db, sql, t.namespace_id, task_id) == 1


async def rows(t: Tenant, table: str) -> int:
    return await count(t.db, f"SELECT COUNT(*) FROM {table} WHERE namespace_id = %s", t.namespace_id)


async def backdate_task(t: Tenant, task_id: bytes, at: datetime) -> None:
    """Move a task's own times into the past (pulse_tasks is mutable; history is not)."""

    async def run(tx: Tx) -> None:
        await tx.execute(
            "UPDATE pulse_tasks SET created_at = %s, available_at = %s, state_changed_at = %s,"
            " finished_at = IF(finished_at IS NULL, NULL, %s)"
            " WHERE namespace_id = %s AND id = %s",
            (at, at, at, at, t.namespace_id, task_id),
        )

    await t.db.transaction(run)


async def test_finished_tasks_past_the_window_go_with_their_history(
    db: Database, tenant: TenantFactory
) -> None:
    t = await tenant()
    other = await tenant()
    now = await db.now()
    old = await finished_task(t, now - 40 * DAY)
    young = await finished_task(t, now - 2 * DAY)
    waiting = (await t.submit())["id"]
    await backdate_task(t, parse_id(waiting), now - 40 * DAY)
    other_old = await finished_task(other, now - 40 * DAY)

    async def evidence(tx: Tx) -> None:
        await tx.execute(
            "INSERT INTO pulse_attempt_evidence (namespace_id, id, attempt_id, task_id, kind,"
            " data, created_at) VALUES (%s, %s, %s, %s, 'late_complete', '{}', %s)",
            (t.namespace_id, new_id(), new_id(), old, now - 39 * DAY),
        )

    await db.transaction(evidence)
    await set_retention(t, finished_tasks_days=7)
    await set_retention(other)  # settings with no window: kept forever

    p = purger(db)
    res = await p.purge_namespace(t.namespace_id)
    assert res.deleted.get("pulse_tasks") == 1
    assert res.deleted.get("pulse_attempt_evidence") == 1  # through the delete trigger
    assert not await task_exists(t, old)
    assert await task_exists(t, young)
    assert await task_exists(t, parse_id(waiting))
    view = await retention.get_retention(db, t.namespace_id)
    assert view["purged_total"] >= 1 and view["last_run_at"] is not None

    await p.purge_namespace(other.namespace_id)
    assert await task_exists(other, other_old)  # another namespace's windows never apply
    # A second pass finds nothing more.
    assert (await p.purge_namespace(t.namespace_id)).deleted.get("pulse_tasks") is None


async def test_a_namespace_without_settings_is_never_claimed(
    db: Database, tenant: TenantFactory
) -> None:
    t = await tenant()
    now = await db.now()
    old = await finished_task(t, now - 400 * DAY)
    await purger(db).run_once()
    assert await task_exists(t, old)


async def test_tasks_kept_within_the_idempotency_window_and_with_young_evidence(
    db: Database, tenant: TenantFactory
) -> None:
    t = await tenant()
    now = await db.now()
    within_keys = await finished_task(t, now - 3 * DAY)
    with_evidence = await finished_task(t, now - 40 * DAY)

    async def evidence(tx: Tx) -> None:
        await tx.execute(
            "INSERT INTO pulse_attempt_evidence (namespace_id, id, attempt_id, task_id, kind,"
            " data, created_at) VALUES (%s, %s, %s, %s, 'late_complete', '{}', %s)",
            (t.namespace_id, new_id(), new_id(), with_evidence, now - DAY / 2),
        )

    await db.transaction(evidence)
    # One day for tasks, but keys are remembered 96 hours: a 3-day-old task stays.
    await set_retention(t, finished_tasks_days=1, idempotency_hours=96)
    await purger(db).purge_namespace(t.namespace_id)
    assert await task_exists(t, within_keys)
    assert await task_exists(t, with_evidence)  # its late report is only 12 hours old


async def test_raw_events_go_after_the_window_but_not_before_the_oldest_unfinished_task(
    db: Database, tenant: TenantFactory
) -> None:
    t = await tenant()
    now = await db.now()

    async def events(tx: Tx) -> None:
        for days in (40, 20, 1):
            await append_event(tx, t.namespace_id, "probe.old", "probe", None, {"d": days},
                               now=now - days * DAY)  # fmt: skip

    await db.transaction(events)
    waiting = (await t.submit())["id"]
    await backdate_task(t, parse_id(waiting), now - 30 * DAY)
    await set_retention(t, events_days=7)
    probes = "SELECT COUNT(*) FROM orbit_event_batches WHERE namespace_id = %s AND type = 'probe.old'"
    p = purger(db)
    await p.purge_namespace(t.namespace_id)
    assert await count(db, probes, t.namespace_id) == 2  # -20 d is younger than the waiting task
    await task_service.cancel_task(db, t.namespace_id, waiting)
    await p.purge_namespace(t.namespace_id)
    assert await count(db, probes, t.namespace_id) == 1  # -1 d: inside the window


async def test_result_events_wait_for_subscriptions_and_go_with_their_deliveries(
    db: Database, tenant: TenantFactory
) -> None:
    t = await tenant()
    now = await db.now()
    for _ in range(3):
        await finished_task(t, now - 40 * DAY)
    await put_subscription(db, CLI_ACTOR, t.namespace_id, "behind", EARLIEST)
    await set_retention(t, events_days=7)
    p = purger(db)
    await p.purge_namespace(t.namespace_id)
    assert await rows(t, "orbit_result_events") == 3  # "behind" has not been handed them

    await delete_subscription(db, CLI_ACTOR, t.namespace_id, "behind")
    await p.purge_namespace(t.namespace_id)
    assert await rows(t, "orbit_result_events") == 0
    view = await retention.get_retention(db, t.namespace_id)
    assert view["purged_total"] >= 3
    # A subscription created now from "earliest" starts after what is gone.
    await put_subscription(db, CLI_ACTOR, t.namespace_id, "late", EARLIEST)
    after = await count(
        db, "SELECT after_seq FROM orbit_subscriptions WHERE namespace_id = %s AND name = 'late'",
        t.namespace_id,
    )  # fmt: skip
    assert after == 3


async def test_audit_events_have_their_own_window(db: Database, tenant: TenantFactory) -> None:
    t = await tenant()
    now = await db.now()

    async def trail(tx: Tx) -> None:
        for days in (400, 40, 10):
            await audit.record(tx, actor=CLI_ACTOR, action="probe.audit", resource_kind="probe",
                               namespace_id=t.namespace_id, now=now - days * DAY)  # fmt: skip

    await db.transaction(trail)
    await set_retention(t, events_days=7, audit_days=30)
    await purger(db).purge_namespace(t.namespace_id)
    sql = ("SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
           " AND action = 'probe.audit'")  # fmt: skip
    assert await count(db, sql, t.namespace_id) == 1


async def test_idempotency_hours_set_the_key_window(db: Database, tenant: TenantFactory) -> None:
    t = await tenant()
    await set_retention(t, idempotency_hours=2)

    async def claim(tx: Tx) -> None:
        await idempotency.claim(tx, t.namespace_id, "probe.op", "", "key-1", b"\0" * 32)

    await db.transaction(claim)
    sql = ("SELECT TIMESTAMPDIFF(MINUTE, created_at, expires_at) FROM orbit_idempotency_keys"
           " WHERE namespace_id = %s AND idem_key = 'key-1'")  # fmt: skip
    assert await count(db, sql, t.namespace_id) == 120


@pytest.mark.parametrize(
    ("table", "window"),
    [("orbit_event_batches", "events_days"), ("orbit_audit_events", "audit_days")],
)
async def test_triggers_refuse_ordinary_deletes_and_young_rows(
    db: Database, tenant: TenantFactory, table: str, window: str
) -> None:
    t = await tenant()
    now = await db.now()

    async def rows_at(tx: Tx) -> None:
        for days in (40, 1):
            if table == "orbit_audit_events":
                await audit.record(tx, actor=CLI_ACTOR, action="probe", resource_kind="probe",
                                   namespace_id=t.namespace_id, now=now - days * DAY)  # fmt: skip
            else:
                await append_event(tx, t.namespace_id, "probe", "probe", None,
                                   now=now - days * DAY)  # fmt: skip

    await db.transaction(rows_at)
    await set_retention(t, events_days=7, audit_days=7)

    def delete(sql: str, *, flag: bool) -> int | None:
        conn = pymysql.connect(**db.dsn.connect_kwargs())
        try:
            with conn.cursor() as cur:
                if flag:
                    cur.execute("SET @orbit_retention_purge = 1")
                try:
                    cur.execute(sql, (t.namespace_id,))
                except pymysql.MySQLError as exc:
                    conn.rollback()
                    return int(exc.args[0])
                conn.rollback()
                return None
        finally:
            conn.close()

    everything = f"DELETE FROM {table} WHERE namespace_id = %s"
    young = everything + " AND created_at > UTC_TIMESTAMP(6) - INTERVAL 2 DAY"
    old = everything + " AND created_at < UTC_TIMESTAMP(6) - INTERVAL 30 DAY"
    assert delete(everything, flag=False) == 1644  # an ordinary delete
    assert delete(old, flag=False) == 1644  # even of old rows
    assert delete(young, flag=True) == 1644  # the purge flag never reaches a young row
    assert delete(old, flag=True) is None  # the purge's own shape passes (rolled back here)
    assert await rows(t, table) >= 2


async def test_settings_validation_and_revision(db: Database, tenant: TenantFactory) -> None:
    t = await tenant()
    view = await retention.get_retention(db, t.namespace_id)
    assert view == {
        "finished_tasks_days": None, "events_days": None, "audit_days": None,
        "idempotency_hours": None, "revision": 1, "purged_total": 0, "last_run_at": None,
    }  # fmt: skip
    with pytest.raises(Exception) as info:
        await set_retention(t, events_days=30, audit_days=10)
    assert getattr(info.value, "field", None) == "audit_days"
    view = await set_retention(t, finished_tasks_days=30, events_days=30, audit_days=365)
    assert view["revision"] == 2
    assert (await set_retention(t, finished_tasks_days=30, events_days=30, audit_days=365))[
        "revision"
    ] == 2  # the same settings again change nothing


async def test_tasks_of_a_running_workflow_instance_are_kept(
    db: Database, tenant: TenantFactory
) -> None:
    t = await tenant()
    now = await db.now()
    running, finished = new_id(), new_id()
    kept, gone = await finished_task(t, now - 40 * DAY), await finished_task(t, now - 40 * DAY)

    async def link(tx: Tx) -> None:
        for instance, state, task in ((running, "RUNNING", kept), (finished, "SUCCEEDED", gone)):
            await tx.execute(
                "INSERT INTO weave_instances (namespace_id, id, owner_id, definition_id,"
                " definition_name, version, input, output, state, created_at, updated_at,"
                " finished_at) VALUES (%s, %s, %s, %s, 'flow', 1, '{}', %s, %s, %s, %s, %s)",
                (t.namespace_id, instance, t.application_id, new_id(),
                 None if state == "RUNNING" else "{}", state, now - 41 * DAY, now,
                 None if state == "RUNNING" else now - 40 * DAY),
            )  # fmt: skip
            await tx.execute(
                "INSERT INTO weave_activations (namespace_id, id, instance_id, step_path,"
                " activation_no, kind, task_id, state, seq, started_at, finished_at)"
                " VALUES (%s, %s, %s, 'step', 1, 'task', %s, 'CANCELLED', 1, %s, %s)",
                (t.namespace_id, new_id(), instance, task, now - 40 * DAY, now - 40 * DAY),
            )
            await tx.execute(
                "UPDATE pulse_tasks SET source_kind = 'workflow' WHERE namespace_id = %s AND id = %s",
                (t.namespace_id, task),
            )

    await db.transaction(link)
    await set_retention(t, finished_tasks_days=7)
    await purger(db).purge_namespace(t.namespace_id)
    assert await task_exists(t, kept)  # its instance still runs
    assert not await task_exists(t, gone)
