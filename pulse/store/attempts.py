"""SQL for attempts, receipts, evidence and the worker-side task transitions
(``pulse/sql/attempts.sql``).

Every function runs one query on the caller's open :class:`~orbit.storage.Tx`. Guarded
updates (``*_if_<state>``) return a bool; False always means "the guard did not hold": the
row is not in that state, not bound to that attempt, or its revision moved on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "attempts")

Row = dict[str, Any]


# -- tasks (worker-side transitions) ---------------------------------------------------------


async def task_lock(tx: Tx, namespace_id: bytes, task_id: bytes) -> Row | None:
    """Lock (FOR UPDATE) and return the task row."""
    return await tx.fetchone(Q.task_lock, {"namespace_id": namespace_id, "id": task_id})


async def task_lease_if_waiting(tx: Tx, row: Row) -> bool:
    """WAITING → LEASED. False: the task is not WAITING or its revision moved on."""
    return await tx.execute(Q.task_lease_if_waiting, row) == 1


async def task_start_if_leased(tx: Tx, row: Row) -> bool:
    """LEASED → RUNNING for ``row['attempt_id']``. False: not leased to it any more."""
    return await tx.execute(Q.task_start_if_leased, row) == 1


async def task_release_if_leased(tx: Tx, row: Row) -> bool:
    """LEASED → WAITING. False: not leased to ``row['attempt_id']`` any more."""
    return await tx.execute(Q.task_release_if_leased, row) == 1


async def task_release_until_if_leased(tx: Tx, row: Row) -> bool:
    """LEASED → WAITING with ``available_at`` raised to ``row['available_at']``.
    False: not leased to ``row['attempt_id']`` any more."""
    return await tx.execute(Q.task_release_until_if_leased, row) == 1


async def task_fail_if_leased(tx: Tx, row: Row) -> bool:
    """LEASED → FAILED (deadline at start). False: not leased to the attempt any more."""
    return await tx.execute(Q.task_fail_if_leased, row) == 1


async def task_end_run_if_running(tx: Tx, row: Row) -> bool:
    """RUNNING → finished, WAITING (retry) or NEEDS_REVIEW.

    False: the task is not running ``row['attempt_id']`` any more, or its revision moved on.
    """
    return await tx.execute(Q.task_end_run_if_running, row) == 1


async def task_heartbeat_if_running(tx: Tx, row: Row) -> bool:
    """Extend the task's lease. False: not running the attempt, or the lease already passed."""
    return await tx.execute(Q.task_heartbeat_if_running, row) == 1


# -- attempts --------------------------------------------------------------------------------


async def attempt_insert_many(tx: Tx, rows: Sequence[Row]) -> None:
    """Insert OFFERED attempts (one multi-row INSERT)."""
    if rows:
        await tx.executemany(
            Q.attempt_insert_many, [{**r, "state": "OFFERED", "revision": 1} for r in rows]
        )


async def attempt_get(tx: Tx, namespace_id: bytes, attempt_id: bytes) -> Row | None:
    return await tx.fetchone(Q.attempt_get, {"namespace_id": namespace_id, "id": attempt_id})


async def attempt_lock(
    tx: Tx, namespace_id: bytes, attempt_id: bytes, now: datetime | None = None
) -> Row | None:
    """Lock (FOR UPDATE) and return the attempt row, with ``db_now`` (``now`` or the
    database clock, read once the lock is held)."""
    return await tx.fetchone(
        Q.attempt_lock, {"namespace_id": namespace_id, "id": attempt_id, "now": now}
    )


async def attempt_peek(tx: Tx, namespace_id: bytes, attempt_id: bytes) -> Row | None:
    """``task_id``, ``session_id``, ``queue_id``, ``owner_id`` of an attempt (no lock)."""
    return await tx.fetchone(Q.attempt_peek, {"namespace_id": namespace_id, "id": attempt_id})


async def start_context(
    tx: Tx, namespace_id: bytes, queue_id: bytes, session_id: bytes, zero_id: bytes
) -> Row | None:
    """``lease_ms``, ``session_state``, ``session_expires_at``, ``gate_closed``."""
    return await tx.fetchone(
        Q.start_context,
        {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "session_id": session_id,
            "zero_id": zero_id,
        },
    )


async def attempt_start_if_offered(tx: Tx, row: Row) -> bool:
    """OFFERED → RUNNING. False: not OFFERED any more or its revision moved on."""
    return await tx.execute(Q.attempt_start_if_offered, row) == 1


async def attempt_release_if_offered(tx: Tx, row: Row) -> bool:
    """OFFERED → RELEASED. False: not OFFERED any more or its revision moved on."""
    return await tx.execute(Q.attempt_release_if_offered, row) == 1


async def attempt_finish_if_running(tx: Tx, row: Row) -> bool:
    """RUNNING → SUCCEEDED/FAILED/CANCELLED/LOST. False: not RUNNING any more."""
    return await tx.execute(Q.attempt_finish_if_running, row) == 1


async def attempt_heartbeat_if_running(tx: Tx, row: Row) -> bool:
    """Extend a running attempt's lease.

    False: not RUNNING, bound to another session, or its lease already expired.
    """
    return await tx.execute(Q.attempt_heartbeat_if_running, row) == 1


async def attempt_heartbeat_view(
    tx: Tx, namespace_id: bytes, attempt_ids: Sequence[bytes]
) -> dict[bytes, Row]:
    if not attempt_ids:
        return {}
    rows = await tx.fetchall(
        Q.attempt_heartbeat_view, {"namespace_id": namespace_id, "ids": tuple(attempt_ids)}
    )
    return {r["id"]: r for r in rows}


async def attempt_list_expired(tx: Tx, state: str, now: datetime, limit: int) -> list[Row]:
    """Attempts in ``state`` whose lease passed, oldest first, across namespaces."""
    return await tx.fetchall(Q.attempt_list_expired, {"state": state, "now": now, "limit": limit})


async def attempt_list_for_task(tx: Tx, namespace_id: bytes, task_id: bytes) -> list[Row]:
    return await tx.fetchall(
        Q.attempt_list_for_task, {"namespace_id": namespace_id, "task_id": task_id}
    )


# -- receipts and evidence -------------------------------------------------------------------


async def evidence_insert(tx: Tx, row: Row) -> None:
    """Insert one evidence row (keys: namespace_id, id, attempt_id, task_id, kind, result,
    data, now)."""
    await tx.execute(Q.evidence_insert, row)


async def evidence_exists(
    tx: Tx, namespace_id: bytes, task_id: bytes, attempt_id: bytes, kind: str, request_digest: str
) -> bool:
    row = await tx.fetchone(
        Q.evidence_exists,
        {
            "namespace_id": namespace_id,
            "task_id": task_id,
            "attempt_id": attempt_id,
            "kind": kind,
            "request_digest": request_digest,
        },
    )
    return row is not None


async def evidence_list_for_task(tx: Tx, namespace_id: bytes, task_id: bytes) -> list[Row]:
    return await tx.fetchall(
        Q.evidence_list_for_task, {"namespace_id": namespace_id, "task_id": task_id}
    )


# -- batch forms (group commit) --------------------------------------------------------------


async def _by_id(tx: Tx, sql: str, namespace_id: bytes, ids: Sequence[bytes],
                 key: str = "id", **extra: Any) -> dict[bytes, Row]:  # fmt: skip
    if not ids:
        return {}
    rows = await tx.fetchall(
        sql, {"namespace_id": namespace_id, "ids": tuple(sorted(set(ids))), **extra}
    )
    return {r[key]: r for r in rows}


async def attempt_peek_many(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> dict[bytes, Row]:
    """:func:`attempt_peek` of many attempts (no lock), by attempt id."""
    return await _by_id(tx, Q.attempt_peek_many, namespace_id, ids)


async def task_lock_many(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> dict[bytes, Row]:
    """Lock (FOR UPDATE, in id order) and return many task rows, by id."""
    return await _by_id(tx, Q.task_lock_many, namespace_id, ids)


async def attempt_lock_many(
    tx: Tx, namespace_id: bytes, ids: Sequence[bytes], now: datetime | None = None
) -> dict[bytes, Row]:
    """Lock (FOR UPDATE, in id order) and return many attempt rows with ``db_now``."""
    return await _by_id(tx, Q.attempt_lock_many, namespace_id, ids, now=now)


async def session_state_many(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> dict[bytes, Row]:
    """``state`` and ``expires_at`` of many sessions (no lock), by session id."""
    return await _by_id(tx, Q.session_state_many, namespace_id, ids)


async def queue_start_context_many(
    tx: Tx, namespace_id: bytes, ids: Sequence[bytes], zero_id: bytes
) -> dict[bytes, Row]:
    """``lease_ms`` and ``gate_closed`` (namespace or queue gate) of many queues, by id."""
    return await _by_id(tx, Q.queue_start_context_many, namespace_id, ids, zero_id=zero_id)


async def usage_lock_for_start(
    tx: Tx, namespace_id: bytes, queue_ids: Sequence[bytes], owner_ids: Sequence[bytes]
) -> bool:
    """Lock the owners' application rows then the queues' usage rows (each sorted; ONE
    statement, the lock order's first two steps) and return whether one of them limits
    starts — :func:`start_limited` without ``keyed``, read on the rows as locked."""
    apps = tuple(sorted(set(owner_ids)))
    queues = tuple(sorted(set(queue_ids)))
    assert apps and queues, "every attempt has a queue and an owner"
    rows = await tx.fetchall(
        Q.usage_lock_for_start,
        {"namespace_id": namespace_id, "app_ids": apps, "queue_ids": queues},
    )
    return any(r["limited"] for r in rows)


async def start_limited(
    tx: Tx,
    namespace_id: bytes,
    queue_ids: Sequence[bytes],
    owner_ids: Sequence[bytes],
    *,
    keyed: bool = False,
) -> bool:
    """True when one of the queues or owning applications has a start limit, or ``keyed``
    (a task of the batch has a concurrency key: its key row is locked, last, and the usage
    rows must then be locked first) — whether the start batch must lock the usage rows
    before judging its items (unlocked read)."""
    if keyed:
        return True
    queues = await _by_id(tx, Q.queue_start_limits_many, namespace_id, queue_ids)
    if any(r["limited"] for r in queues.values()):
        return True
    if not owner_ids:
        return False
    rows = await tx.fetchall(
        Q.application_start_limits_many, {"ids": tuple(sorted(set(owner_ids)))}
    )
    return any(r["limited"] for r in rows)


async def attempt_rotate_token_if_running(tx: Tx, row: Row) -> bool:
    """Replace a RUNNING attempt's execution token digest (a re-sent ``start`` of its holding
    session). False: not running, another session's, its lease passed, or revision moved."""
    return await tx.execute(Q.attempt_rotate_token_if_running, row) == 1


# -- many rows, one statement --------------------------------------------------------------------
#
# The start batch's writes as ONE guarded UPDATE per table instead of one per row. Each row
# keeps its own guard (its id, state and revision — the ``CASE`` in the WHERE clause) and its
# own values (``CASE id WHEN …``); the statement's matched-row count must equal the number of
# rows, exactly as each per-row statement's count had to be 1 (the rows are locked by the
# calling transaction). Built here rather than in attempts.sql: its length depends on the batch.


def _case(column: str, ids: Sequence[bytes], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``CASE id WHEN %s THEN %s … END`` for ``column``'s new value per row."""
    args: list[Any] = []
    for i, v in zip(ids, values, strict=True):
        args += [i, v]
    return f"{column} = CASE id" + " WHEN %s THEN %s" * len(ids) + " END", args


def attempts_start_statement(
    namespace_id: bytes, rows: Sequence[dict[str, Any]], now: datetime
) -> tuple[str, list[Any]]:
    """OFFERED → RUNNING for many attempts (``attempt_start_if_offered`` per row): each row is
    ``{"id", "revision", "token_digest", "concurrency_token", "lease_expires_at"}``."""
    ids = [r["id"] for r in rows]
    sets, args = [], []
    for column, key in (("execution_token_digest", "token_digest"),
                        ("concurrency_token", "concurrency_token"),
                        ("lease_expires_at", "lease_expires_at")):  # fmt: skip
        sql, a = _case(column, ids, [r[key] for r in rows])
        sets.append(sql)
        args += a
    guard, guard_args = _case("revision", ids, [r["revision"] for r in rows])
    sql = (
        "UPDATE pulse_attempts SET state = 'RUNNING', " + ", ".join(sets)
        + ", started_at = %s, revision = revision + 1"
        " WHERE namespace_id = %s AND id IN (" + ", ".join(["%s"] * len(ids)) + ")"
        " AND state = 'OFFERED' AND " + guard
    )  # fmt: skip
    return sql, [*args, now, namespace_id, *ids, *guard_args]


def tasks_start_statement(
    namespace_id: bytes, rows: Sequence[dict[str, Any]], now: datetime
) -> tuple[str, list[Any]]:
    """LEASED → RUNNING for many tasks (``task_start_if_leased`` per row): each row is
    ``{"id", "revision", "attempt_id", "generation", "lease_expires_at"}``."""
    ids = [r["id"] for r in rows]
    attempts_sql, attempts_args = _case("attempts", ids, [r["generation"] for r in rows])
    lease_sql, lease_args = _case("lease_expires_at", ids, [r["lease_expires_at"] for r in rows])
    current, current_args = _case("current_attempt_id", ids, [r["attempt_id"] for r in rows])
    guard, guard_args = _case("revision", ids, [r["revision"] for r in rows])
    sql = (
        "UPDATE pulse_tasks SET state = 'RUNNING', " + attempts_sql + ", started_at = %s, "
        + lease_sql + ", state_version = state_version + 1, state_changed_at = %s,"
        " revision = revision + 1"
        " WHERE namespace_id = %s AND id IN (" + ", ".join(["%s"] * len(ids)) + ")"
        " AND state = 'LEASED' AND " + current + " AND " + guard
    )  # fmt: skip
    return sql, [*attempts_args, now, *lease_args, now, namespace_id, *ids, *current_args,
                 *guard_args]  # fmt: skip


def tasks_lease_statement(
    namespace_id: bytes,
    rows: Sequence[dict[str, Any]],
    lease_expires_at: datetime,
    now: datetime,
) -> tuple[str, list[Any]]:
    """WAITING → LEASED for many tasks offered to sessions (``task_lease_if_waiting`` per
    row): each row is ``{"id", "revision", "attempt_id", "session_id"}``."""
    ids = [r["id"] for r in rows]
    current, current_args = _case("current_attempt_id", ids, [r["attempt_id"] for r in rows])
    holders = [r["session_id"] for r in rows]
    if len(set(holders)) == 1:  # one session (the common case): no CASE needed
        holder, holder_args = "session_id = %s", holders[:1]
    else:
        holder, holder_args = _case("session_id", ids, holders)
    guard, guard_args = _case("revision", ids, [r["revision"] for r in rows])
    sql = (
        "UPDATE pulse_tasks SET state = 'LEASED', " + current + ", " + holder + ","
        " lease_expires_at = %s, state_version = state_version + 1, state_changed_at = %s,"
        " revision = revision + 1"
        " WHERE namespace_id = %s AND id IN (" + ", ".join(["%s"] * len(ids)) + ")"
        " AND state = 'WAITING' AND " + guard
    )  # fmt: skip
    return sql, [*current_args, *holder_args, lease_expires_at, now, namespace_id, *ids,
                 *guard_args]  # fmt: skip


# ---- retention purge (pulse.task_purge) --------------------------------------------------


async def _task_ids(tx: Tx, sql: str, namespace_id: bytes, ids: Sequence[bytes],
                    **extra: Any) -> set[bytes]:  # fmt: skip
    if not ids:
        return set()
    rows = await tx.fetchall(sql, {"namespace_id": namespace_id, "ids": tuple(ids), **extra})
    return {bytes(r["task_id"]) for r in rows}


async def attempt_tasks_in_flight(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> set[bytes]:
    """Those of ``ids`` with an attempt still OFFERED or RUNNING."""
    return await _task_ids(tx, Q.attempt_tasks_in_flight, namespace_id, ids)


async def evidence_tasks_since(
    tx: Tx, namespace_id: bytes, ids: Sequence[bytes], cutoff: datetime
) -> set[bytes]:
    """Those of ``ids`` with evidence recorded at or after ``cutoff``."""
    return await _task_ids(tx, Q.evidence_tasks_since, namespace_id, ids, cutoff=cutoff)


async def attempt_purge_for_tasks(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> int:
    if not ids:
        return 0
    args = {"namespace_id": namespace_id, "ids": tuple(ids)}
    return await tx.execute(Q.attempt_purge_for_tasks, args)


async def evidence_purge_for_tasks(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> int:
    """Delete the evidence of ``ids`` (the caller set the purge session flag)."""
    if not ids:
        return 0
    args = {"namespace_id": namespace_id, "ids": tuple(ids)}
    return await tx.execute(Q.evidence_purge_for_tasks, args)
