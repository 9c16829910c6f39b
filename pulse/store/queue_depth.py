"""Queue depth reads for /metrics (queries in ``pulse/sql/queue_depth.sql``)."""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "queue_depth")


class DepthRow(msgspec.Struct, frozen=True, kw_only=True):
    """One queue's usage counters and names."""

    namespace_id: bytes
    queue_id: bytes
    application: str
    namespace: str
    queue: str
    unfinished_tasks: int
    reservations: int
    active_attempts: int


async def queue_depth_top(tx: Tx, limit: int) -> list[DepthRow]:
    """The ``limit`` queues (all namespaces) with the most unfinished tasks."""
    rows = await tx.fetchall(Q.queue_depth_top, {"limit": limit})
    return [msgspec.convert(r, DepthRow) for r in rows]


async def queue_depth_needs_review_capped(
    tx: Tx, namespace_id: bytes, queue_id: bytes, cap: int
) -> int:
    """NEEDS_REVIEW tasks of the queue, at most ``cap``."""
    n = await tx.fetchval(
        Q.queue_depth_needs_review_capped,
        {"namespace_id": namespace_id, "queue_id": queue_id, "cap": cap},
    )
    return int(n or 0)


async def queue_depth_oldest_waiting(
    tx: Tx, namespace_id: bytes, queue_id: bytes, head: int, now: datetime | None = None
) -> float:
    """Seconds the oldest due WAITING task (among the first ``head`` on the fair index) has
    waited; 0 if none."""
    us = await tx.fetchval(
        Q.queue_depth_oldest_waiting,
        {"namespace_id": namespace_id, "queue_id": queue_id, "head": head, "now": now},
    )
    return max(0.0, int(us) / 1e6) if us is not None else 0.0
