"""SQL for ``weave_poll_states`` and the immutable ``weave_poll_rounds``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.storage import Tx
from weave.store._sql import one, queries
from weave.types import PollStateRow

Q = queries(__file__, "polls", "poll_state_columns")


async def poll_state_insert(
    tx: Tx,
    *,
    namespace_id: bytes,
    poll_state_id: bytes,
    instance_id: bytes,
    step_path: str,
    max_rounds: int,
    max_attempts: int,
    interval_ms: int,
    deadline_at: datetime | None,
    now: datetime,
) -> None:
    await tx.execute(
        Q.poll_state_insert,
        {
            "namespace_id": namespace_id,
            "id": poll_state_id,
            "instance_id": instance_id,
            "step_path": step_path,
            "max_rounds": max_rounds,
            "max_attempts": max_attempts,
            "interval_ms": interval_ms,
            "deadline_at": deadline_at,
            "now": now,
        },
    )


async def poll_state_get(
    tx: Tx, namespace_id: bytes, instance_id: bytes, step_path: str
) -> PollStateRow | None:
    row = await tx.fetchone(
        Q.poll_state_get,
        {"namespace_id": namespace_id, "instance_id": instance_id, "step_path": step_path},
    )
    return one(row, PollStateRow)


async def poll_state_update_if_revision(tx: Tx, row: PollStateRow) -> bool:
    """Write the progress fields from ``row.revision`` (under the instance lock)."""
    n = await tx.execute(
        Q.poll_state_update_if_revision,
        {
            "namespace_id": row.namespace_id,
            "id": row.id,
            "state": row.state,
            "rounds_started": row.rounds_started,
            "rounds_completed": row.rounds_completed,
            "next_round_at": row.next_round_at,
            "current_activation_id": row.current_activation_id,
            "last_result": row.last_result,
            "exhausted_reason": row.exhausted_reason,
            "finished_at": row.finished_at,
            "revision": row.revision,
        },
    )
    if n == 1:
        row.revision += 1
    return n == 1


async def poll_round_insert(
    tx: Tx,
    *,
    namespace_id: bytes,
    round_id: bytes,
    poll_state_id: bytes,
    instance_id: bytes,
    step_path: str,
    round_no: int,
    activation_id: bytes,
    task_id: bytes,
    outcome: str,
    result: str | None,
    error: str | None,
    now: datetime,
) -> None:
    """Record a round's outcome, once (the table is immutable; a second insert is a bug)."""
    await tx.execute(
        Q.poll_round_insert,
        {
            "namespace_id": namespace_id,
            "id": round_id,
            "poll_state_id": poll_state_id,
            "instance_id": instance_id,
            "step_path": step_path,
            "round_no": round_no,
            "activation_id": activation_id,
            "task_id": task_id,
            "outcome": outcome,
            "result": result,
            "error": error,
            "now": now,
        },
    )


async def poll_round_list(
    tx: Tx, namespace_id: bytes, instance_id: bytes, step_path: str, limit: int = 1000
) -> list[dict[str, Any]]:
    return await tx.fetchall(
        Q.poll_round_list,
        {
            "namespace_id": namespace_id,
            "instance_id": instance_id,
            "step_path": step_path,
            "limit": limit,
        },
    )
