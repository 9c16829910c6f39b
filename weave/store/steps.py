"""SQL for ``weave_steps`` (written only under the instance lock)."""

from __future__ import annotations

from orbit.storage import Tx
from weave.store._sql import many, queries
from weave.types import StepRow

Q = queries(__file__, "steps", "step_columns")


def _params(row: StepRow) -> dict[str, object]:
    return {
        "namespace_id": row.namespace_id,
        "id": row.id,
        "instance_id": row.instance_id,
        "step_path": row.step_path,
        "step_type": row.step_type,
        "state": row.state,
        "next_step": row.next_step,
        "activations": row.activations,
        "output": row.output,
        "error": row.error,
        "seq": row.seq,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "revision": row.revision,
    }


async def step_insert(tx: Tx, row: StepRow) -> None:
    """Insert a step row (unique per instance and step: a second entry is a bug)."""
    await tx.execute(Q.step_insert, _params(row))


async def step_update_if_revision(tx: Tx, row: StepRow) -> bool:
    """Write state, next_step, activations, output, error, finished_at from ``row.revision``.
    False: the row moved on (a bug under the instance lock)."""
    return await tx.execute(Q.step_update_if_revision, _params(row)) == 1


async def step_list_for_instance(tx: Tx, namespace_id: bytes, instance_id: bytes) -> list[StepRow]:
    rows = await tx.fetchall(
        Q.step_list_for_instance, {"namespace_id": namespace_id, "instance_id": instance_id}
    )
    return many(rows, StepRow)
