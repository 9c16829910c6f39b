"""The SDK's operator calls against a real server (``orbit-server``'s composition root on a
free port, tests/sdk_server.py): schedule trigger / backfill / delete and the overlap
policy, queue / subscription / workflow deletes, the workers view and an operator's close of
a real worker's session, the audit trail — async and sync, with the error classes the
server's answers map to."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from orbit_sdk import (
    AuditEvent,
    Backfill,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrbitClient,
    Overlap,
    PreconditionFailed,
    Retention,
    RetryAllResult,
    RetryBounds,
    ScheduleTaskSpec,
    SubscriptionFilter,
    SyncOrbitClient,
    TaskContext,
    TaskRetry,
    TaskSpec,
    Trigger,
    Worker,
    WorkerSession,
)
from platform_fixtures import add_key
from sdk_server import (  # noqa: F401 - env_fixture, server_fixture: fixtures
    Env,
    env_fixture,
    eventually,
    server_fixture,
    unique,
)

from orbit.storage import Database


async def test_schedule_trigger_backfill_delete(env: Env, db: Database) -> None:
    s = env.orbit.schedules
    queue = unique("q")
    await env.orbit.queues.put(queue)
    name = unique("hourly")
    start = datetime.now(UTC) - timedelta(hours=3)
    made = await s.put(
        name, queue=queue, every_ms=3_600_000, task=ScheduleTaskSpec(kind="tick"),
        overlap=Overlap.SKIP,
    )  # fmt: skip
    assert made.overlap == Overlap.SKIP and made.buffered_fire_at is None
    fired = await s.trigger(name, idempotency_key="release-42")
    assert isinstance(fired, Trigger) and not fired.replayed
    assert fired.occurrence.origin == "trigger" and fired.occurrence.idempotency_key == "release-42"
    assert fired.task is not None and fired.task.id == fired.occurrence.task_id
    again = await s.trigger(name, idempotency_key="release-42")
    assert again.replayed and again.occurrence.id == fired.occurrence.id
    assert (await s.get(name)).last_task_id == fired.task.id
    filled = await s.backfill(name, start=start, end=start + timedelta(hours=3))
    assert isinstance(filled, Backfill) and filled.count == 3 and filled.already_occurred == 0
    assert filled.from_ is not None and filled.to is not None
    assert (await s.backfill(name, start=start, end=start + timedelta(hours=3))).count == 0
    origins = [o.origin for o in (await s.occurrences(name)).items]
    assert sorted(origins) == ["backfill"] * 3 + ["trigger"]
    with pytest.raises(InvalidRequest) as bad:
        await s.backfill(name, start=start, end=start)
    assert bad.value.field == "to"
    with pytest.raises(PreconditionFailed):
        await s.delete(name, if_match=made.revision + 5)
    await s.delete(name)
    with pytest.raises(NotFound):
        await s.get(name)
    with pytest.raises(NotFound):
        await s.trigger(name)
    _, reader = await add_key(db, env.tenant, ["tasks.read"])
    async with OrbitClient(env.server.url, reader, namespace=env.ns) as limited:
        with pytest.raises(Forbidden):
            await limited.schedules.trigger(name)


async def test_schedule_controls_sync(env: Env) -> None:
    queue = unique("q")
    await env.orbit.queues.put(queue)
    name = unique("sync")

    def work() -> tuple[bool, int, bool]:
        with SyncOrbitClient(env.server.url, env.tenant.key, namespace=env.ns) as orbit:
            now = datetime.now(UTC)
            orbit.schedules.put(name, queue=queue, every_ms=3_600_000, task={"kind": "tick"})
            fired = orbit.schedules.trigger(name)
            filled = orbit.schedules.backfill(name, start=now - timedelta(hours=5), end=now)
            orbit.schedules.delete(name)
            try:
                orbit.schedules.get(name)
                gone = False
            except NotFound:
                gone = True
            return fired.task is not None, filled.count, gone

    has_task, count, gone = await asyncio.to_thread(work)
    assert has_task and count == 5 and gone


async def test_deletes_workers_and_audit(env: Env, db: Database) -> None:
    orbit = env.orbit
    queue = unique("q")
    await orbit.queues.put(queue)
    task = await orbit.tasks.submit(queue, "k", {"n": 1})
    with pytest.raises(Conflict) as held:
        await orbit.queues.delete(queue)
    assert held.value.details["unfinished_tasks"] == 1
    await orbit.tasks.cancel(task.id)
    await orbit.queues.delete(queue)
    with pytest.raises(NotFound):
        await orbit.queues.get(queue)
    await orbit.subscriptions.put("gone", filter=SubscriptionFilter())
    await orbit.subscriptions.delete("gone")
    with pytest.raises(NotFound):
        await orbit.subscriptions.get("gone")
    await orbit.workflows.publish(
        "flow", {"steps": [{"id": "done", "type": "succeed", "output": {}}]}
    )
    await orbit.workflows.delete("flow")
    with pytest.raises(NotFound):
        await orbit.workflows.get("flow")

    # a real SDK worker holding one running attempt
    work = unique("w")
    await orbit.queues.put(work)
    release = asyncio.Event()
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns)

    @worker.task(work, "slow")
    async def slow(ctx: TaskContext, payload: object) -> dict[str, bool]:
        await release.wait()
        return {"ok": True}

    running = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        await orbit.tasks.submit(work, "slow", {}, retry_safe=True)

        async def busy() -> WorkerSession | None:
            page = await orbit.workers.list(queue=work)
            return next((s for s in page.sessions if s.running == 1), None)

        session = await eventually(busy)
        assert isinstance(session, WorkerSession) and session.queues == [work]
        assert session.instance.sdk and session.sdk == session.instance.sdk
        assert session.attempts[0].state == "RUNNING" and session.capacity >= 1
        assert [s.id async for s in orbit.workers.iter(queue=work)] == [session.id]
        closed = await orbit.workers.close(session.id)
        assert closed.state == "CLOSED" and closed.lost_attempts == 1
    finally:
        release.set()
        worker.drain()
        await asyncio.wait_for(running, 30)

    events = [e async for e in orbit.audit.iter(action="workers.close")]
    assert [e.resource_id for e in events] == [session.id]
    assert isinstance(events[0], AuditEvent) and events[0].outcome == "ok"
    page = await orbit.audit.list(action="queues.delete", limit=5)
    assert [(e.resource_id, e.outcome) for e in page.items] == [(queue, "ok"), (queue, "conflict")]
    assert (await orbit.audit.list(action="queues.delete", outcome="conflict")).items[0].status_code == 409
    _, reader = await add_key(db, env.tenant, ["tasks.read"])
    async with OrbitClient(env.server.url, reader, namespace=env.ns) as limited:
        with pytest.raises(Forbidden):
            await limited.audit.list()
        assert (await limited.workers.list()).sessions is not None


async def test_retry_and_retry_all(env: Env) -> None:
    orbit = env.orbit
    queue = unique("q")
    await orbit.queues.put(queue)
    tasks = [await orbit.tasks.submit(queue, "k", {"i": i}) for i in range(3)]
    for task in tasks:
        await orbit.tasks.cancel(task.id)
    again = await orbit.tasks.retry(tasks[0].id, note="one more time", attempts=2)
    assert again.state == "WAITING" and again.max_attempts >= 2
    with pytest.raises(Conflict):
        await orbit.tasks.retry(tasks[0].id, note="not finished")
    counted = await orbit.tasks.retry_all(note="all", queue=queue, dry_run=True)
    assert isinstance(counted, RetryAllResult) and counted.matched == 2 and not counted.more
    done = await orbit.tasks.retry_all(note="all", queue=queue, states=["CANCELLED"])
    assert done.retried == 2 and done.quota_refused == 0
    assert {(await orbit.tasks.get(t.id)).state for t in tasks} == {"WAITING"}
    with pytest.raises(InvalidRequest):
        await orbit.tasks.retry_all(note="n", finished_after=datetime(2030, 1, 1),
                                    finished_before=datetime(2020, 1, 1))  # fmt: skip


async def test_task_retry_policy(env: Env) -> None:
    orbit = env.orbit
    queue = unique("q")
    made = await orbit.queues.put(
        queue, retry_bounds=RetryBounds(min_delay_ms=100, max_delay_ms=60_000, max_multiplier=3)
    )
    assert made.retry_bounds == RetryBounds(min_delay_ms=100, max_delay_ms=60_000, max_multiplier=3.0)
    task = await orbit.tasks.submit(queue, "k", retry=TaskRetry(backoff_initial_ms=250))
    assert task.retry is not None and task.retry.backoff_initial_ms == 250
    assert task.retry.backoff_max_ms == 300_000  # the queue's default
    same = await orbit.tasks.submit(queue, "k", retry={"backoff_multiplier": 2.5})
    assert same.retry is not None and same.retry.backoff_multiplier == 2.5
    with pytest.raises(InvalidRequest) as bad:
        await orbit.tasks.submit(queue, "k", retry=TaskRetry(backoff_max_ms=90_000))
    assert bad.value.field == "retry.backoff_max_ms"
    [item] = await orbit.tasks.submit_batch(
        [TaskSpec(queue=queue, kind="k", retry=TaskRetry(backoff_multiplier=9))]
    )
    assert item.status == 400



async def test_retention_settings(env: Env, db: Database) -> None:
    r = env.orbit.retention
    first = await r.get()
    assert isinstance(first, Retention) and first.events_days is None
    made = await r.put(finished_tasks_days=30, events_days=14, audit_days=90,
                       if_match=first.revision)  # fmt: skip
    assert (made.events_days, made.audit_days, made.revision) == (14, 90, first.revision + 1)
    with pytest.raises(PreconditionFailed):
        await r.put(events_days=7, if_match=first.revision)
    with pytest.raises(InvalidRequest) as bad:
        await r.put(events_days=14, audit_days=3)
    assert bad.value.field == "audit_days"
    _, reader = await add_key(db, env.tenant, ["tasks.read"])
    async with OrbitClient(env.server.url, reader, namespace=env.ns) as limited:
        with pytest.raises(Forbidden):
            await limited.retention.get()

    def work() -> tuple[int, int | None]:
        with SyncOrbitClient(env.server.url, env.tenant.key, namespace=env.ns) as sync:
            return sync.retention.get().purged_total, sync.retention.put().events_days

    assert await asyncio.to_thread(work) == (0, None)
