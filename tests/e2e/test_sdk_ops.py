"""The SDK's operator calls against a real server (``orbit-server``'s composition root on a
free port, tests/sdk_server.py): schedule trigger / backfill / delete and the overlap
policy, async and sync, with the error classes the server's answers map to."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from orbit_sdk import (
    Backfill,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrbitClient,
    Overlap,
    PreconditionFailed,
    ScheduleTaskSpec,
    SyncOrbitClient,
    Trigger,
)
from platform_fixtures import add_key
from sdk_server import (  # noqa: F401 - env_fixture, server_fixture: fixtures
    Env,
    env_fixture,
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
