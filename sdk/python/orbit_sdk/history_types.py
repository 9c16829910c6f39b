"""Types of a task's history (``client.tasks.history``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

__all__ = ["TaskEvent", "TaskEventPage"]


class TaskEvent(msgspec.Struct, kw_only=True):
    """One raw state event of a task, as it was recorded: ``type`` (``task.accepted``,
    ``task.leased``, ``task.started``, ``task.succeeded``, ``task.rerun``…), when, under
    which request id, and its ``data`` (``state``, ``state_version``, ``queue``,
    ``attempts``, ``attempt_id`` and what the change adds)."""

    type: str
    created_at: datetime | None = None
    request_id: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def state(self) -> str | None:
        """The task's state after the change."""
        value = self.data.get("state")
        return value if isinstance(value, str) else None


class TaskEventPage(msgspec.Struct, kw_only=True):
    """One page of :meth:`TasksAPI.history`, oldest first."""

    task_id: str = ""
    events: list[TaskEvent] = msgspec.field(default_factory=list)
    next_cursor: str | None = None
