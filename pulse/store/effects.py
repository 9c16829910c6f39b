"""SQL for the side-effect ledger (``pulse/sql/effects.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "effects")

Row = dict[str, Any]


async def effect_lock(tx: Tx, namespace_id: bytes, task_id: bytes, key_digest: bytes) -> Row | None:
    """Lock (FOR UPDATE) and return the task's ledger row for the key, or None."""
    return await tx.fetchone(
        Q.effect_lock,
        {"namespace_id": namespace_id, "task_id": task_id, "key_digest": key_digest},
    )


async def effect_insert(tx: Tx, row: Row) -> None:
    """Insert a ledger row; DuplicateKey(``uq_pulse_effects_key``) when the key exists."""
    await tx.execute(Q.effect_insert, row)


async def effect_commit_if_begun(tx: Tx, row: Row) -> bool:
    """BEGUN → COMMITTED. False: already committed, or its revision moved on."""
    return await tx.execute(Q.effect_commit_if_begun, row) == 1


async def effect_list_for_task(tx: Tx, namespace_id: bytes, task_id: bytes) -> list[Row]:
    return await tx.fetchall(
        Q.effect_list_for_task, {"namespace_id": namespace_id, "task_id": task_id}
    )


async def effect_purge_for_tasks(tx: Tx, namespace_id: bytes, ids: Sequence[bytes]) -> int:
    """Retention purge: delete the effect records of ``ids``."""
    if not ids:
        return 0
    args = {"namespace_id": namespace_id, "ids": tuple(ids)}
    return await tx.execute(Q.effect_purge_for_tasks, args)
