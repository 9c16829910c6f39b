"""SQL for tasks on the producer/operator side (submit, read, list, cancel, resolve, expire).
Queries live in ``pulse/sql/tasks.sql``; the attempt and evidence rows are
:mod:`pulse.store.attempts`'s.

Rows are dicts with the columns of the ``task_columns`` block. Guarded updates return a
bool: False means the guard (revision and state) no longer held.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Queries, Tx, load_queries
from orbit.storage.literals import insert_values

_RAW = load_queries(__file__, "tasks")
Q = Queries({k: v.replace("{cols}", _RAW.task_columns) for k, v in _RAW.items()})
#: The same queries selecting only the keyset position and the stored JSON bytes of each
#: task (``task_page_columns``): a list page is sized before its rows are read.
Q_PAGE = Queries({k: v.replace("{cols}", _RAW.task_page_columns) for k, v in _RAW.items()})

Row = dict[str, Any]


async def task_get(
    tx: Tx, namespace_id: bytes, task_id: bytes, *, for_update: bool = False
) -> Row | None:
    sql = Q.task_get_for_update if for_update else Q.task_get
    return await tx.fetchone(sql, {"namespace_id": namespace_id, "id": task_id})


async def task_get_many(
    tx: Tx, namespace_id: bytes, task_ids: Sequence[bytes], *, for_update: bool = False
) -> dict[bytes, Row]:
    """Tasks by id (missing ids are absent from the result). ``for_update`` locks them in
    primary-key order."""
    if not task_ids:
        return {}
    sql = Q.task_get_many_for_update if for_update else Q.task_get_many
    rows = await tx.fetchall(sql, {"namespace_id": namespace_id, "ids": tuple(task_ids)})
    return {r["id"]: r for r in rows}


async def task_get_by_identity(
    tx: Tx, namespace_id: bytes, owner_id: bytes, kind: str, pipeline_version: str, dedup_key: str
) -> Row | None:
    return await tx.fetchone(
        Q.task_get_by_identity,
        {
            "namespace_id": namespace_id,
            "owner_id": owner_id,
            "kind": kind,
            "pipeline_version": pipeline_version,
            "dedup_key": dedup_key,
        },
    )


async def task_find_identities(
    tx: Tx, namespace_id: bytes, owner_id: bytes, identities: Sequence[tuple[str, str, str]]
) -> dict[tuple[str, str, str], Row]:
    """Existing tasks of ``owner_id`` among ``(kind, pipeline_version, dedup_key)`` tuples:
    their ids from pulse_task_identities, then the tasks by id (two primary-key reads)."""
    if not identities:
        return {}
    found = await tx.fetchall(
        Q.identity_find_tasks,
        {"namespace_id": namespace_id, "owner_id": owner_id, "identities": tuple(identities)},
    )
    if not found:
        return {}
    rows = await task_get_many(tx, namespace_id, [bytes(r["task_id"]) for r in found])
    return {(r["kind"], r["pipeline_version"], r["dedup_key"]): r for r in rows.values()}


async def identity_insert_many(tx: Tx, rows: Sequence[Row]) -> int:
    """Insert the identities of the tasks of ``rows`` (keys of ``task_insert``) that have a
    dedup key, with one multi-row INSERT; the number inserted. Raises DuplicateKey when any
    identity is taken (nothing inserted). Runs before the tasks' own INSERT, in the same
    transaction."""
    keyed = [r for r in rows if r["dedup_key"] is not None]
    if keyed:
        await tx.executemany(Q.identity_insert, keyed)
    return len(keyed)


async def identity_delete(tx: Tx, row: Row) -> None:
    """Take back the identity :func:`identity_insert_many` inserted for ``row``'s task."""
    if row["dedup_key"] is not None:
        await tx.execute(Q.identity_delete, row)


async def identity_purge_for_tasks(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> int:
    """Retention purge: delete the identities of these finished tasks (before the tasks)."""
    if not ids:
        return 0
    return await tx.execute(
        Q.identity_purge_for_tasks, {"namespace_id": namespace_id, "ids": tuple(ids)}
    )


async def task_insert_many(tx: Tx, rows: Sequence[Row]) -> None:
    """Insert tasks with one multi-row INSERT (their identities first:
    :func:`identity_insert_many`)."""
    if rows:
        await tx.executemany(Q.task_insert, rows)


#: ``task_insert_values`` without its comment lines, and its columns in order.
_INSERT_HEAD = "\n".join(
    line for line in Q.task_insert_values.splitlines() if not line.lstrip().startswith("--")
).strip()
_INSERT_COLUMNS = tuple(
    c.strip() for c in _INSERT_HEAD[_INSERT_HEAD.index("(") + 1 : _INSERT_HEAD.index(")")].split(",")
)


async def task_insert_literal(tx: Tx, rows: Sequence[Row]) -> None:
    """:func:`task_insert_many` for big batches: the same multi-row INSERT, its values
    rendered as memoised SQL literals (orbit/storage/literals.py) instead of being escaped
    by the driver one parameter at a time. ``rows`` have the keys of ``task_insert``
    (``state_changed_at`` is ``created_at``)."""
    if not rows:
        return
    columns = ["created_at" if c == "state_changed_at" else c for c in _INSERT_COLUMNS]
    sql = insert_values(_INSERT_HEAD, columns, rows)
    await tx.execute(sql)


async def task_list(tx: Tx, params: Row) -> list[Row]:
    """One page of tasks; ``params`` holds the filters (None = any), the keyset position
    ``after_created_at``/``after_id`` and ``limit``."""
    return await tx.fetchall(Q.task_list, params)


async def task_list_sizes(tx: Tx, params: Row) -> list[Row]:
    """The page :func:`task_list` would read, as ``created_at``, ``id`` and ``page_bytes``
    (the bytes of its stored JSON) only."""
    return await tx.fetchall(Q_PAGE.task_list, params)


async def task_cancel_candidates(
    tx: Tx,
    namespace_id: bytes,
    owner_id: bytes | None,
    queue_id: bytes | None,
    kind: str | None,
    limit: int,
) -> list[Row]:
    """Up to ``limit`` not-yet-cancelled tasks matching the filters (None = any), unlocked:
    ``id``, ``queue_id``, ``owner_id``. The query is picked by the most selective filter."""
    if owner_id is not None:
        sql = Q.task_cancel_candidates_by_owner
    elif queue_id is not None:
        sql = Q.task_cancel_candidates_by_queue
    else:
        sql = Q.task_cancel_candidates_all
    return await tx.fetchall(
        sql,
        {
            "namespace_id": namespace_id,
            "owner_id": owner_id,
            "queue_id": queue_id,
            "kind": kind,
            "limit": limit,
        },
    )


async def task_cancel_if_unstarted(
    tx: Tx, namespace_id: bytes, task_id: bytes, revision: int, error: str, now: datetime
) -> bool:
    """WAITING/LEASED → CANCELLED. False: revision or state moved on."""
    n = await tx.execute(
        Q.task_cancel_if_unstarted,
        {
            "namespace_id": namespace_id,
            "id": task_id,
            "revision": revision,
            "error": error,
            "now": now,
        },
    )
    return n == 1


async def task_request_cancel_if_running(
    tx: Tx, namespace_id: bytes, task_id: bytes, revision: int
) -> bool:
    """Set cancel_requested on a RUNNING task. False: not RUNNING, already requested, or the
    revision moved on."""
    n = await tx.execute(
        Q.task_request_cancel_if_running,
        {"namespace_id": namespace_id, "id": task_id, "revision": revision},
    )
    return n == 1


async def task_resolve_retry_if_review(
    tx: Tx, namespace_id: bytes, task_id: bytes, revision: int, resolution: str, now: datetime
) -> bool:
    """NEEDS_REVIEW → WAITING. False: not NEEDS_REVIEW or the revision moved on."""
    n = await tx.execute(
        Q.task_resolve_retry_if_review,
        {
            "namespace_id": namespace_id,
            "id": task_id,
            "revision": revision,
            "resolution": resolution,
            "now": now,
        },
    )
    return n == 1


async def task_resolve_finish_if_review(
    tx: Tx,
    namespace_id: bytes,
    task_id: bytes,
    revision: int,
    state: str,
    result: str | None,
    error: str | None,
    resolution: str,
    now: datetime,
) -> bool:
    """NEEDS_REVIEW → SUCCEEDED/FAILED. False: not NEEDS_REVIEW or the revision moved on."""
    n = await tx.execute(
        Q.task_resolve_finish_if_review,
        {
            "namespace_id": namespace_id,
            "id": task_id,
            "revision": revision,
            "state": state,
            "result": result,
            "error": error,
            "resolution": resolution,
            "now": now,
        },
    )
    return n == 1


async def deadline_insert_many(tx: Tx, rows: Sequence[Row]) -> int:
    """Insert the deadline rows of the tasks of ``rows`` (keys of ``task_insert``) that have
    a deadline, with one multi-row INSERT (after the tasks, same transaction)."""
    timed = [r for r in rows if r["deadline_at"] is not None]
    if timed:
        await tx.executemany(Q.deadline_insert, timed)
    return len(timed)


async def deadline_stale_rows(tx: Tx, now: datetime, limit: int) -> list[Row]:
    """Deadline rows (any namespace) past their deadline whose task is finished, gone or
    without that deadline: ``namespace_id``, ``task_id``."""
    return await tx.fetchall(Q.deadline_stale_rows, {"now": now, "limit": limit})


async def deadline_delete_many(
    tx: Tx, namespace_id: bytes, task_ids: Sequence[bytes], now: datetime
) -> int:
    if not task_ids:
        return 0
    return await tx.execute(
        Q.deadline_delete_many,
        {"namespace_id": namespace_id, "ids": tuple(task_ids), "now": now},
    )


async def task_expire_candidates(tx: Tx, now: datetime, limit: int) -> list[Row]:
    """Up to ``limit`` WAITING tasks past their deadline, any namespace, unlocked."""
    return await tx.fetchall(Q.task_expire_candidates, {"now": now, "limit": limit})


async def task_lock_expired_many(
    tx: Tx, namespace_id: bytes, task_ids: Sequence[bytes], now: datetime
) -> list[Row]:
    """Lock (SKIP LOCKED) those of ``task_ids`` still WAITING past their deadline."""
    if not task_ids:
        return []
    return await tx.fetchall(
        Q.task_lock_expired_many,
        {"namespace_id": namespace_id, "ids": tuple(task_ids), "now": now},
    )


async def task_fail_deadline_if_waiting(
    tx: Tx, namespace_id: bytes, task_id: bytes, revision: int, error: str, now: datetime
) -> bool:
    """WAITING → FAILED (deadline). False: not WAITING or the revision moved on."""
    n = await tx.execute(
        Q.task_fail_deadline_if_waiting,
        {
            "namespace_id": namespace_id,
            "id": task_id,
            "revision": revision,
            "error": error,
            "now": now,
        },
    )
    return n == 1


async def attempt_latest_for_task(tx: Tx, namespace_id: bytes, task_id: bytes) -> Row | None:
    return await tx.fetchone(
        Q.attempt_latest_for_task, {"namespace_id": namespace_id, "task_id": task_id}
    )


# ---- retention purge (pulse.task_purge) --------------------------------------------------


async def task_purge_candidates(
    tx: Tx, namespace_id: bytes, state: str, cutoff: datetime, after_t: datetime,
    after_id: bytes, limit: int,
) -> list[Row]:  # fmt: skip
    """Lock (SKIP LOCKED) up to ``limit`` tasks in ``state`` changed before ``cutoff``,
    after the position ``(after_t, after_id)``: id, source_kind, state_changed_at."""
    args = {"namespace_id": namespace_id, "state": state, "cutoff": cutoff,
            "after_t": after_t, "after_id": after_id, "limit": limit}  # fmt: skip
    return await tx.fetchall(Q.task_purge_candidates, args)


async def task_purge_many(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> int:
    if not ids:
        return 0
    return await tx.execute(Q.task_purge_many, {"namespace_id": namespace_id, "ids": tuple(ids)})


async def task_oldest_unfinished(tx: Tx, namespace_id: bytes) -> datetime | None:
    value: datetime | None = await tx.fetchval(
        Q.task_oldest_unfinished, {"namespace_id": namespace_id}
    )
    return value
