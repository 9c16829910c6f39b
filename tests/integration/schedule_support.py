"""Helpers for the schedule tests (tests/integration/test_schedules*.py).

The scheduler's claim scans every namespace, so schedule tests run on their own migrated
database per module (:func:`isolated_dsn`), and :func:`quiesce` parks every schedule left
by a test (``check_at = NULL``) so a later test's clock never picks it up.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import msgspec
import pytest
from conftest import create_database, drop_database
from event_rows import raw_events
from platform_fixtures import raw_query
from pulse_fixtures import Tenant, make_tenant

from orbit import migrate
from orbit.storage import DSN, Database, Tx
from pulse import schedules
from pulse.schedules import SchedulePut


def isolated_dsn() -> Iterator[DSN]:
    """A fresh migrated database (dropped after)."""
    dsn = create_database("orbit_test_sched")
    try:
        migrate.up(dsn)
        yield dsn
    finally:
        drop_database(dsn)


@pytest.fixture(scope="module", name="sched_dsn")
def sched_dsn_fixture() -> Iterator[DSN]:
    """The module's own migrated database (import into a test module to use it)."""
    yield from isolated_dsn()


@pytest.fixture(scope="module", name="sdb")
async def sdb_fixture(sched_dsn: DSN) -> AsyncIterator[Database]:
    """A pool on ``sched_dsn``."""
    database = await Database.connect(sched_dsn, maxsize=8)
    try:
        yield database
    finally:
        await database.close()


def quiesce(dsn: DSN) -> None:
    """Park every schedule of the database (outside the SQL guard: a test utility)."""
    raw_query(dsn, "UPDATE pulse_schedules SET check_at = NULL")


def body(**fields: Any) -> SchedulePut:
    """A PUT body: ``queue`` defaults to ``default``, ``task`` to ``{"kind": "tick"}``."""
    fields.setdefault("queue", "default")
    fields.setdefault("task", {"kind": "tick", "payload": {"n": 1}})
    return msgspec.json.decode(msgspec.json.encode(fields), type=SchedulePut)


async def tenant(db: Database, **queue_config: Any) -> Tenant:
    return await make_tenant(db, **queue_config)


def name() -> str:
    return f"s-{secrets.token_hex(4)}"


async def put(
    db: Database, t: Tenant, sched: str, *, now: datetime, **fields: Any
) -> dict[str, Any]:
    """Create or publish ``sched`` at the pinned time ``now``; the schedule view."""
    res = await schedules.put_schedule(
        db, t.namespace_id, t.application_id, sched, body(**fields), now=now
    )
    return res.schedule


async def schedule_row(db: Database, t: Tenant, sched: str) -> dict[str, Any]:
    async def run(tx: Tx) -> dict[str, Any]:
        row = await tx.fetchone(
            "SELECT * FROM pulse_schedules WHERE namespace_id = %s AND name = %s",
            (t.namespace_id, sched),
        )
        assert row is not None
        return row

    return await db.read(run)


async def occurrences(db: Database, t: Tenant, sched: str) -> list[dict[str, Any]]:
    """Occurrence rows of ``sched``, oldest fire time first."""

    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT o.* FROM pulse_schedule_occurrences o JOIN pulse_schedules s"
            " ON s.namespace_id = o.namespace_id AND s.id = o.schedule_id"
            " WHERE o.namespace_id = %s AND s.name = %s ORDER BY o.fire_at",
            (t.namespace_id, sched),
        )

    return await db.read(run)


async def schedule_tasks(db: Database, t: Tenant) -> list[dict[str, Any]]:
    """Tasks of the tenant's namespace created by schedules, by available_at."""

    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT * FROM pulse_tasks WHERE namespace_id = %s AND source_kind = 'schedule'"
            " ORDER BY available_at",
            (t.namespace_id,),
        )

    return await db.read(run)


async def schedule_events(db: Database, t: Tenant, schedule_id: bytes) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        rows = await raw_events(
            tx, t.namespace_id, subject_kind="schedule", subject_id=schedule_id
        )
        return sorted(rows, key=lambda r: (r["created_at"], r["type"]))

    return await db.read(run)


def fire_times(rows: list[dict[str, Any]], outcome: str = "created") -> list[datetime]:
    return [r["fire_at"] for r in rows if r["outcome"] == outcome]
