"""SQL for ``orbit_audit_events``."""

from __future__ import annotations

from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "audit")


async def audit_insert(tx: Tx, row: dict[str, Any]) -> None:
    await tx.execute(Q.audit_insert, row)


async def audit_list_recent(tx: Tx, namespace_id: bytes, limit: int) -> list[dict[str, Any]]:
    return await tx.fetchall(Q.audit_list_recent, {"namespace_id": namespace_id, "limit": limit})


async def audit_list_by_request(
    tx: Tx, namespace_id: bytes, request_id: str
) -> list[dict[str, Any]]:
    args = {"namespace_id": namespace_id, "request_id": request_id}
    return await tx.fetchall(Q.audit_list_by_request, args)
