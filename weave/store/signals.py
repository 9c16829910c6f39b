"""SQL for ``weave_signals``."""

from __future__ import annotations

from datetime import datetime

from orbit.storage import Tx
from weave.store._sql import many, one, queries
from weave.types import SignalRow

Q = queries(__file__, "signals", "signal_columns")
#: Unique index that de-duplicates signals by (namespace, instance, signal_id).
SIGNAL_ID_INDEX = "uq_weave_signals_signal_id"


async def signal_insert(tx: Tx, row: SignalRow) -> None:
    """DuplicateKey(SIGNAL_ID_INDEX) when the instance already has this signal_id."""
    await tx.execute(
        Q.signal_insert,
        {
            "namespace_id": row.namespace_id,
            "id": row.id,
            "instance_id": row.instance_id,
            "signal_id": row.signal_id,
            "name": row.name,
            "correlation_key": row.correlation_key,
            "payload": row.payload,
            "request_digest": row.request_digest,
            "sent_by": row.sent_by,
            "now": row.received_at,
        },
    )


async def signal_get(tx: Tx, namespace_id: bytes, signal_row_id: bytes) -> SignalRow | None:
    row = await tx.fetchone(Q.signal_get, {"namespace_id": namespace_id, "id": signal_row_id})
    return one(row, SignalRow)


async def signal_get_by_signal_id(
    tx: Tx, namespace_id: bytes, instance_id: bytes, signal_id: str
) -> SignalRow | None:
    row = await tx.fetchone(
        Q.signal_get_by_signal_id,
        {"namespace_id": namespace_id, "instance_id": instance_id, "signal_id": signal_id},
    )
    return one(row, SignalRow)


async def signal_find_unmatched(
    tx: Tx, namespace_id: bytes, instance_id: bytes, name: str, correlation_key: str | None
) -> SignalRow | None:
    row = await tx.fetchone(
        Q.signal_find_unmatched,
        {
            "namespace_id": namespace_id,
            "instance_id": instance_id,
            "name": name,
            "correlation_key": correlation_key,
        },
    )
    return one(row, SignalRow)


async def signal_match_if_unmatched(
    tx: Tx, namespace_id: bytes, signal_row_id: bytes, wait_id: bytes, now: datetime
) -> bool:
    """Bind the signal to the wait that consumed it. False: it was matched already."""
    n = await tx.execute(
        Q.signal_match_if_unmatched,
        {"namespace_id": namespace_id, "id": signal_row_id, "wait_id": wait_id, "now": now},
    )
    return n == 1


async def signal_list_for_instance(
    tx: Tx, namespace_id: bytes, instance_id: bytes, limit: int
) -> list[SignalRow]:
    rows = await tx.fetchall(
        Q.signal_list_for_instance,
        {"namespace_id": namespace_id, "instance_id": instance_id, "limit": limit},
    )
    return many(rows, SignalRow)
