"""SQL for ``weave_instances``. Rows come back as :class:`weave.types.InstanceRow`."""

from __future__ import annotations

from datetime import datetime

from orbit.storage import Tx
from weave.store._sql import many, one, queries
from weave.types import InstanceRow

Q = queries(__file__, "instances", "instance_columns")
#: Unique index of an idempotent start (namespace, definition, business key).
BUSINESS_KEY_INDEX = "uq_weave_instances_business_key"


async def instance_insert(
    tx: Tx,
    *,
    namespace_id: bytes,
    instance_id: bytes,
    owner_id: bytes,
    definition_id: bytes,
    definition_name: str,
    version: int,
    business_key: str | None,
    input_text: str,
    created_by: bytes | None,
    now: datetime,
) -> None:
    """Insert a RUNNING instance. DuplicateKey(BUSINESS_KEY_INDEX) when the business key is
    taken (after waiting for a concurrent starter's commit)."""
    await tx.execute(
        Q.instance_insert,
        {
            "namespace_id": namespace_id,
            "id": instance_id,
            "owner_id": owner_id,
            "definition_id": definition_id,
            "definition_name": definition_name,
            "version": version,
            "business_key": business_key,
            "input": input_text,
            "created_by": created_by,
            "now": now,
        },
    )


async def instance_get(
    tx: Tx, namespace_id: bytes, instance_id: bytes, *, lock: str | None = None
) -> InstanceRow | None:
    """Read an instance; ``lock`` ``"update"`` locks it (FOR UPDATE), ``"skip"`` locks it or
    returns None when another transaction holds it (FOR UPDATE SKIP LOCKED)."""
    sql = {None: Q.instance_get, "update": Q.instance_lock, "skip": Q.instance_lock_skip_locked}[
        lock
    ]
    return one(
        await tx.fetchone(sql, {"namespace_id": namespace_id, "id": instance_id}), InstanceRow
    )


async def instance_get_by_business_key(
    tx: Tx, namespace_id: bytes, definition_id: bytes, business_key: str
) -> InstanceRow | None:
    row = await tx.fetchone(
        Q.instance_get_by_business_key,
        {
            "namespace_id": namespace_id,
            "definition_id": definition_id,
            "business_key": business_key,
        },
    )
    return one(row, InstanceRow)


async def instance_update_if_revision(tx: Tx, row: InstanceRow, now: datetime) -> bool:
    """Write the mutable fields of ``row`` from ``row.revision`` (the caller holds the row
    lock). False means the row moved on since it was read: a bug under the lock."""
    n = await tx.execute(
        Q.instance_update_if_revision,
        {
            "namespace_id": row.namespace_id,
            "id": row.id,
            "state": row.state,
            "output": row.output,
            "error": row.error,
            "paused": row.paused,
            "control_revision": row.control_revision,
            "history_seq": row.history_seq,
            "finished_at": row.finished_at,
            "revision": row.revision,
            "now": now,
        },
    )
    return n == 1


async def instance_list(
    tx: Tx,
    namespace_id: bytes,
    *,
    state: str | None,
    definition_id: bytes | None,
    before_at: datetime,
    before_id: bytes,
    limit: int,
) -> list[InstanceRow]:
    rows = await tx.fetchall(
        Q.instance_list,
        {
            "namespace_id": namespace_id,
            "state": state,
            "definition_id": definition_id,
            "before_at": before_at,
            "before_id": before_id,
            "limit": limit,
        },
    )
    return many(rows, InstanceRow)


async def instance_oldest_running(tx: Tx, namespace_id: bytes) -> datetime | None:
    """Retention: the creation time of the oldest RUNNING instance, None when none."""
    value: datetime | None = await tx.fetchval(
        Q.instance_oldest_running, {"namespace_id": namespace_id}
    )
    return value
