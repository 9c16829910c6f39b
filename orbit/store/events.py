"""SQL for raw events, result events and the result sequence. Callers pass an open Tx."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries
from orbit.store.multirow import multi_row

Q = load_queries(__file__, "events")


async def event_batch_insert_many(tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
    """Insert raw-event batch rows in one multi-row INSERT (``created_at`` must be set)."""
    if rows:
        await tx.executemany(Q.event_batch_insert_many, rows)


async def event_batch_list(
    tx: Tx,
    namespace_id: bytes,
    since: datetime | None,
    until: datetime | None,
    type: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.event_batch_list,
        {"namespace_id": namespace_id, "since": since, "until": until, "type": type,
         "limit": limit},
    )  # fmt: skip


async def event_batch_list_for_subject(
    tx: Tx,
    namespace_id: bytes,
    subject_kind: str,
    subject_hex: str,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.event_batch_list_for_subject,
        {"namespace_id": namespace_id, "subject_kind": subject_kind, "subject_hex": subject_hex,
         "since": since, "until": until, "limit": limit},
    )  # fmt: skip


async def event_list_window(
    tx: Tx,
    namespace_id: bytes,
    since: datetime | None,
    until: datetime | None,
    type: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Legacy per-subject rows (``orbit_events``) of a namespace in a time window."""
    return await tx.fetchall(
        Q.event_list_window,
        {"namespace_id": namespace_id, "since": since, "until": until, "type": type,
         "limit": limit},
    )  # fmt: skip


async def event_list_for_subject(
    tx: Tx, namespace_id: bytes, subject_kind: str, subject_id: bytes, limit: int
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.event_list_for_subject,
        {
            "namespace_id": namespace_id,
            "subject_kind": subject_kind,
            "subject_id": subject_id,
            "limit": limit,
        },
    )


async def event_streams_advance_many(
    tx: Tx, counts: dict[bytes, int], now: datetime | None
) -> tuple[dict[bytes, int], datetime | None]:
    """Take ``counts[ns]`` sequence numbers on each namespace's stream row in ONE upsert (rows
    in namespace order), then read the new tops; return (last_seq by namespace, the time to
    stamp: ``now``, the database clock read with the tops, or None when the write answered
    the top itself — the caller's INSERT then stamps with the database clock). The rows stay
    locked by this transaction until it ends.

    One namespace whose stream row exists (the usual round): the upsert answers the new top
    itself (``LAST_INSERT_ID(expr)`` in its UPDATE part, sent back as the statement's insert
    id) and nothing is read. The insert id is taken only when the statement updated the row
    (two affected rows); a new row (one) is read back as before."""
    order = sorted(counts)
    values = ", ".join(["(%s, %s, COALESCE(%s, UTC_TIMESTAMP(6)))"] * len(order))
    args: list[Any] = []
    for ns in order:
        args += [ns, counts[ns], now]
    upsert = (
        "INSERT INTO orbit_event_streams (namespace_id, last_seq, updated_at) VALUES "
        + values
        + " ON DUPLICATE KEY UPDATE last_seq = LAST_INSERT_ID(last_seq + VALUES(last_seq)),"
        " updated_at = VALUES(updated_at)"
    )
    read = (
        "SELECT namespace_id, last_seq, UTC_TIMESTAMP(6) AS db_now FROM orbit_event_streams"
        " WHERE namespace_id IN (" + ", ".join(["%s"] * len(order)) + ")"
    )
    if len(order) == 1:
        changed = await tx.execute(upsert, args)
        top = tx.lastrowid or 0
        if changed == 2 and top > 0:
            return {order[0]: int(top)}, now
        rows = await tx.fetchall(read, order)
    else:
        _, rows = await tx.pipeline(tx.execute(upsert, args), tx.fetchall(read, order))
    tops = {bytes(r["namespace_id"]): int(r["last_seq"]) for r in rows}
    stamp = now or rows[0]["db_now"]
    return tops, stamp


async def result_event_insert_many(tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
    if rows:  # its VALUES hold an expression: executemany would send one INSERT per row
        await tx.execute(*multi_row(Q.result_event_insert_many, rows))


async def result_event_list_after(
    tx: Tx, namespace_id: bytes, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.result_event_list_after,
        {"namespace_id": namespace_id, "after_seq": after_seq, "limit": limit},
    )


async def result_event_sizes_after(
    tx: Tx, namespace_id: bytes, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    """``seq``, ``queue`` and ``page_bytes`` of the events :func:`result_event_list_after`
    would read."""
    return await tx.fetchall(
        Q.result_event_sizes_after,
        {"namespace_id": namespace_id, "after_seq": after_seq, "limit": limit},
    )


async def result_event_get_many(
    tx: Tx, namespace_id: bytes, seqs: Sequence[int]
) -> list[dict[str, Any]]:
    """The events of ``seqs``, in sequence order."""
    if not seqs:
        return []
    return await tx.fetchall(
        Q.result_event_get_many, {"namespace_id": namespace_id, "seqs": tuple(seqs)}
    )


async def result_event_last_seq(tx: Tx, namespace_id: bytes) -> int:
    return int(await tx.fetchval(Q.result_event_last_seq, {"namespace_id": namespace_id}) or 0)


async def event_batch_scan_end(
    tx: Tx, namespace_id: bytes, since: datetime, until: datetime, rows: int
) -> datetime | None:
    """The ``created_at`` of the ``rows``-th batch row of the window (None: fewer rows)."""
    value: datetime | None = await tx.fetchval(
        Q.event_batch_scan_end,
        {"namespace_id": namespace_id, "since": since, "until": until, "offset": rows - 1},
    )
    return value


async def event_batch_list_naming(
    tx: Tx, namespace_id: bytes, subject_kind: str, needle: str, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.event_batch_list_naming,
        {"namespace_id": namespace_id, "subject_kind": subject_kind, "needle": needle,
         "since": since, "until": until},
    )  # fmt: skip


async def event_list_for_subject_window(
    tx: Tx,
    namespace_id: bytes,
    subject_kind: str,
    subject_id: bytes,
    since: datetime,
    until: datetime,
    limit: int,
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.event_list_for_subject_window,
        {"namespace_id": namespace_id, "subject_kind": subject_kind, "subject_id": subject_id,
         "since": since, "until": until, "limit": limit},
    )  # fmt: skip


# ---- retention purge (orbit.retention_purge; the caller set the purge session flag) -----


async def event_batch_purge(tx: Tx, namespace_id: bytes, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` of the oldest batch rows created before ``cutoff``."""
    args = {"namespace_id": namespace_id, "cutoff": cutoff, "limit": limit}
    return await tx.execute(Q.event_batch_purge, args)


async def event_batch_oldest(tx: Tx, namespace_id: bytes) -> datetime | None:
    value: datetime | None = await tx.fetchval(Q.event_batch_oldest, {"namespace_id": namespace_id})
    return value


async def event_legacy_purge(tx: Tx, namespace_id: bytes, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` of the oldest ``orbit_events`` rows created before ``cutoff``."""
    args = {"namespace_id": namespace_id, "cutoff": cutoff, "limit": limit}
    return await tx.execute(Q.event_legacy_purge, args)


async def result_event_purge_scan(
    tx: Tx, namespace_id: bytes, after_seq: int, upto_seq: int, limit: int
) -> list[dict[str, Any]]:
    """(seq, created_at) of the next result events in ``(after_seq, upto_seq]``."""
    args = {"namespace_id": namespace_id, "after_seq": after_seq, "upto_seq": upto_seq,
            "limit": limit}  # fmt: skip
    return await tx.fetchall(Q.result_event_purge_scan, args)


async def result_event_purge_range(
    tx: Tx, namespace_id: bytes, after_seq: int, upto_seq: int
) -> int:
    args = {"namespace_id": namespace_id, "after_seq": after_seq, "upto_seq": upto_seq}
    return await tx.execute(Q.result_event_purge_range, args)
