"""What the retention purge (:mod:`orbit.retention_purge`) must keep for workflows: the tasks
of an instance that is still running (its steps may still read them), and the raw and
result events since the oldest running instance started."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from orbit.storage import Tx
from weave.store import activations as activation_store
from weave.store import instances as instance_store


async def running_instance_tasks(
    tx: Tx, namespace_id: bytes, task_ids: Sequence[bytes]
) -> set[bytes]:
    """``keep`` for :class:`pulse.task_purge.TaskPurge`: workflow tasks still needed."""
    return await activation_store.activation_tasks_of_running(tx, namespace_id, task_ids)


async def oldest_running_instance(tx: Tx, namespace_id: bytes) -> datetime | None:
    """Holder: the start of the namespace's oldest running instance."""
    return await instance_store.instance_oldest_running(tx, namespace_id)


__all__ = ["oldest_running_instance", "running_instance_tasks"]
