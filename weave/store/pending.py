"""SQL for ``weave_pending_advances``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Tx
from weave.store._sql import many, queries
from weave.types import PendingRow

Q = queries(__file__, "pending", "pending_columns")


async def pending_insert(
    tx: Tx,
    *,
    namespace_id: bytes,
    pending_id: bytes,
    instance_id: bytes,
    inbox_id: bytes,
    control_revision: int,
    now: datetime,
) -> None:
    """Record an event deferred because the instance is paused."""
    await tx.execute(
        Q.pending_insert,
        {
            "namespace_id": namespace_id,
            "id": pending_id,
            "instance_id": instance_id,
            "inbox_id": inbox_id,
            "reason": "paused",
            "control_revision": control_revision,
            "now": now,
        },
    )


async def pending_list_for_instance(
    tx: Tx, namespace_id: bytes, instance_id: bytes, limit: int
) -> list[PendingRow]:
    rows = await tx.fetchall(
        Q.pending_list_for_instance,
        {"namespace_id": namespace_id, "instance_id": instance_id, "limit": limit},
    )
    return many(rows, PendingRow)


async def pending_resolve_if_pending(
    tx: Tx, namespace_id: bytes, pending_id: bytes, state: str, now: datetime
) -> bool:
    n = await tx.execute(
        Q.pending_resolve_if_pending,
        {"namespace_id": namespace_id, "id": pending_id, "state": state, "now": now},
    )
    return n == 1


async def pending_discard_for_instance(
    tx: Tx, namespace_id: bytes, instance_id: bytes, now: datetime
) -> int:
    return await tx.execute(
        Q.pending_discard_for_instance,
        {"namespace_id": namespace_id, "instance_id": instance_id, "now": now},
    )


async def pending_scan_resumable(tx: Tx, limit: int) -> list[dict[str, Any]]:
    """Cross-namespace: (namespace_id, instance_id) of unpaused instances with deferred
    advances left."""
    return await tx.fetchall(Q.pending_scan_resumable, {"limit": limit})
