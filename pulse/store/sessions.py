"""SQL for worker instances and sessions (``pulse/sql/sessions.sql``).

Every function runs one query on the caller's open :class:`~orbit.storage.Tx` and returns
rows as dicts. Guarded updates return a bool whose False meaning is in the docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "sessions")

Row = dict[str, Any]


async def instance_get(tx: Tx, namespace_id: bytes, instance_id: bytes) -> Row | None:
    return await tx.fetchone(Q.instance_get, {"namespace_id": namespace_id, "id": instance_id})


async def instance_lock(tx: Tx, namespace_id: bytes, instance_id: bytes) -> Row | None:
    """Lock (FOR UPDATE) and return the instance row."""
    return await tx.fetchone(Q.instance_lock, {"namespace_id": namespace_id, "id": instance_id})


async def instance_insert(tx: Tx, row: Row) -> None:
    """Insert an instance; DuplicateKey (PRIMARY) when the id exists."""
    await tx.execute(Q.instance_insert, row)


async def instance_update_if_revision(tx: Tx, row: Row) -> bool:
    """Refresh host/pid/sdk of a re-registering instance. False: its revision moved on."""
    return await tx.execute(Q.instance_update_if_revision, row) == 1


async def instance_touch(tx: Tx, namespace_id: bytes, instance_id: bytes, now: datetime) -> None:
    await tx.execute(
        Q.instance_touch, {"namespace_id": namespace_id, "id": instance_id, "now": now}
    )


async def session_insert(tx: Tx, row: Row) -> None:
    await tx.execute(Q.session_insert, row)


async def session_get(tx: Tx, namespace_id: bytes, session_id: bytes) -> Row | None:
    return await tx.fetchone(Q.session_get, {"namespace_id": namespace_id, "id": session_id})


async def session_lock(tx: Tx, namespace_id: bytes, session_id: bytes) -> Row | None:
    """Lock (FOR UPDATE) and return the session row."""
    return await tx.fetchone(Q.session_lock, {"namespace_id": namespace_id, "id": session_id})


async def session_get_for_auth(
    tx: Tx, namespace_id: bytes, session_id: bytes, now: datetime | None
) -> Row | None:
    """The session with its namespace name, credential and application status, and
    ``db_now`` (``now`` or the database clock)."""
    return await tx.fetchone(
        Q.session_get_for_auth, {"namespace_id": namespace_id, "id": session_id, "now": now}
    )


async def session_extend_if_active(
    tx: Tx, namespace_id: bytes, session_id: bytes, expires_at: datetime, now: datetime
) -> bool:
    """Move the session's expiry to ``expires_at``.

    False: the session is not ACTIVE, or its expiry already passed (recovery will expire it).
    """
    n = await tx.execute(
        Q.session_extend_if_active,
        {"namespace_id": namespace_id, "id": session_id, "expires_at": expires_at, "now": now},
    )
    return n == 1


async def session_attach_node(tx: Tx, namespace_id: bytes, session_id: bytes, node_id: str) -> bool:
    """Record that ``node_id`` holds the session's stream. False: the session is not ACTIVE."""
    n = await tx.execute(
        Q.session_attach_node, {"namespace_id": namespace_id, "id": session_id, "node_id": node_id}
    )
    return n == 1


async def session_detach_node_if_node(
    tx: Tx, namespace_id: bytes, session_id: bytes, node_id: str
) -> bool:
    """Clear the stream holder when it is ``node_id``. False: another node (or none) holds it."""
    n = await tx.execute(
        Q.session_detach_node_if_node,
        {"namespace_id": namespace_id, "id": session_id, "node_id": node_id},
    )
    return n == 1


async def session_list_expired(tx: Tx, now: datetime, limit: int) -> list[Row]:
    """ACTIVE sessions past their expiry, oldest first, across namespaces (recovery scan)."""
    return await tx.fetchall(Q.session_list_expired, {"now": now, "limit": limit})


async def session_expire_if_due(
    tx: Tx, namespace_id: bytes, session_id: bytes, now: datetime
) -> bool:
    """ACTIVE → EXPIRED. False: not ACTIVE any more, or a heartbeat extended it meanwhile."""
    n = await tx.execute(
        Q.session_expire_if_due, {"namespace_id": namespace_id, "id": session_id, "now": now}
    )
    return n == 1


async def session_lock_offer_skip_locked(
    tx: Tx, namespace_id: bytes, session_ids: Sequence[bytes]
) -> list[Row]:
    """Lock the free ones of ``session_ids`` (SKIP LOCKED: a locked row is left out), in id
    order; their state, node, capacity and expiry."""
    return await tx.fetchall(
        Q.session_lock_offer_skip_locked,
        {"namespace_id": namespace_id, "ids": tuple(sorted(session_ids))},
    )


async def session_count_held_many(
    tx: Tx, namespace_id: bytes, session_ids: Sequence[bytes]
) -> dict[bytes, int]:
    """OFFERED + RUNNING attempts of each session (absent: none)."""
    rows = await tx.fetchall(
        Q.session_count_held_many, {"namespace_id": namespace_id, "ids": tuple(session_ids)}
    )
    return {bytes(r["session_id"]): int(r["n"]) for r in rows}


#: WAITING index entries :func:`session_queue_has_due_work` reads beyond ``exclude``'s.
DUE_WORK_SCAN = 16


async def session_queue_has_due_work(
    tx: Tx, namespace_id: bytes, queue_id: bytes, now: datetime, exclude: Sequence[bytes]
) -> bool:
    """A due WAITING task of the queue other than ``exclude`` among its first WAITING entries
    on the fair index (at most ``len(exclude) + DUE_WORK_SCAN``); True as well when there are
    more WAITING tasks than that (not all looked at)."""
    scan = len(exclude) + DUE_WORK_SCAN
    row = await tx.fetchone(
        Q.session_queue_has_due_work,
        {"namespace_id": namespace_id, "queue_id": queue_id, "now": now,
         "ids": tuple(exclude), "scan": scan},
    )  # fmt: skip
    return row is not None and (int(row["due"]) > 0 or int(row["n"]) >= scan)


async def session_list_held(
    tx: Tx, namespace_id: bytes, session_id: bytes, limit: int
) -> list[Row]:
    return await tx.fetchall(
        Q.session_list_held,
        {"namespace_id": namespace_id, "session_id": session_id, "limit": limit},
    )


async def session_list_offered(
    tx: Tx, namespace_id: bytes, session_id: bytes, now: datetime
) -> list[Row]:
    """Outstanding (unexpired) offers of the session with their task fields."""
    return await tx.fetchall(
        Q.session_list_offered,
        {"namespace_id": namespace_id, "session_id": session_id, "now": now},
    )


async def session_close_if_active(
    tx: Tx, namespace_id: bytes, session_id: bytes, now: datetime
) -> bool:
    """ACTIVE → CLOSED (the worker ended it). False: it was not ACTIVE any more."""
    n = await tx.execute(
        Q.session_close_if_active, {"namespace_id": namespace_id, "id": session_id, "now": now}
    )
    return n == 1


async def session_keyed_waiting(tx: Tx, namespace_id: bytes, queue_id: bytes) -> bool:
    """Keyed tasks among the queue's first (at most 1000) WAITING tasks on the fair index."""
    row = await tx.fetchone(
        Q.session_keyed_waiting, {"namespace_id": namespace_id, "queue_id": queue_id}
    )
    return row is not None
