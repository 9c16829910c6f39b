"""SQL for queues, queue usage counters, execution gates and application usage counters.

Every function runs one query from ``pulse/sql/queues.sql`` on the caller's open :class:`Tx`
and returns rows as dicts (column name → value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries
from orbit.storage.keys import KeySet, case_expr, expand

Q = load_queries(__file__, "queues")

Row = dict[str, Any]

#: ``pulse_execution_gates.queue_id`` of the namespace-wide gate.
NAMESPACE_GATE = bytes(16)
#: Unique index of a gate's scope (namespace_id, queue_id).
GATE_SCOPE_INDEX = "uq_pulse_execution_gates_scope"


async def queue_get_by_name(
    tx: Tx, namespace_id: bytes, name: str, *, for_update: bool = False, shared: bool = False
) -> Row | None:
    """The queue ``name``; ``for_update`` locks it, ``shared`` takes a shared lock (a reader
    that must not see the queue deleted before it commits)."""
    if for_update:
        sql = Q.queue_get_by_name_for_update
    else:
        sql = Q.queue_get_by_name_shared if shared else Q.queue_get_by_name
    return await tx.fetchone(sql, {"namespace_id": namespace_id, "name": name})


async def queue_get_by_name_clock(
    tx: Tx, namespace_id: bytes, name: str
) -> tuple[Row | None, datetime | None]:
    """The queue ``name`` (not locked) and the database clock read with it (None when there
    is no such queue)."""
    row = await tx.fetchone(Q.queue_get_by_name_clock, {"namespace_id": namespace_id, "name": name})
    if row is None:
        return None, None
    at = row.pop("db_now")
    assert isinstance(at, datetime)
    return row, at


async def queue_get(tx: Tx, namespace_id: bytes, queue_id: bytes) -> Row | None:
    return await tx.fetchone(Q.queue_get, {"namespace_id": namespace_id, "id": queue_id})


async def queue_insert(tx: Tx, row: Row) -> None:
    """Insert a queue. Raises DuplicateKey(``uq_pulse_queues_name``) when the name is taken."""
    await tx.execute(Q.queue_insert, row)


async def queue_update_if_revision(tx: Tx, row: Row) -> bool:
    """Replace the config of queue ``row['id']`` when its revision is ``row['revision']``.

    False: the revision moved on or the queue is gone.
    """
    return await tx.execute(Q.queue_update_if_revision, row) == 1


async def queue_list_after(tx: Tx, namespace_id: bytes, after_name: str, limit: int) -> list[Row]:
    return await tx.fetchall(
        Q.queue_list_after,
        {"namespace_id": namespace_id, "after_name": after_name, "limit": limit},
    )


async def queue_count_by_state(tx: Tx, namespace_id: bytes, queue_id: bytes) -> dict[str, int]:
    rows = await tx.fetchall(
        Q.queue_count_by_state, {"namespace_id": namespace_id, "queue_id": queue_id}
    )
    return {r["state"]: int(r["n"]) for r in rows}


async def usage_insert(tx: Tx, namespace_id: bytes, queue_id: bytes) -> None:
    await tx.execute(Q.usage_insert, {"namespace_id": namespace_id, "queue_id": queue_id})


async def usage_get(tx: Tx, namespace_id: bytes, queue_id: bytes) -> Row | None:
    return await tx.fetchone(Q.usage_get, {"namespace_id": namespace_id, "queue_id": queue_id})


async def usage_get_many(
    tx: Tx, namespace_id: bytes, queue_ids: Sequence[bytes]
) -> dict[bytes, Row]:
    if not queue_ids:
        return {}
    rows = await tx.fetchall(
        Q.usage_get_many, {"namespace_id": namespace_id, "queue_ids": tuple(queue_ids)}
    )
    return {r["queue_id"]: r for r in rows}


async def queue_usage_lock(tx: Tx, namespace_id: bytes, queue_id: bytes) -> Row | None:
    """Lock (FOR UPDATE) and return the queue's usage row."""
    return await tx.fetchone(Q.usage_lock, {"namespace_id": namespace_id, "queue_id": queue_id})


async def usage_lock_many(
    tx: Tx, namespace_id: bytes, queue_ids: Sequence[bytes], app_ids: Sequence[bytes]
) -> tuple[dict[bytes, Row], dict[bytes, Row]]:
    """Lock the applications' resources rows then the queues' usage rows (each sorted), in
    ONE statement; return (application rows by id, queue usage rows by queue id), each row
    with ``unfinished_tasks``, ``reservations``, ``active_attempts``, ``max_unfinished_tasks``
    and ``max_reservations`` (None for queue rows). Missing rows are absent."""
    apps = tuple(sorted(set(app_ids)))
    queues = tuple(sorted(set(queue_ids)))
    if apps and queues:
        sql = Q.usage_lock_all
    elif apps:
        sql = Q.usage_lock_apps
    elif queues:
        sql = Q.usage_lock_queues
    else:
        return {}, {}
    rows = await tx.fetchall(
        sql, {"namespace_id": namespace_id, "app_ids": apps, "queue_ids": queues}
    )
    by_app: dict[bytes, Row] = {}
    by_queue: dict[bytes, Row] = {}
    for row in rows:
        (by_app if row["kind"] == "a" else by_queue)[bytes(row["id"])] = row
    return by_app, by_queue


async def usage_lock_keys(
    tx: Tx, queues: KeySet, app_ids: Sequence[bytes]
) -> tuple[dict[bytes, Row], dict[tuple[bytes, bytes], Row]]:
    """:func:`usage_lock_many` for the queues of several namespaces: (application rows by id,
    queue usage rows by (namespace id, queue id)), locked in that order, each sorted."""
    apps = sorted(set(app_ids))
    if not apps and not queues:
        return {}, {}
    sql = Q.usage_lock_keys.replace("/*apps*/", ", ".join(["%s"] * len(apps)) if apps else "NULL")
    sql, args = expand(sql, queues, *apps)
    rows = await tx.fetchall(sql, args)
    by_app: dict[bytes, Row] = {}
    by_queue: dict[tuple[bytes, bytes], Row] = {}
    for row in rows:
        if row["kind"] == "a":
            by_app[bytes(row["id"])] = row
        else:
            by_queue[(bytes(row["namespace_id"]), bytes(row["id"]))] = row
    return by_app, by_queue


async def queue_usage_add(
    tx: Tx, namespace_id: bytes, queue_id: bytes, unfinished: int, reservations: int, active: int
) -> None:
    await tx.execute(
        Q.usage_add,
        {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "unfinished": unfinished,
            "reservations": reservations,
            "active": active,
        },
    )


async def queue_usage_add_quota_denials(
    tx: Tx, namespace_id: bytes, queue_id: bytes, n: int
) -> None:
    await tx.execute(
        Q.usage_add_quota_denials, {"namespace_id": namespace_id, "queue_id": queue_id, "n": n}
    )


async def gate_get_many(
    tx: Tx, namespace_id: bytes, queue_ids: Sequence[bytes]
) -> dict[bytes, Row]:
    """Gates by queue id (:data:`NAMESPACE_GATE` for the namespace gate); absent = open."""
    rows = await tx.fetchall(
        Q.gate_get_many, {"namespace_id": namespace_id, "queue_ids": tuple(queue_ids)}
    )
    return {r["queue_id"]: r for r in rows}


async def gate_lock(tx: Tx, namespace_id: bytes, queue_id: bytes) -> Row | None:
    """The gate of ``queue_id`` (:data:`NAMESPACE_GATE` for the namespace), locked; None when
    it was never set (open)."""
    return await tx.fetchone(Q.gate_lock, {"namespace_id": namespace_id, "queue_id": queue_id})


async def gate_insert(
    tx: Tx, namespace_id: bytes, gate_id: bytes, queue_id: bytes, paused: bool, now: datetime
) -> None:
    """Create a gate (control revision 1). Raises DuplicateKey(GATE_SCOPE_INDEX) when a
    concurrent transaction created it first."""
    await tx.execute(
        Q.gate_insert,
        {
            "namespace_id": namespace_id,
            "id": gate_id,
            "queue_id": queue_id,
            "paused": int(paused),
            "now": now,
        },
    )


async def gate_set(
    tx: Tx, namespace_id: bytes, gate_id: bytes, queue_id: bytes, paused: bool, now: datetime
) -> None:
    """Open or close a gate (created on first use); the control revision moves on change only."""
    await tx.execute(
        Q.gate_set,
        {
            "namespace_id": namespace_id,
            "id": gate_id,
            "queue_id": queue_id,
            "paused": int(paused),
            "now": now,
        },
    )


async def gate_closed(tx: Tx, namespace_id: bytes, queue_id: bytes) -> bool:
    """True when the namespace gate or the queue gate is paused."""
    value = await tx.fetchval(
        Q.gate_closed,
        {"namespace_id": namespace_id, "zero_id": NAMESPACE_GATE, "queue_id": queue_id},
    )
    return bool(value)


async def application_usage_add(
    tx: Tx, application_id: bytes, unfinished: int, reservations: int, active: int
) -> None:
    await tx.execute(
        Q.application_usage_add,
        {
            "application_id": application_id,
            "unfinished": unfinished,
            "reservations": reservations,
            "active": active,
        },
    )


# -- node rounds: the usage deltas of many queues and applications, one statement per table --

#: (unfinished, reservations, active) deltas.
Delta = tuple[int, int, int]
_USAGE_COLUMNS = ("unfinished_tasks", "reservations", "active_attempts")


def usage_add_statements(
    apps: Mapping[bytes, Delta], queues: Mapping[tuple[bytes, bytes], Delta]
) -> list[tuple[str, list[Any]]]:
    """The summed usage deltas of a round as at most two UPDATEs (application rows by id,
    then queue usage rows by (namespace, queue id)): each row gets its own delta by id
    (``CASE``); rows whose deltas are all zero are left out. The rows must be locked by the
    caller (the lock order's first two levels). An UNSIGNED counter going below zero fails
    the statement, as :func:`queue_usage_add` does."""
    out: list[tuple[str, list[Any]]] = []
    app_rows = {a: d for a, d in apps.items() if any(d)}
    if app_rows:
        sets, args = _delta_sets(app_rows, "application_id")
        ids = sorted(app_rows)
        out.append((
            "UPDATE orbit_application_resources SET " + ", ".join(sets)
            + " WHERE application_id IN (" + ", ".join(["%s"] * len(ids)) + ")",
            [*args, *ids],
        ))  # fmt: skip
    queue_rows = {q: d for q, d in queues.items() if any(d)}
    if queue_rows:
        sets, args = _delta_sets({q[1]: d for q, d in queue_rows.items()}, "queue_id")
        where, where_args = KeySet(queue_rows).predicate("namespace_id", "queue_id")
        out.append((
            "UPDATE pulse_queue_usage SET " + ", ".join(sets) + " WHERE " + where,
            [*args, *where_args],
        ))  # fmt: skip
    return out


def _delta_sets(rows: Mapping[bytes, Delta], id_column: str) -> tuple[list[str], list[Any]]:
    sets: list[str] = []
    args: list[Any] = []
    for i, column in enumerate(_USAGE_COLUMNS):
        values = {k: d[i] for k, d in rows.items()}
        if not any(values.values()):
            continue
        expr, a = case_expr(values, id_column)
        sets.append(f"{column} = {column} + {expr}")
        args += a
    return sets, args


async def queue_delete_if_revision(
    tx: Tx, namespace_id: bytes, queue_id: bytes, revision: int
) -> bool:
    """Delete the queue row. False: the revision moved on."""
    n = await tx.execute(
        Q.queue_delete_if_revision,
        {"namespace_id": namespace_id, "id": queue_id, "revision": revision},
    )
    return n == 1


async def usage_delete(tx: Tx, namespace_id: bytes, queue_id: bytes) -> None:
    """Delete the queue's usage row (with the queue)."""
    await tx.execute(Q.usage_delete, {"namespace_id": namespace_id, "queue_id": queue_id})


async def gate_delete(tx: Tx, namespace_id: bytes, queue_id: bytes) -> None:
    """Delete the queue's gate row, if any."""
    await tx.execute(Q.gate_delete, {"namespace_id": namespace_id, "queue_id": queue_id})
