"""SQL of the stuck-work watchdog (``pulse/sql/watchdog.sql``): the scan of queues with a
bound, the claim and mark of overdue tasks, the stuck counts and the stuck task list.

Every function runs one query on the caller's open :class:`Tx` and returns dicts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Queries, Tx, load_queries
from pulse.store import tasks as task_store

_RAW = load_queries(__file__, "watchdog")
Q = Queries({k: v.replace("{cols}", task_store.Q.task_columns) for k, v in _RAW.items()})
Q_PAGE = Queries(
    {k: v.replace("{cols}", task_store.Q.task_page_columns) for k, v in _RAW.items()}
)

Row = dict[str, Any]

#: States the watchdog watches (every non-terminal state).
WATCHED_STATES = ("WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW")
#: Bounds beyond this (about 100 years) are clamped: nothing can be that old, and the
#: microsecond interval must fit a BIGINT.
MAX_AFTER_US = 100 * 365 * 86_400 * 1_000_000


def after_us(stuck_after_ms: int) -> int:
    """The bound as an SQL microsecond interval (clamped, see :data:`MAX_AFTER_US`)."""
    return min(int(stuck_after_ms) * 1000, MAX_AFTER_US)


async def queue_list(tx: Tx, after_namespace_id: bytes, after_id: bytes, limit: int) -> list[Row]:
    """Queues with ``stuck_after_ms`` (any namespace) after the keyset position."""
    return await tx.fetchall(
        Q.watchdog_queue_list,
        {"after_namespace_id": after_namespace_id, "after_id": after_id, "limit": limit},
    )


async def claim_overdue(
    tx: Tx,
    namespace_id: bytes,
    queue_id: bytes,
    state: str,
    stuck_after_ms: int,
    now: datetime,
    limit: int,
) -> list[Row]:
    """Lock (SKIP LOCKED) up to ``limit`` unsurfaced tasks of the queue in ``state`` since
    before ``now - stuck_after_ms``, oldest first."""
    return await tx.fetchall(
        Q.watchdog_claim_overdue,
        {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "state": state,
            "after_us": after_us(stuck_after_ms),
            "now": now,
            "limit": limit,
        },
    )


async def mark_many(tx: Tx, marks: list[Row]) -> list[int]:
    """Surface claimed tasks in one round trip; one matched-row count per mark (0: the task
    left its episode or was surfaced in it already). Each mark holds ``namespace_id``,
    ``id``, ``state``, ``state_version``, ``reason`` and ``now``."""
    return await tx.execute_batch([(Q.watchdog_mark_if_unsurfaced, m) for m in marks])


async def count_surfaced(
    tx: Tx, namespace_id: bytes, queue_id: bytes, stuck_after_ms: int, now: datetime
) -> dict[str, int]:
    """Surfaced tasks of the queue still in their episode and past the bound, by state."""
    rows = await tx.fetchall(
        Q.watchdog_count_surfaced,
        {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "after_us": after_us(stuck_after_ms),
            "now": now,
        },
    )
    return {r["state"]: int(r["n"]) for r in rows}


async def count_stuck_in_queue(tx: Tx, namespace_id: bytes, queue_id: bytes) -> int:
    """Tasks of the queue currently stuck (surfaced, same episode, non-terminal)."""
    value = await tx.fetchval(
        Q.watchdog_count_stuck_in_queue, {"namespace_id": namespace_id, "queue_id": queue_id}
    )
    return int(value or 0)


async def task_list(tx: Tx, params: Row) -> list[Row]:
    """``GET tasks`` with the stuck filter: the params of ``task_list`` plus ``stuck``
    (1 = currently stuck, 0 = not)."""
    return await tx.fetchall(Q.watchdog_task_list, params)


async def task_list_sizes(tx: Tx, params: Row) -> list[Row]:
    """The page :func:`task_list` would read, as ``created_at``, ``id`` and ``page_bytes``."""
    return await tx.fetchall(Q_PAGE.watchdog_task_list, params)


async def sessions_of_queue(
    tx: Tx, namespace_id: bytes, queue_name: str, now: datetime
) -> list[Row]:
    """Live sessions taking work from the queue, with ``held`` (offered + running)."""
    return await tx.fetchall(
        Q.watchdog_sessions_of_queue,
        {"namespace_id": namespace_id, "queue": queue_name, "now": now},
    )


async def key_holders(tx: Tx, namespace_id: bytes, digests: list[bytes]) -> list[Row]:
    """Limit rows of the keys (``held``, ``max_permits``) with each holding attempt."""
    if not digests:
        return []
    return await tx.fetchall(
        Q.watchdog_key_holders, {"namespace_id": namespace_id, "digests": tuple(digests)}
    )


async def current_attempts(tx: Tx, namespace_id: bytes, ids: list[bytes]) -> dict[bytes, Row]:
    """Attempts by id with their session's state and the worker instance's host and pid."""
    if not ids:
        return {}
    rows = await tx.fetchall(
        Q.watchdog_current_attempts, {"namespace_id": namespace_id, "ids": tuple(ids)}
    )
    return {r["id"]: r for r in rows}
