"""SQL for schedules, schedule versions and occurrences (``pulse/sql/schedules.sql``).

Every function runs one query on the caller's open :class:`Tx`; rows are dicts (column →
value, ids as bytes, times as naive UTC datetimes). Guarded updates return a bool whose
False meaning is in their docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Queries, Tx, load_queries

_RAW = load_queries(__file__, "schedules")
Q = Queries(
    {
        k: v.replace("{cols}", _RAW.schedule_columns)
        .replace("{vcols}", _RAW.version_columns)
        .replace("{ocols}", _RAW.occurrence_columns)
        for k, v in _RAW.items()
    }
)

Row = dict[str, Any]

#: Unique index of a schedule name in its namespace.
NAME_INDEX = "uq_pulse_schedules_name"
#: Unique index of the fire times that created a task from the cadence (scheduled or
#: backfilled occurrences): one per (schedule, UTC fire time).
OCCURRENCE_INDEX = "uq_pulse_schedule_occurrences_slot"
#: Unique index of a trigger's idempotency key per schedule.
TRIGGER_KEY_INDEX = "uq_pulse_schedule_occurrences_trigger"
#: Unique index of a version number per schedule.
VERSION_INDEX = "uq_pulse_schedule_versions_version"


async def schedule_get_by_name(
    tx: Tx, namespace_id: bytes, name: str, *, for_update: bool = False
) -> Row | None:
    sql = Q.schedule_get_by_name_for_update if for_update else Q.schedule_get_by_name
    return await tx.fetchone(sql, {"namespace_id": namespace_id, "name": name})


async def schedule_list_after(
    tx: Tx, namespace_id: bytes, after_name: str, limit: int
) -> list[Row]:
    return await tx.fetchall(
        Q.schedule_list_after,
        {"namespace_id": namespace_id, "after_name": after_name, "limit": limit},
    )


async def schedule_claim_due(tx: Tx, now: datetime) -> Row | None:
    """Lock and return the most overdue unpaused schedule (``check_at <= now``) that no
    other transaction holds, in any namespace; None when there is none."""
    return await tx.fetchone(Q.schedule_claim_due, {"now": now})


async def schedule_insert(tx: Tx, row: Mapping[str, Any]) -> None:
    """Insert a schedule at version 1. Raises DuplicateKey(:data:`NAME_INDEX`)."""
    await tx.execute(Q.schedule_insert, dict(row))


async def schedule_publish_if_revision(tx: Tx, row: Mapping[str, Any]) -> bool:
    """Make ``row['version']`` current and bump the revision. False: the revision moved on."""
    return await tx.execute(Q.schedule_publish_if_revision, dict(row)) == 1


async def schedule_progress_if_covered(
    tx: Tx,
    namespace_id: bytes,
    schedule_id: bytes,
    old_covered_until: datetime,
    covered_until: datetime,
    check_at: datetime | None,
    *,
    last_task_id: bytes | None = None,
    buffered_fire_at: datetime | None = None,
    buffered_version: int | None = None,
) -> bool:
    """Record scheduler progress and the overlap state (previous run, buffered fire time).
    False: ``covered_until`` is no longer ``old_covered_until`` (someone else progressed) or
    the new value would move it back."""
    n = await tx.execute(
        Q.schedule_progress_if_covered,
        {
            "namespace_id": namespace_id,
            "id": schedule_id,
            "old_covered_until": old_covered_until,
            "covered_until": covered_until,
            "check_at": check_at,
            "last_task_id": last_task_id,
            "buffered_fire_at": buffered_fire_at,
            "buffered_version": buffered_version,
        },
    )
    return n == 1


async def schedule_set_last_task(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, task_id: bytes
) -> None:
    """Make ``task_id`` the schedule's previous run (the caller holds the row lock)."""
    await tx.execute(
        Q.schedule_set_last_task,
        {"namespace_id": namespace_id, "id": schedule_id, "task_id": task_id},
    )


async def schedule_delete_if_revision(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, revision: int
) -> bool:
    """Delete the schedule row (history stays). False: the revision moved on."""
    n = await tx.execute(
        Q.schedule_delete_if_revision,
        {"namespace_id": namespace_id, "id": schedule_id, "revision": revision},
    )
    return n == 1


async def schedule_names_for_queue(
    tx: Tx, namespace_id: bytes, queue_name: str, limit: int
) -> list[str]:
    """Names of the schedules whose current version targets ``queue_name`` (at most
    ``limit``, by name)."""
    rows = await tx.fetchall(
        Q.schedule_names_for_queue,
        {"namespace_id": namespace_id, "queue_name": queue_name, "limit": limit},
    )
    return [str(r["name"]) for r in rows]


async def schedule_defer_if_check(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, old_check_at: datetime, check_at: datetime
) -> bool:
    """Move ``check_at`` from ``old_check_at`` to ``check_at``. False: it moved meanwhile."""
    n = await tx.execute(
        Q.schedule_defer_if_check,
        {
            "namespace_id": namespace_id,
            "id": schedule_id,
            "old_check_at": old_check_at,
            "check_at": check_at,
        },
    )
    return n == 1


async def schedule_set_paused_if_control(tx: Tx, row: Mapping[str, Any]) -> bool:
    """Pause/resume and bump the control revision. False: the control revision moved on."""
    return await tx.execute(Q.schedule_set_paused_if_control, dict(row)) == 1


async def version_insert(tx: Tx, row: Mapping[str, Any]) -> None:
    """Insert an immutable version. Raises DuplicateKey(:data:`VERSION_INDEX`)."""
    await tx.execute(Q.version_insert, dict(row))


async def version_get(tx: Tx, namespace_id: bytes, schedule_id: bytes, version: int) -> Row | None:
    return await tx.fetchone(
        Q.version_get,
        {"namespace_id": namespace_id, "schedule_id": schedule_id, "version": version},
    )


async def version_at(tx: Tx, namespace_id: bytes, schedule_id: bytes, at: datetime) -> int:
    """The version governing fire time ``at`` (published at or before it; 1 if none)."""
    value = await tx.fetchval(
        Q.version_at, {"namespace_id": namespace_id, "schedule_id": schedule_id, "at": at}
    )
    return int(value)


async def version_list_from(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, from_version: int, limit: int
) -> list[Row]:
    """Versions ``>= from_version`` in order, at most ``limit``."""
    return await tx.fetchall(
        Q.version_list_from,
        {
            "namespace_id": namespace_id,
            "schedule_id": schedule_id,
            "from_version": from_version,
            "limit": limit,
        },
    )


async def occurrence_insert(tx: Tx, row: Mapping[str, Any]) -> None:
    """Insert an occurrence. Raises DuplicateKey(:data:`OCCURRENCE_INDEX`) when one exists
    for the same (schedule, fire time)."""
    await tx.execute(Q.occurrence_insert, dict(row))


async def occurrence_insert_many(tx: Tx, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert occurrences in one multi-row INSERT. Raises DuplicateKey like
    :func:`occurrence_insert`."""
    if rows:
        await tx.executemany(Q.occurrence_insert, [dict(r) for r in rows])


async def occurrence_list_before(
    tx: Tx,
    namespace_id: bytes,
    schedule_id: bytes,
    before: datetime,
    outcome: str | None,
    limit: int,
    before_id: bytes = b"",
) -> list[Row]:
    """Occurrences before the position ``(before, before_id)`` — an earlier fire time, or
    the same one with a smaller id — newest first."""
    return await tx.fetchall(
        Q.occurrence_list_before,
        {
            "namespace_id": namespace_id,
            "schedule_id": schedule_id,
            "before": before,
            "before_id": before_id,
            "outcome": outcome,
            "limit": limit,
        },
    )


async def occurrence_get_by_trigger_key(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, trigger_key: str
) -> Row | None:
    """The occurrence a trigger with ``trigger_key`` created, if any."""
    return await tx.fetchone(
        Q.occurrence_get_by_trigger_key,
        {"namespace_id": namespace_id, "schedule_id": schedule_id, "trigger_key": trigger_key},
    )


async def occurrence_slots_between(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, lo: datetime, hi: datetime, limit: int
) -> set[datetime]:
    """Fire times in ``[lo, hi)`` that already created a task from the cadence."""
    rows = await tx.fetchall(
        Q.occurrence_slots_between,
        {"namespace_id": namespace_id, "schedule_id": schedule_id, "lo": lo, "hi": hi,
         "limit": limit},
    )  # fmt: skip
    return {r["fire_slot"] for r in rows}
