"""SQL for ``weave_activations``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from orbit.storage import Tx
from weave.store._sql import many, one, queries
from weave.types import ActivationRow

Q = queries(__file__, "activations", "activation_columns")


async def activation_insert(tx: Tx, row: ActivationRow) -> None:
    await tx.execute(
        Q.activation_insert,
        {
            "namespace_id": row.namespace_id,
            "id": row.id,
            "instance_id": row.instance_id,
            "step_path": row.step_path,
            "activation_no": row.activation_no,
            "kind": row.kind,
            "task_id": row.task_id,
            "state": row.state,
            "result": row.result,
            "error": row.error,
            "condition_met": row.condition_met,
            "seq": row.seq,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
        },
    )


async def activation_get(tx: Tx, namespace_id: bytes, activation_id: bytes) -> ActivationRow | None:
    row = await tx.fetchone(Q.activation_get, {"namespace_id": namespace_id, "id": activation_id})
    return one(row, ActivationRow)


async def activation_get_by_number(
    tx: Tx, namespace_id: bytes, instance_id: bytes, step_path: str, activation_no: int
) -> ActivationRow | None:
    row = await tx.fetchone(
        Q.activation_get_by_number,
        {
            "namespace_id": namespace_id,
            "instance_id": instance_id,
            "step_path": step_path,
            "activation_no": activation_no,
        },
    )
    return one(row, ActivationRow)


async def activation_finish_if_running(
    tx: Tx,
    namespace_id: bytes,
    activation_id: bytes,
    *,
    state: str,
    result: str | None,
    error: str | None,
    condition_met: int | None,
    now: datetime,
) -> bool:
    """End a RUNNING activation. False: it had ended already (stale event)."""
    n = await tx.execute(
        Q.activation_finish_if_running,
        {
            "namespace_id": namespace_id,
            "id": activation_id,
            "state": state,
            "result": result,
            "error": error,
            "condition_met": condition_met,
            "now": now,
        },
    )
    return n == 1


async def activation_list_page(
    tx: Tx, namespace_id: bytes, instance_id: bytes, after_seq: int, limit: int
) -> list[ActivationRow]:
    rows = await tx.fetchall(
        Q.activation_list_page,
        {
            "namespace_id": namespace_id,
            "instance_id": instance_id,
            "after_seq": after_seq,
            "limit": limit,
        },
    )
    return many(rows, ActivationRow)


async def activation_tasks_of_running(
    tx: Tx, namespace_id: bytes, task_ids: Sequence[bytes]
) -> set[bytes]:
    """Retention purge: those of ``task_ids`` whose instance is still RUNNING."""
    if not task_ids:
        return set()
    args = {"namespace_id": namespace_id, "ids": tuple(task_ids)}
    rows = await tx.fetchall(Q.activation_tasks_of_running, args)
    return {bytes(r["task_id"]) for r in rows}
