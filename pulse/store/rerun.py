"""SQL of re-running finished tasks (``pulse/sql/rerun.sql``). Each function runs one query
on the caller's open :class:`Tx`; rows are dicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "rerun")

Row = dict[str, Any]


async def task_rerun_if_finished(
    tx: Tx,
    namespace_id: bytes,
    task_id: bytes,
    revision: int,
    extra: int,
    resolution: str,
    now: datetime,
) -> bool:
    """FAILED/CANCELLED → WAITING with at least ``extra`` more attempts. False: the task
    changed since it was read, or is not finished."""
    n = await tx.execute(
        Q.task_rerun_if_finished,
        {"namespace_id": namespace_id, "id": task_id, "revision": revision, "extra": extra,
         "resolution": resolution, "now": now},
    )  # fmt: skip
    return n == 1


def _filter_args(namespace_id: bytes, f: dict[str, Any]) -> dict[str, Any]:
    return {
        "namespace_id": namespace_id,
        "states": tuple(f["states"]),
        "since": f["since"],
        "until": f["until"],
        "queue_id": f["queue_id"],
        "kind": f["kind"],
        "owner_id": f["owner_id"],
        "error_type": f["error_type"],
    }


async def task_rerun_candidates(
    tx: Tx,
    namespace_id: bytes,
    filters: dict[str, Any],
    after_t: datetime,
    after_id: bytes,
    limit: int,
) -> list[Row]:
    """The next ``limit`` finished tasks of ``filters`` after position (after_t, after_id)."""
    args = {**_filter_args(namespace_id, filters), "after_t": after_t, "after_id": after_id,
            "limit": limit}  # fmt: skip
    return await tx.fetchall(Q.task_rerun_candidates, args)


async def task_rerun_count(
    tx: Tx, namespace_id: bytes, filters: dict[str, Any], cap: int
) -> int:
    """How many finished tasks match ``filters`` (at most ``cap``)."""
    args = {**_filter_args(namespace_id, filters), "cap": cap}
    return int(await tx.fetchval(Q.task_rerun_count, args))
