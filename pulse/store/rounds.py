"""Multi-namespace forms of the worker-side reads, locks and writes, for node rounds
(``pulse/sql/attempts.sql``, the ``*_keys`` queries; ``orbit/storage/keys.py``).

Every function takes a :class:`~orbit.storage.keys.KeySet` (rows grouped by namespace) and
runs ONE statement whose predicate names the namespace of every row. Locking reads take
their rows in ``(namespace_id, id)`` order. Results are keyed by ``(namespace_id, id)``.

The write builders return ``(sql, args)`` for :meth:`~orbit.storage.Tx.execute_batch`: ONE
guarded UPDATE per table for every row of a round, each row keeping its own guard (state,
current attempt, revision — ``CASE id WHEN …`` in the WHERE clause) and its own values; the
matched count (``CLIENT.FOUND_ROWS``) must equal the number of rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from orbit.storage import Tx, load_queries
from orbit.storage.keys import KeySet, case_by_id, case_expr, expand, guard_by_id

Q = load_queries(__file__, "attempts")

Row = dict[str, Any]
Key = tuple[bytes, bytes]


def _by_key(rows: Sequence[Row], id_column: str = "id") -> dict[Key, Row]:
    return {(bytes(r["namespace_id"]), bytes(r[id_column])): r for r in rows}


async def attempt_peek_keys(tx: Tx, keys: KeySet) -> dict[Key, Row]:
    """``task_id``, ``session_id``, ``queue_id``, ``owner_id``, ``concurrency_key_digest`` of
    many attempts (no lock), by (namespace, attempt id)."""
    if not keys:
        return {}
    sql, args = expand(Q.attempt_peek_keys, keys)
    return _by_key(await tx.fetchall(sql, args))


async def task_lock_keys(tx: Tx, keys: KeySet) -> dict[Key, Row]:
    """Lock (FOR UPDATE, in key order) and return many task rows."""
    if not keys:
        return {}
    sql, args = expand(Q.task_lock_keys, keys)
    return _by_key(await tx.fetchall(sql, args))


async def attempt_lock_keys(tx: Tx, keys: KeySet, now: datetime | None) -> dict[Key, Row]:
    """Lock (FOR UPDATE, in key order) and return many attempt rows, each with ``db_now``."""
    if not keys:
        return {}
    sql, args = expand(Q.attempt_lock_keys, keys, now)
    return _by_key(await tx.fetchall(sql, args))


async def session_state_keys(tx: Tx, keys: KeySet) -> dict[Key, Row]:
    """``state`` and ``expires_at`` of many sessions (no lock)."""
    if not keys:
        return {}
    sql, args = expand(Q.session_state_keys, keys)
    return _by_key(await tx.fetchall(sql, args))


async def queue_start_context_keys(tx: Tx, keys: KeySet, zero_id: bytes) -> dict[Key, Row]:
    """``lease_ms`` and ``gate_closed`` (namespace or queue gate) of many queues."""
    if not keys:
        return {}
    sql, args = expand(Q.queue_start_context_keys, keys, zero_id)
    return _by_key(await tx.fetchall(sql, args))


async def usage_lock_for_start_keys(
    tx: Tx, queues: KeySet, owner_ids: Sequence[bytes]
) -> tuple[dict[bytes, bool], dict[Key, bool]]:
    """Lock the owners' application rows (sorted) then the queues' usage rows (sorted by
    namespace, queue) in ONE statement; return whether each limits starts: (applications by
    id, queues by (namespace, queue id))."""
    apps = sorted(set(owner_ids))
    assert apps and queues, "every attempt has a queue and an owner"
    sql = Q.usage_lock_for_start_keys.replace("/*apps*/", ", ".join(["%s"] * len(apps)))
    sql, args = expand(sql, queues, *apps)
    rows = await tx.fetchall(sql, args)
    by_app: dict[bytes, bool] = {}
    by_queue: dict[Key, bool] = {}
    for r in rows:
        if r["kind"] == "a":
            by_app[bytes(r["id"])] = bool(r["limited"])
        else:
            by_queue[(bytes(r["namespace_id"]), bytes(r["id"]))] = bool(r["limited"])
    return by_app, by_queue


# -- writes: one guarded UPDATE per table for every row of a round --------------------------


def guarded_update(
    table: str,
    keys: KeySet,
    *,
    values: Mapping[str, Mapping[bytes, Any]],
    also: Sequence[tuple[str, Sequence[Any]]] = (),
    state: str,
    guards: Mapping[str, Mapping[bytes, Any]],
) -> tuple[str, list[Any]]:
    """ONE guarded UPDATE of ``table`` for the rows of ``keys``: each column of ``values``
    set to each row's own value (by id), the ``also`` SET items (SQL, args) as they are,
    ``revision = revision + 1``; each row guarded by ``state`` and by its own value of every
    column of ``guards``. Its matched count must equal the rows."""
    sets: list[str] = []
    args: list[Any] = []
    for column, per_row in values.items():
        sql, a = case_by_id(column, per_row)
        sets.append(sql)
        args += a
    for sql, also_args in also:
        sets.append(sql)
        args += also_args
    where, where_args = keys.predicate()
    conditions: list[str] = []
    guard_args: list[Any] = []
    for column, per_row in guards.items():
        sql, a = guard_by_id(column, per_row)
        conditions.append(sql)
        guard_args += a
    sql = (
        f"UPDATE {table} SET " + ", ".join([*sets, "revision = revision + 1"])
        + " WHERE " + where + " AND state = %s"
        + "".join(" AND " + c for c in conditions)
    )  # fmt: skip
    return sql, [*args, *where_args, state, *guard_args]


def _col(rows: Mapping[Key, Mapping[str, Any]], name: str) -> dict[bytes, Any]:
    return {k[1]: r.get(name) for k, r in rows.items()}


def attempts_start_statement(rows: Mapping[Key, Mapping[str, Any]], now: datetime) -> tuple[str, list[Any]]:
    """OFFERED → RUNNING for the attempts of many namespaces: each row (by (namespace, id)) is
    ``{"revision", "token_digest", "concurrency_token", "lease_expires_at"}``."""
    return guarded_update(
        "pulse_attempts", KeySet(rows),
        values={"execution_token_digest": _col(rows, "token_digest"),
                "concurrency_token": _col(rows, "concurrency_token"),
                "lease_expires_at": _col(rows, "lease_expires_at")},
        also=[("state = 'RUNNING'", ()), ("started_at = %s", (now,))],
        state="OFFERED", guards={"revision": _col(rows, "revision")},
    )  # fmt: skip


def tasks_start_statement(rows: Mapping[Key, Mapping[str, Any]], now: datetime) -> tuple[str, list[Any]]:
    """LEASED → RUNNING for the tasks of many namespaces: each row (by (namespace, id)) is
    ``{"revision", "attempt_id", "generation", "lease_expires_at"}``."""
    return guarded_update(
        "pulse_tasks", KeySet(rows),
        values={"attempts": _col(rows, "generation"),
                "lease_expires_at": _col(rows, "lease_expires_at")},
        also=[("state = 'RUNNING'", ()), ("started_at = %s", (now,)),
              ("state_version = state_version + 1", ()), ("state_changed_at = %s", (now,))],
        state="LEASED",
        guards={"current_attempt_id": _col(rows, "attempt_id"), "revision": _col(rows, "revision")},
    )  # fmt: skip


_RECEIPT = ("receipt_id", "receipt_op", "receipt_digest", "receipt_task_state")


def attempts_finish_statement(rows: Mapping[Key, Mapping[str, Any]], now: datetime) -> tuple[str, list[Any]]:
    """RUNNING → its end state for the attempts of many namespaces, with the applied report's
    receipt (``attempt_finish_if_running`` per row): each row is ``{"state", "result",
    "error", "retryable", "revision"}``, plus for a report ``{"receipt_id", "receipt_op",
    "receipt_digest", "receipt_task_state"}`` (``receipt_at`` is ``now``)."""
    columns: tuple[str, ...] = ("state", "result", "error", "retryable")
    also: list[tuple[str, Sequence[Any]]] = [("finished_at = %s", (now,))]
    if any("receipt_id" in r for r in rows.values()):
        columns += _RECEIPT
        also.append(("receipt_at = %s", (now,)))
    return guarded_update(
        "pulse_attempts", KeySet(rows), values={c: _col(rows, c) for c in columns}, also=also,
        state="RUNNING", guards={"revision": _col(rows, "revision")},
    )


def tasks_end_run_statement(rows: Mapping[Key, Mapping[str, Any]], now: datetime) -> tuple[str, list[Any]]:
    """RUNNING → finished, WAITING (retry) or NEEDS_REVIEW for the tasks of many namespaces
    (``task_end_run_if_running`` per row): each row is ``{"attempt_id", "state", "result",
    "error", "finished_at", "available_at", "effect_uncertain", "revision"}``."""
    # A row without a new available_at (NULL) keeps its own.
    expr, expr_args = case_expr(_col(rows, "available_at"))
    return guarded_update(
        "pulse_tasks", KeySet(rows),
        values={c: _col(rows, c) for c in ("state", "result", "error", "finished_at",
                                           "effect_uncertain")},
        also=[(f"available_at = COALESCE({expr}, available_at)", expr_args),
              ("current_attempt_id = NULL, session_id = NULL, lease_expires_at = NULL,"
               " cancel_requested = 0, state_version = state_version + 1", ()),
              ("state_changed_at = %s", (now,))],
        state="RUNNING",
        guards={"current_attempt_id": _col(rows, "attempt_id"), "revision": _col(rows, "revision")},
    )  # fmt: skip


# -- heartbeats ------------------------------------------------------------------------------


async def session_lock_keys(tx: Tx, keys: KeySet, now: datetime | None) -> dict[Key, Row]:
    """Lock (FOR UPDATE, in key order) and return many sessions, each with ``db_now`` and
    whether its credential (``credential_ok``) and application (``application_ok``) still
    allow it."""
    if not keys:
        return {}
    sql, args = expand(Q.session_lock_keys, keys, now, now)
    return _by_key(await tx.fetchall(sql, args))


async def attempt_heartbeat_view_keys(tx: Tx, keys: KeySet) -> dict[Key, Row]:
    """The attempt, its task's state and cancel flag, and the queue's lease (no lock)."""
    if not keys:
        return {}
    sql, args = expand(Q.attempt_heartbeat_view_keys, keys)
    return _by_key(await tx.fetchall(sql, args))


def sessions_extend_statement(rows: Mapping[Key, datetime], now: datetime) -> tuple[str, list[Any]]:
    """Extend many ACTIVE, unexpired sessions to their new ``expires_at`` (by (namespace,
    id)); a dead session is never revived (``session_extend_if_active`` per row)."""
    expr, args = case_expr({k[1]: v for k, v in rows.items()})
    where, where_args = KeySet(rows).predicate()
    return (
        "UPDATE pulse_worker_sessions SET expires_at = " + expr + ", revision = revision + 1"
        " WHERE " + where + " AND state = 'ACTIVE' AND expires_at > %s",
        [*args, *where_args, now],
    )


#: A heartbeat round writes an instance's ``last_seen_at`` only when it is at least this
#: old (seconds): the workers view shows when a process was last heard from to within it,
#: and an idle session's heartbeat writes its session row alone most of the time.
INSTANCE_TOUCH_S = 10


def instances_touch_statement(keys: KeySet, now: datetime) -> tuple[str, list[Any]]:
    """``last_seen_at`` of many worker instances moves forward to ``now`` (``instance_touch``
    per row) where it is at least :data:`INSTANCE_TOUCH_S` old; its matched count is not
    checked."""
    where, where_args = keys.predicate()
    return (
        "UPDATE pulse_worker_instances SET last_seen_at = %s, revision = revision + 1"
        " WHERE " + where + " AND last_seen_at <= %s",
        [now, *where_args, now - timedelta(seconds=INSTANCE_TOUCH_S)],
    )


def heartbeat_statements(
    rows: Mapping[Key, Mapping[str, Any]], now: datetime
) -> list[tuple[str, list[Any]]]:
    """Extend the leases of many running attempts and of their tasks' mirrors: each row (by
    (namespace, attempt id)) is ``{"task_id", "session_id", "lease_expires_at"}``. Two
    guarded UPDATEs (tasks, then attempts: the lock order), each row still RUNNING its
    attempt, bound to its session, with a lease that has not passed; the matched counts
    must both be the number of rows."""
    tasks = {(k[0], r["task_id"]): r for k, r in rows.items()}
    task_expr, task_args = case_expr({k[1]: r["lease_expires_at"] for k, r in tasks.items()})
    task_where, task_where_args = KeySet(tasks).predicate()
    current, current_args = guard_by_id(
        "current_attempt_id", {r["task_id"]: k[1] for k, r in rows.items()}
    )
    attempt_expr, attempt_args = case_expr({k[1]: r["lease_expires_at"] for k, r in rows.items()})
    attempt_where, attempt_where_args = KeySet(rows).predicate()
    holder, holder_args = guard_by_id("session_id", {k[1]: r["session_id"] for k, r in rows.items()})
    # A progress document (pulse/progress.py) rides in the same two UPDATEs: the rows that
    # carry one get it, with the time and (on the task) the generation it belongs to.
    reported = {k: r["progress"] for k, r in rows.items() if r.get("progress") is not None}
    task_progress, task_progress_args = _progress_set(
        {rows[k]["task_id"]: text for k, text in reported.items()}, now, generation=True
    )
    attempt_progress, attempt_progress_args = _progress_set(
        {k[1]: text for k, text in reported.items()}, now
    )
    return [
        (
            "UPDATE pulse_tasks SET lease_expires_at = " + task_expr + task_progress
            + ", revision = revision + 1 WHERE " + task_where + " AND state = 'RUNNING' AND "
            + current + " AND lease_expires_at > %s",
            [*task_args, *task_progress_args, *task_where_args, *current_args, now],
        ),
        (
            "UPDATE pulse_attempts SET lease_expires_at = " + attempt_expr + attempt_progress
            + ", revision = revision + 1 WHERE " + attempt_where + " AND state = 'RUNNING' AND "
            + holder + " AND lease_expires_at > %s",
            [*attempt_args, *attempt_progress_args, *attempt_where_args, *holder_args, now],
        ),
    ]


def _progress_set(
    texts: Mapping[bytes, str], now: datetime, *, generation: bool = False
) -> tuple[str, list[Any]]:
    """SET items giving the rows of ``texts`` (by id) their progress document and time
    (and, on tasks, ``progress_generation = attempts``: the running attempt's generation);
    the other rows keep theirs. Empty when no row reported progress."""
    if not texts:
        return "", []
    ids = sorted(texts)
    whens: list[Any] = []
    for i in ids:
        whens += [i, texts[i]]
    in_list = "id IN (" + ", ".join(["%s"] * len(ids)) + ")"
    sql = (
        ", progress = CASE id" + " WHEN %s THEN %s" * len(ids) + " ELSE progress END"
        ", progress_at = IF(" + in_list + ", %s, progress_at)"
    )
    args = [*whens, *ids, now]
    if generation:
        sql += ", progress_generation = IF(" + in_list + ", attempts, progress_generation)"
        args += ids
    return sql, args


def tasks_lease_statement(
    rows: Mapping[Key, Mapping[str, Any]], lease_expires_at: datetime, now: datetime
) -> tuple[str, list[Any]]:
    """WAITING → LEASED for the tasks a dispatch round offers, of many namespaces: each row
    (by (namespace, id)) is ``{"attempt_id", "session_id", "revision"}``."""
    return guarded_update(
        "pulse_tasks", KeySet(rows),
        values={"current_attempt_id": _col(rows, "attempt_id"),
                "session_id": _col(rows, "session_id")},
        also=[("state = 'LEASED'", ()), ("lease_expires_at = %s", (lease_expires_at,)),
              ("state_version = state_version + 1", ()), ("state_changed_at = %s", (now,))],
        state="WAITING", guards={"revision": _col(rows, "revision")},
    )  # fmt: skip
