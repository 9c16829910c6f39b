"""SQL for ``orbit_retention`` (settings and purge progress) and the purge session flag."""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "retention")


class RetentionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One namespace's retention settings and purge progress."""

    namespace_id: bytes
    finished_tasks_days: int | None
    events_days: int | None
    audit_days: int | None
    idempotency_hours: int | None
    revision: int
    purged_total: int
    result_seq_purged: int
    last_run_at: datetime | None
    next_run_at: datetime
    created_at: datetime
    updated_at: datetime


async def retention_get(
    tx: Tx, namespace_id: bytes, *, for_update: bool = False
) -> RetentionRow | None:
    sql = Q.retention_get_for_update if for_update else Q.retention_get
    row = await tx.fetchone(sql, {"namespace_id": namespace_id})
    return None if row is None else msgspec.convert(row, RetentionRow)


async def retention_insert(
    tx: Tx, namespace_id: bytes, settings: dict[str, int | None], revision: int,
    now: datetime | None,
) -> None:  # fmt: skip
    """Insert the namespace's row; DuplicateKey when a concurrent PUT inserted it first."""
    args = {"namespace_id": namespace_id, "revision": revision, "now": now, **settings}
    await tx.execute(Q.retention_insert, args)


async def retention_update_if_revision(
    tx: Tx, namespace_id: bytes, settings: dict[str, int | None], revision: int,
    now: datetime | None,
) -> bool:  # fmt: skip
    """Replace the settings; False when the row is not at ``revision`` (a conflict)."""
    args = {"namespace_id": namespace_id, "revision": revision, "now": now, **settings}
    return await tx.execute(Q.retention_update_if_revision, args) == 1


async def retention_claim_due(tx: Tx, now: datetime | None) -> bytes | None:
    """Lock the most overdue namespace nobody else holds (SKIP LOCKED); None when none."""
    value = await tx.fetchval(Q.retention_claim_due, {"now": now})
    return None if value is None else bytes(value)


async def retention_set_next_run(
    tx: Tx, namespace_id: bytes, after_ms: int, now: datetime | None
) -> None:
    args = {"namespace_id": namespace_id, "after_ms": after_ms, "now": now}
    await tx.execute(Q.retention_set_next_run, args)


async def retention_add_progress(
    tx: Tx, namespace_id: bytes, purged: int, result_seq_purged: int = 0
) -> None:
    args = {"namespace_id": namespace_id, "purged": purged, "result_seq_purged": result_seq_purged}
    await tx.execute(Q.retention_add_progress, args)


async def retention_finish_pass(
    tx: Tx, namespace_id: bytes, after_ms: int, now: datetime | None
) -> None:
    args = {"namespace_id": namespace_id, "after_ms": after_ms, "now": now}
    await tx.execute(Q.retention_finish_pass, args)


async def purge_begin(tx: Tx) -> None:
    """Let this session's deletes through the history triggers (past the window only)."""
    await tx.execute(Q.retention_purge_begin)


async def purge_end(tx: Tx) -> None:
    await tx.execute(Q.retention_purge_end)
