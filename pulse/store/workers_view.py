"""SQL of the operator's view of worker sessions (``pulse/sql/workers_view.sql``).

Every function runs one query on the caller's open :class:`Tx`; rows are dicts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "workers_view")

Row = dict[str, Any]


async def session_page(
    tx: Tx,
    namespace_id: bytes,
    state: str | None,
    queue: str | None,
    after_id: bytes,
    limit: int,
) -> list[Row]:
    """Sessions in ``state`` (None: any) that take work from ``queue`` (None: any), with ids
    after ``after_id``, by id, with their instance's host, pid, sdk and times."""
    return await tx.fetchall(
        Q.session_page,
        {"namespace_id": namespace_id, "state": state, "queue": queue, "after_id": after_id,
         "limit": limit},
    )  # fmt: skip


async def session_held_counts(
    tx: Tx, namespace_id: bytes, session_ids: list[bytes]
) -> dict[bytes, dict[str, int]]:
    """session id → {"OFFERED": n, "RUNNING": m} for the sessions that hold attempts."""
    if not session_ids:
        return {}
    rows = await tx.fetchall(
        Q.session_held_counts, {"namespace_id": namespace_id, "session_ids": session_ids}
    )
    out: dict[bytes, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["session_id"], {})[str(r["state"])] = int(r["n"])
    return out


async def session_held_sample(
    tx: Tx, namespace_id: bytes, session_ids: list[bytes], per_session: int
) -> list[Row]:
    """The first ``per_session`` attempts (by id) each session holds, by session then id."""
    if not session_ids:
        return []
    return await tx.fetchall(
        Q.session_held_sample,
        {"namespace_id": namespace_id, "session_ids": session_ids, "per_session": per_session},
    )


async def session_ids_using_queue(
    tx: Tx, namespace_id: bytes, queue: str, now: datetime, limit: int
) -> list[bytes]:
    """Ids of live sessions that take work from ``queue`` (at most ``limit``)."""
    rows = await tx.fetchall(
        Q.session_ids_using_queue,
        {"namespace_id": namespace_id, "queue": queue, "now": now, "limit": limit},
    )
    return [r["id"] for r in rows]
