"""A task's history: its raw state events in order (``GET …/tasks/{id}/events``).

The events are read from the namespace's raw event log (:func:`orbit.events.subject_history`)
in the task's lifetime, from its ``created_at`` to its ``finished_at`` (or the database
clock while it is unfinished). Each page looks at a bounded number of the namespace's batch
rows, so a task that lived long in a busy namespace costs several short reads, never one
long one; a page may then hold fewer than ``limit`` events and still carry a
``next_cursor``.

Order: by time, and within one transaction (one ``created_at``) by the task's
``state_version`` the event recorded, then as written. A page never splits the events of one
transaction, so the order is the same whatever the page size. The cursor is the moment the
next page starts at, bound to the task.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orbit import events as orbit_events
from orbit import pagination
from orbit.errors import InvalidRequest
from orbit.ids import id_hex, parse_id
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from orbit.times import format_time, parse_time
from pulse.errors import TaskNotFound
from pulse.store import tasks as store

#: Bounded reads of the event log one page may make before it answers.
SCANS_PER_PAGE = 4
_MICROSECOND = timedelta(microseconds=1)


def event_view(e: orbit_events.RawEvent) -> dict[str, Any]:
    """One raw event as the API shows it."""
    return {
        "type": e.type,
        "created_at": format_time(e.created_at),
        "request_id": e.request_id,
        "data": e.data,
    }


def _version(e: orbit_events.RawEvent) -> int:
    v = e.data.get("state_version") if isinstance(e.data, dict) else None
    return v if isinstance(v, int) else 0


def _whole_transactions(events: list[orbit_events.RawEvent], limit: int) -> int:
    """How many of ``events`` (sorted by time) a page of ``limit`` takes without splitting
    one ``created_at``: the longest such prefix, or the first moment whole when it alone
    holds more than ``limit``."""
    if len(events) <= limit:
        return len(events)
    cut = limit
    while cut > 0 and events[cut].created_at == events[cut - 1].created_at:
        cut -= 1
    if cut == 0:
        first = events[0].created_at
        cut = next((i for i, e in enumerate(events) if e.created_at != first), len(events))
    return cut


async def task_events(
    db: Database,
    namespace_id: bytes,
    task_id: str,
    *,
    limit: int = pagination.DEFAULT_LIMIT,
    cursor: str | None = None,
    visible: Any = None,
) -> dict[str, Any]:
    """``{"task_id", "events": [...], "next_cursor"}``; 404 for a malformed id, an absent
    task or (``visible(queue_name)`` false) a task of a queue the caller may not use."""
    tid = parse_id(task_id)
    if tid is None:
        raise TaskNotFound()
    bound = {"list": "task_events", "task": task_id}
    position = pagination.decode_cursor(cursor, bound)
    start: datetime | None = None
    if position is not None:
        try:
            start = parse_time(str(position["t"]))
        except (KeyError, ValueError):
            raise InvalidRequest("cursor is not valid", field="cursor") from None

    async def run(tx: Tx) -> dict[str, Any]:
        row = await store.task_get(tx, namespace_id, tid)
        if row is None or (visible is not None and not visible(row["queue_name"])):
            raise TaskNotFound()
        since = max(row["created_at"], start) if start is not None else row["created_at"]
        if row["finished_at"] is not None:
            until = row["finished_at"] + _MICROSECOND
        else:
            until = await clock_now(tx, None) + _MICROSECOND
        found: list[orbit_events.RawEvent] = []
        resume: datetime | None = since
        for _ in range(SCANS_PER_PAGE):
            if resume is None or resume >= until or len(found) > limit:
                break
            page = await orbit_events.subject_history(
                tx, namespace_id, "task", tid, since=resume, until=until
            )
            found += page.events
            resume = page.resume_at
        found.sort(key=lambda e: (e.created_at, _version(e)))  # stable within a version
        taken = _whole_transactions(found, limit)
        nxt: datetime | None
        if taken < len(found):
            nxt = found[taken - 1].created_at + _MICROSECOND
        else:
            nxt = resume if resume is not None and resume < until else None
        return {
            "task_id": id_hex(tid),
            "events": [event_view(e) for e in found[:taken]],
            "next_cursor": None
            if nxt is None
            else pagination.encode_cursor({"t": format_time(nxt)}, bound),
        }

    return await db.read(run)
