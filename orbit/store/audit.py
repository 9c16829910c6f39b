"""SQL for ``orbit_audit_events``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries
from orbit.store.multirow import multi_row

Q = load_queries(__file__, "audit")


async def audit_insert(tx: Tx, row: dict[str, Any]) -> None:
    await tx.execute(Q.audit_insert, row)


async def audit_insert_many(tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
    """Several audit events with ONE multi-row INSERT."""
    if rows:  # its VALUES hold an expression: executemany would send one INSERT per row
        await tx.execute(*multi_row(Q.audit_insert, rows))


async def audit_list_recent(tx: Tx, namespace_id: bytes, limit: int) -> list[dict[str, Any]]:
    return await tx.fetchall(Q.audit_list_recent, {"namespace_id": namespace_id, "limit": limit})


async def audit_list_by_request(
    tx: Tx, namespace_id: bytes, request_id: str
) -> list[dict[str, Any]]:
    args = {"namespace_id": namespace_id, "request_id": request_id}
    return await tx.fetchall(Q.audit_list_by_request, args)


async def audit_page(
    tx: Tx,
    namespace_id: bytes,
    *,
    action: str | None,
    outcome: str | None,
    since: datetime,
    until: datetime,
    before_t: datetime,
    before_id: bytes,
    limit: int,
) -> list[dict[str, Any]]:
    """Audit events of the namespace newest first, in ``[since, until)``, before the position
    ``(before_t, before_id)``, filtered by ``action`` / ``outcome`` (None: any), with the
    credential's name."""
    sql = Q.audit_page_by_action if action else Q.audit_page_by_outcome if outcome else Q.audit_page
    args = {
        "namespace_id": namespace_id, "action": action, "outcome": outcome, "since": since,
        "until": until, "before_t": before_t, "before_id": before_id, "limit": limit,
    }  # fmt: skip
    return await tx.fetchall(sql, args)


async def audit_purge(tx: Tx, namespace_id: bytes, cutoff: datetime, limit: int) -> int:
    """Retention: delete up to ``limit`` of the oldest events before ``cutoff`` (the caller
    set the purge session flag)."""
    args = {"namespace_id": namespace_id, "cutoff": cutoff, "limit": limit}
    return await tx.execute(Q.audit_purge, args)


async def audit_oldest(tx: Tx, namespace_id: bytes) -> datetime | None:
    value: datetime | None = await tx.fetchval(Q.audit_oldest, {"namespace_id": namespace_id})
    return value
