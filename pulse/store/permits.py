"""SQL for start-time permits (``pulse/sql/permits.sql``): the limits a start is judged by,
per-key concurrency limits with their fencing revision, and the key permit rows.

Every function runs one query on the caller's open :class:`~orbit.storage.Tx`. Guarded
updates return a bool; False means the guard did not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.ids import new_id
from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "permits")

Row = dict[str, Any]


async def queue_limits_many(
    tx: Tx, namespace_id: bytes, queue_ids: Sequence[bytes]
) -> dict[bytes, Row]:
    """``max_concurrency``, ``max_starts_per_second`` and the usage (``active_attempts``,
    ``window_start``, ``window_starts``) of many queues, by queue id. The caller holds the
    usage rows' locks."""
    if not queue_ids:
        return {}
    rows = await tx.fetchall(
        Q.queue_limits_many, {"namespace_id": namespace_id, "ids": tuple(sorted(set(queue_ids)))}
    )
    return {r["id"]: r for r in rows}


async def application_limits_many(tx: Tx, app_ids: Sequence[bytes]) -> dict[bytes, Row]:
    """``max_active_attempts``, ``max_starts_per_second`` and usage of many applications,
    by application id (rows missing for applications without a resources row)."""
    if not app_ids:
        return {}
    rows = await tx.fetchall(Q.application_limits_many, {"ids": tuple(sorted(set(app_ids)))})
    return {r["id"]: r for r in rows}


async def queue_window_set(
    tx: Tx, namespace_id: bytes, queue_id: bytes, window_start: datetime, window_starts: int
) -> None:
    await tx.execute(
        Q.queue_window_set,
        {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "window_start": window_start,
            "window_starts": window_starts,
        },
    )


async def application_window_set(
    tx: Tx, application_id: bytes, window_start: datetime, window_starts: int
) -> None:
    await tx.execute(
        Q.application_window_set,
        {
            "application_id": application_id,
            "window_start": window_start,
            "window_starts": window_starts,
        },
    )


async def queue_denials_add(
    tx: Tx,
    namespace_id: bytes,
    queue_id: bytes,
    *,
    permits: int = 0,
    rate: int = 0,
    key: int = 0,
    application: int = 0,
) -> None:
    """Add start denials to the queue's usage row, by kind."""
    await tx.execute(
        Q.queue_denials_add,
        {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "permits": permits,
            "rate": rate,
            "key": key,
            "application": application,
        },
    )


async def queue_denials_get(tx: Tx, namespace_id: bytes, queue_id: bytes) -> Row | None:
    """The queue's denial counters (``denials_quota``, ``_permits``, ``_rate``, ``_key``,
    ``_application``)."""
    return await tx.fetchone(
        Q.queue_denials_get, {"namespace_id": namespace_id, "queue_id": queue_id}
    )


async def limit_lock_many(
    tx: Tx, namespace_id: bytes, digests: Sequence[bytes]
) -> dict[bytes, Row]:
    """Lock (FOR UPDATE, in key_digest order) and return the key rows that exist, by digest."""
    if not digests:
        return {}
    rows = await tx.fetchall(
        Q.limit_lock_many,
        {"namespace_id": namespace_id, "digests": tuple(sorted(set(digests)))},
    )
    return {bytes(r["key_digest"]): r for r in rows}


async def limit_insert_if_absent(
    tx: Tx, namespace_id: bytes, key_digest: bytes, concurrency_key: str, now: datetime
) -> None:
    """Create the key's row (1 permit, held 0, grant_revision 0) unless it exists; either way
    the row is locked afterwards. A concurrent creator never makes this raise."""
    await tx.execute(
        Q.limit_insert_if_absent,
        {
            "namespace_id": namespace_id,
            "id": new_id(),
            "key_digest": key_digest,
            "concurrency_key": concurrency_key,
            "now": now,
        },
    )


async def limit_grant_if_revision(
    tx: Tx, namespace_id: bytes, limit_id: bytes, revision: int, now: datetime
) -> bool:
    """held + 1 and grant_revision + 1. False: the revision moved on or the key is full."""
    n = await tx.execute(
        Q.limit_grant_if_revision,
        {"namespace_id": namespace_id, "id": limit_id, "revision": revision, "now": now},
    )
    return n == 1


async def limit_release(
    tx: Tx, namespace_id: bytes, limit_id: bytes, n: int, now: datetime
) -> None:
    """held - ``n`` (raises when that would go below zero: a drift bug)."""
    await tx.execute(
        Q.limit_release, {"namespace_id": namespace_id, "id": limit_id, "n": n, "now": now}
    )


async def permit_insert(
    tx: Tx,
    namespace_id: bytes,
    attempt_id: bytes,
    kind: str,
    holder_ref: bytes,
    token: int | None,
    now: datetime,
) -> None:
    """Record a permit held by a running attempt (unique per attempt and kind)."""
    await tx.execute(
        Q.permit_insert,
        {
            "namespace_id": namespace_id,
            "id": new_id(),
            "attempt_id": attempt_id,
            "kind": kind,
            "holder_ref": holder_ref,
            "token": token,
            "now": now,
        },
    )


async def permit_list_for_attempts(
    tx: Tx, namespace_id: bytes, attempt_ids: Sequence[bytes]
) -> list[Row]:
    """Key permits held by these attempts."""
    if not attempt_ids:
        return []
    return await tx.fetchall(
        Q.permit_list_for_attempts,
        {"namespace_id": namespace_id, "ids": tuple(sorted(set(attempt_ids)))},
    )


async def permit_delete_many(tx: Tx, namespace_id: bytes, permit_ids: Sequence[bytes]) -> int:
    """Delete permit rows by id; the number deleted."""
    if not permit_ids:
        return 0
    return await tx.execute(
        Q.permit_delete_many, {"namespace_id": namespace_id, "ids": tuple(sorted(permit_ids))}
    )
