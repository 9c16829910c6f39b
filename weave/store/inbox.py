"""SQL for ``weave_inbox``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Tx
from weave.store._sql import many, one, queries
from weave.types import InboxRow

Q = queries(__file__, "inbox", "inbox_columns")
#: Unique index that de-duplicates events by (namespace, source event id).
SOURCE_INDEX = "uq_weave_inbox_source"


async def inbox_insert(
    tx: Tx,
    *,
    namespace_id: bytes,
    inbox_id: bytes,
    instance_id: bytes,
    kind: str,
    source_event_id: bytes,
    step_path: str | None,
    payload: str | None,
    data: str | None,
    now: datetime | None,
) -> None:
    """Insert an event (``now`` None: the database clock). DuplicateKey(SOURCE_INDEX) when
    the source event was written before."""
    await tx.execute(
        Q.inbox_insert,
        {
            "namespace_id": namespace_id,
            "id": inbox_id,
            "instance_id": instance_id,
            "kind": kind,
            "source_event_id": source_event_id,
            "step_path": step_path,
            "payload": payload,
            "data": data,
            "now": now,
        },
    )


async def inbox_scan_pending(tx: Tx, now: datetime, limit: int) -> list[dict[str, Any]]:
    """Cross-namespace: (namespace_id, instance_id) of instances with due events."""
    return await tx.fetchall(Q.inbox_scan_pending, {"now": now, "limit": limit})


async def inbox_lock_pending_for_instance(
    tx: Tx, namespace_id: bytes, instance_id: bytes, limit: int
) -> list[InboxRow]:
    """Lock the instance's unprocessed events (due or not), oldest first."""
    rows = await tx.fetchall(
        Q.inbox_lock_pending_for_instance,
        {"namespace_id": namespace_id, "instance_id": instance_id, "limit": limit},
    )
    return many(rows, InboxRow)


async def inbox_get(tx: Tx, namespace_id: bytes, inbox_id: bytes) -> InboxRow | None:
    return one(
        await tx.fetchone(Q.inbox_get, {"namespace_id": namespace_id, "id": inbox_id}), InboxRow
    )


async def inbox_mark_processed_if_pending(
    tx: Tx, namespace_id: bytes, inbox_id: bytes, outcome: str, now: datetime
) -> bool:
    """Consume the event. False: another advance consumed it first."""
    n = await tx.execute(
        Q.inbox_mark_processed_if_pending,
        {"namespace_id": namespace_id, "id": inbox_id, "outcome": outcome, "now": now},
    )
    return n == 1


async def inbox_record_failure_if_pending(
    tx: Tx, namespace_id: bytes, inbox_id: bytes, last_error: str, available_at: datetime
) -> bool:
    n = await tx.execute(
        Q.inbox_record_failure_if_pending,
        {
            "namespace_id": namespace_id,
            "id": inbox_id,
            "last_error": last_error,
            "available_at": available_at,
        },
    )
    return n == 1


async def inbox_count_pending_for_instance(tx: Tx, namespace_id: bytes, instance_id: bytes) -> int:
    value = await tx.fetchval(
        Q.inbox_count_pending_for_instance,
        {"namespace_id": namespace_id, "instance_id": instance_id},
    )
    return int(value or 0)
