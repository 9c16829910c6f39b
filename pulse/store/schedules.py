"""SQL for schedules, schedule versions and occurrences (``pulse/sql/schedules.sql``).

Every function runs one query on the caller's open :class:`Tx`; rows are dicts (column →
value, ids as bytes, times as naive UTC datetimes). Guarded updates return a bool whose
False meaning is in their docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orbit.storage import Queries, Tx, load_queries

_RAW = load_queries(__file__, "schedules")
Q = Queries(
    {
        k: v.replace("{cols}", _RAW.schedule_columns).replace("{vcols}", _RAW.version_columns)
        for k, v in _RAW.items()
    }
)

Row = dict[str, Any]

#: Unique index of a schedule name in its namespace.
NAME_INDEX = "uq_pulse_schedules_name"
#: Unique index of an occurrence: one per (schedule, UTC fire time).
OCCURRENCE_INDEX = "uq_pulse_schedule_occurrences_fire"
#: Unique index of a version number per schedule.
VERSION_INDEX = "uq_pulse_schedule_versions_version"


async def clock_now(tx: Tx, now: datetime | None) -> datetime:
    """``now`` when given (tests pin the clock), else the database clock."""
    if now is not None:
        return now
    value = await tx.fetchval(Q.schedule_clock_now, {"now": None})
    assert isinstance(value, datetime)
    return value


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
) -> bool:
    """Record scheduler progress. False: ``covered_until`` is no longer
    ``old_covered_until`` (someone else progressed) or the new value would move it back."""
    n = await tx.execute(
        Q.schedule_progress_if_covered,
        {
            "namespace_id": namespace_id,
            "id": schedule_id,
            "old_covered_until": old_covered_until,
            "covered_until": covered_until,
            "check_at": check_at,
        },
    )
    return n == 1


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


async def occurrence_list_before(
    tx: Tx,
    namespace_id: bytes,
    schedule_id: bytes,
    before: datetime,
    outcome: str | None,
    limit: int,
) -> list[Row]:
    """Occurrences with ``fire_at < before``, newest first."""
    return await tx.fetchall(
        Q.occurrence_list_before,
        {
            "namespace_id": namespace_id,
            "schedule_id": schedule_id,
            "before": before,
            "outcome": outcome,
            "limit": limit,
        },
    )
