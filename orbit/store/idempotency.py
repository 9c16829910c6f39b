"""SQL for ``orbit_idempotency_keys``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "idempotency")


def _key(namespace_id: bytes, operation: str, scope: str, idem_key: str) -> dict[str, Any]:
    return {
        "namespace_id": namespace_id,
        "operation": operation,
        "scope": scope,
        "idem_key": idem_key,
    }


async def idempotency_get(
    tx: Tx, namespace_id: bytes, operation: str, scope: str, idem_key: str, now: datetime | None
) -> dict[str, Any] | None:
    """The committed row for the key (plus ``expired``), or None."""
    args = _key(namespace_id, operation, scope, idem_key) | {"now": now}
    return await tx.fetchone(Q.idempotency_get, args)


async def idempotency_insert(
    tx: Tx,
    namespace_id: bytes,
    row_id: bytes,
    operation: str,
    scope: str,
    idem_key: str,
    request_digest: bytes,
    retention_us: int,
    now: datetime | None,
) -> None:
    """Insert a pending key row; raises DuplicateKey when the key exists (after waiting)."""
    args = _key(namespace_id, operation, scope, idem_key) | {
        "id": row_id,
        "request_digest": request_digest,
        "retention_us": retention_us,
        "now": now,
    }
    await tx.execute(Q.idempotency_insert, args)


async def idempotency_delete_if_expired(
    tx: Tx, namespace_id: bytes, row_id: bytes, now: datetime | None
) -> bool:
    """Delete one expired row; False when it was not expired (or already gone)."""
    args = {"namespace_id": namespace_id, "id": row_id, "now": now}
    return await tx.execute(Q.idempotency_delete_if_expired, args) == 1


async def idempotency_store_response_if_pending(
    tx: Tx,
    namespace_id: bytes,
    operation: str,
    scope: str,
    idem_key: str,
    status: int,
    body: str,
) -> bool:
    """Store the response on the pending row. False: no pending row (not claimed, or stored)."""
    args = _key(namespace_id, operation, scope, idem_key) | {"status": status, "body": body}
    return await tx.execute(Q.idempotency_store_response_if_pending, args) == 1


async def idempotency_delete_expired_batch(tx: Tx, limit: int, now: datetime | None) -> int:
    """Delete up to ``limit`` expired rows across namespaces; return how many."""
    return await tx.execute(Q.idempotency_delete_expired_batch, {"limit": limit, "now": now})
