"""SQL for ``weave_waits`` (signal waits and durable timers)."""

from __future__ import annotations

from datetime import datetime

from orbit.storage import Tx
from weave.store._sql import many, one, queries
from weave.types import WaitRow

Q = queries(__file__, "waits", "wait_columns")


async def wait_insert(tx: Tx, row: WaitRow) -> None:
    await tx.execute(
        Q.wait_insert,
        {
            "namespace_id": row.namespace_id,
            "id": row.id,
            "instance_id": row.instance_id,
            "step_path": row.step_path,
            "activation_id": row.activation_id,
            "kind": row.kind,
            "signal_name": row.signal_name,
            "correlation_key": row.correlation_key,
            "due_at": row.due_at,
            "state": row.state,
            "signal_row_id": row.signal_row_id,
            "seq": row.seq,
            "now": row.created_at,
            "resolved_at": row.resolved_at,
        },
    )


async def wait_get(tx: Tx, namespace_id: bytes, wait_id: bytes) -> WaitRow | None:
    return one(
        await tx.fetchone(Q.wait_get, {"namespace_id": namespace_id, "id": wait_id}), WaitRow
    )


async def wait_resolve_if_open(
    tx: Tx,
    namespace_id: bytes,
    wait_id: bytes,
    state: str,
    now: datetime,
    signal_row_id: bytes | None = None,
) -> bool:
    """OPEN → ``state`` (MATCHED with ``signal_row_id``, FIRED, CANCELLED). False: not OPEN."""
    n = await tx.execute(
        Q.wait_resolve_if_open,
        {
            "namespace_id": namespace_id,
            "id": wait_id,
            "state": state,
            "signal_row_id": signal_row_id,
            "now": now,
        },
    )
    return n == 1


async def wait_list_open(tx: Tx, namespace_id: bytes, instance_id: bytes) -> list[WaitRow]:
    rows = await tx.fetchall(
        Q.wait_list_open, {"namespace_id": namespace_id, "instance_id": instance_id}
    )
    return many(rows, WaitRow)


async def wait_find_open_signal(
    tx: Tx, namespace_id: bytes, instance_id: bytes, signal_name: str, correlation_key: str | None
) -> WaitRow | None:
    row = await tx.fetchone(
        Q.wait_find_open_signal,
        {
            "namespace_id": namespace_id,
            "instance_id": instance_id,
            "signal_name": signal_name,
            "correlation_key": correlation_key,
        },
    )
    return one(row, WaitRow)


async def wait_claim_due(tx: Tx, now: datetime, limit: int) -> list[WaitRow]:
    """Cross-namespace: lock up to ``limit`` due, not yet notified OPEN waits (SKIP LOCKED)."""
    return many(await tx.fetchall(Q.wait_claim_due, {"now": now, "limit": limit}), WaitRow)


async def wait_mark_notified_if_open(
    tx: Tx, namespace_id: bytes, wait_id: bytes, now: datetime
) -> bool:
    n = await tx.execute(
        Q.wait_mark_notified_if_open, {"namespace_id": namespace_id, "id": wait_id, "now": now}
    )
    return n == 1


async def wait_list_page(
    tx: Tx, namespace_id: bytes, instance_id: bytes, after_seq: int, limit: int
) -> list[WaitRow]:
    rows = await tx.fetchall(
        Q.wait_list_page,
        {
            "namespace_id": namespace_id,
            "instance_id": instance_id,
            "after_seq": after_seq,
            "limit": limit,
        },
    )
    return many(rows, WaitRow)
