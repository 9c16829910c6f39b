"""Deleting a queue.

A queue can be deleted once nothing holds it: no unfinished task (WAITING, LEASED,
RUNNING, NEEDS_REVIEW — the queue's live ``unfinished_tasks`` counter), no schedule whose
current version targets it, and no live worker session that takes work from it. Otherwise
the delete is a 409 naming what holds it (``details``: ``unfinished_tasks``, up to
:data:`NAMES_SHOWN` ``schedules`` and ``sessions``). A deleted queue's configuration,
counters and gate are removed in one transaction with its ``queue.deleted`` event and its
audit row; its finished tasks, their attempts and events stay as history (read by id) until
retention removes them, and the name can be used again for a new, unrelated queue.

Races are closed by locks, in the lock order (queue row → queue usage row):

* a submit reads the queue, then locks its usage row: the delete holds that row, so the
  submit waits and then finds no usage row — 404, like an unknown queue;
* a schedule publish and a session open read the queue under a shared lock: the delete
  waits for them (and then sees the schedule or the session), or runs first (and they see
  no queue, 404).
"""

from __future__ import annotations

from datetime import datetime

from orbit import audit
from orbit import events as orbit_events
from orbit.audit import Actor
from orbit.errors import Conflict
from orbit.ids import id_hex
from orbit.preconditions import Preconditions
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from pulse.errors import QueueNotFound
from pulse.store import queues as store
from pulse.store import schedules as schedule_store
from pulse.store import workers_view as session_store

#: Schedules and sessions named in a 409 at most.
NAMES_SHOWN = 20

DELETE_ACTION = "queues.delete"
EVENT_DELETED = "queue.deleted"


class QueueInUse(Conflict):
    """The queue still has unfinished tasks, or a schedule or a live session uses it."""

    def __init__(
        self, name: str, unfinished_tasks: int, schedules: list[str], sessions: list[str]
    ) -> None:
        held = []
        if unfinished_tasks:
            held.append(f"{unfinished_tasks} unfinished task{'s' if unfinished_tasks > 1 else ''}")
        if schedules:
            held.append("schedule " + ", ".join(schedules))
        if sessions:
            held.append(f"{len(sessions)} worker session{'s' if len(sessions) > 1 else ''}")
        super().__init__(
            f"queue {name!r} is in use: {'; '.join(held)}",
            kind="queue_in_use",
            unfinished_tasks=unfinished_tasks,
            schedules=schedules,
            sessions=sessions,
        )


async def delete_queue(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    pre: Preconditions | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> None:
    """Delete queue ``name`` (module docstring). Raises 404 (absent), 409
    :class:`QueueInUse`, 412 (``If-Match`` names another revision)."""
    pre = pre or Preconditions()

    async def run(tx: Tx) -> None:
        stamp = await clock_now(tx, now)
        row = await store.queue_get_by_name(tx, namespace_id, name, for_update=True)
        if row is None:
            raise QueueNotFound()
        pre.check(int(row["revision"]))
        usage = await store.queue_usage_lock(tx, namespace_id, row["id"])
        unfinished = 0 if usage is None else int(usage["unfinished_tasks"])
        schedules = await schedule_store.schedule_names_for_queue(
            tx, namespace_id, name, NAMES_SHOWN
        )
        sessions = await session_store.session_ids_using_queue(
            tx, namespace_id, name, stamp, NAMES_SHOWN
        )
        if unfinished or schedules or sessions:
            raise QueueInUse(name, unfinished, schedules, [id_hex(s) for s in sessions])
        await store.gate_delete(tx, namespace_id, row["id"])
        await store.usage_delete(tx, namespace_id, row["id"])
        ok = await store.queue_delete_if_revision(
            tx, namespace_id, row["id"], int(row["revision"])
        )
        assert ok, "the queue row is locked FOR UPDATE"
        data = {"name": name, "revision": int(row["revision"])}
        await orbit_events.append_event(
            tx, namespace_id, EVENT_DELETED, "queue", row["id"], data, request_id, now=stamp
        )
        if actor is not None:
            await audit.record(
                tx, actor=actor, action=DELETE_ACTION, resource_kind="queue", resource_id=name,
                status_code=204, namespace_id=namespace_id, request_id=request_id,
                details={"id": id_hex(row["id"]), **data}, now=stamp,
            )  # fmt: skip

    await db.transaction(run)


__all__ = ["NAMES_SHOWN", "QueueInUse", "delete_queue"]
