"""Shared pieces of every task state change: the API view, the result snapshot, the events
written with the change, and the live usage counters.

Every Pulse transaction that changes a task calls :func:`record` (or :func:`record_many`)
after its UPDATE/INSERT and after re-selecting the changed row(s), in the same transaction:

* the raw event (``orbit_events``) is written for every call;
* for a task now in ``SUCCEEDED``, ``FAILED``, ``CANCELLED`` or ``NEEDS_REVIEW`` the result
  event (``orbit_result_events``) is written too, taking the namespace's next sequence
  number. The stream row is the last lock of the lock order, so ``record`` must be the last
  write of the transaction that touches a new row (the idempotency response may follow).

:func:`adjust_usage` keeps ``pulse_queue_usage`` (and the owner's application usage, when the
row exists) equal to the rows it counts. Lock order (docs/architecture.md): application
resources → queue usage → task/attempt → permit → result stream. Every
transaction that changes a counter calls :func:`lock_usage` (one statement for every
application and queue row it will count into) before its first task or attempt lock, and
:func:`adjust_usage` only adds to rows it holds already: no transaction ever waits for a
usage row while holding a task, so none deadlocks with another over them.

This module is imported by both the producer side (tasks, queues) and the worker side
(dispatch, attempts, recovery). Its signatures are stable.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit import business_json
from orbit import events as orbit_events
from orbit.ids import id_hex
from orbit.storage import Tx
from orbit.storage.keys import KeySet
from orbit.times import format_opt
from pulse.progress import task_progress
from pulse.store import queues as usage_store

#: States that end a task.
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
#: States that produce a result event.
RESULT_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW"})
#: States counted in ``pulse_queue_usage.unfinished_tasks`` (and the application's).
UNFINISHED_STATES = frozenset({"WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW"})

#: Raw event types written by Pulse (``orbit_events.type``).
EVENT_ACCEPTED = "task.accepted"  # submitted (WAITING)
EVENT_LEASED = "task.leased"  # offered to a session (LEASED)
EVENT_STARTED = "task.started"  # start authorised (RUNNING)
EVENT_RELEASED = "task.released"  # offer expired/denied/given back (WAITING again)
EVENT_RETRY_SCHEDULED = "task.retry_scheduled"  # failed retryably (WAITING with backoff)
EVENT_SUCCEEDED = "task.succeeded"
EVENT_FAILED = "task.failed"
EVENT_CANCELLED = "task.cancelled"
EVENT_NEEDS_REVIEW = "task.needs_review"
EVENT_CANCEL_REQUESTED = "task.cancel_requested"  # RUNNING, cancel pushed to the worker
EVENT_RESOLVED = "task.resolved"  # operator resolution of NEEDS_REVIEW
EVENT_DEADLINE_EXCEEDED = "task.deadline_exceeded"  # FAILED by the deadline sweep
EVENT_STUCK = "task.stuck"  # surfaced by the watchdog (no state change, no result event)


#: One change :func:`record_many` records: ``(row_after, event_type, data)``.
Change = tuple[Mapping[str, Any], str, Mapping[str, Any] | None]

#: A hook run inside :func:`record_many`, in the caller's transaction, for each changed task
#: row that is now in a :data:`RESULT_STATES` state:
#: ``await hook(tx, namespace_id, row_after, now)`` (``now`` as given to ``record_many``).
TerminalHook = Callable[[Tx, bytes, Mapping[str, Any], datetime | None], Coroutine[Any, Any, None]]

#: Hooks registered by packages above Pulse (Weave registers one at import, so a workflow's
#: inbox event is written in the same transaction as its task's terminal change). Pulse
#: never imports them. A hook must only write its own rows and must not lock Pulse rows.
TERMINAL_HOOKS: list[TerminalHook] = []


def raw_json(text: str | bytes | None) -> msgspec.Raw | None:
    """Stored business JSON text as :class:`msgspec.Raw`, so it is encoded byte-for-byte."""
    if text is None:
        return None
    return msgspec.Raw(text.encode() if isinstance(text, str) else bytes(text))


def json_value(value: Any) -> Any:
    """A native-JSON column (error, resolution) as a Python value (drivers return text)."""
    if value is None:
        return None
    if isinstance(value, str | bytes | bytearray):
        return business_json.decode(value)  # a worker's error details keep their numbers
    return value


def task_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """The API task object of a ``pulse_tasks`` row (all columns of ``tasks.sql`` TASK_COLUMNS).

    ``payload`` and ``result`` are :class:`msgspec.Raw` (exactly the stored bytes); encode the
    dict with ``msgspec.json.encode``. ``progress`` is the latest attempt's progress
    document (pulse/progress.py), null when it reported none.
    """
    progress, progress_at = task_progress(row)
    return {
        "id": id_hex(row["id"]),
        "queue": row["queue_name"],
        "owner_id": id_hex(row["owner_id"]),
        "kind": row["kind"],
        "pipeline_version": row["pipeline_version"],
        "dedup_key": row["dedup_key"],
        "state": row["state"],
        "priority": int(row["priority"]),
        "payload": raw_json(row["payload"]),
        "result": raw_json(row["result"]),
        "error": json_value(row["error"]),
        "attempts": int(row["attempts"]),
        "max_attempts": int(row["max_attempts"]),
        "effect_uncertain": bool(row["effect_uncertain"]),
        "created_at": format_opt(row["created_at"]),
        "available_at": format_opt(row["available_at"]),
        "deadline_at": format_opt(row["deadline_at"]),
        "started_at": format_opt(row["started_at"]),
        "finished_at": format_opt(row["finished_at"]),
        "state_changed_at": format_opt(row["state_changed_at"]),
        "stuck_at": format_opt(row.get("stuck_at")) if currently_stuck(row) else None,
        "stuck_reason": row.get("stuck_reason") if currently_stuck(row) else None,
        "revision": int(row["revision"]),
        "state_version": int(row["state_version"]),
        "cancel_requested": bool(row["cancel_requested"]),
        "concurrency_key": row["concurrency_key"],
        "fairness_key": row.get("fairness_key"),
        "retry_safe": bool(row["retry_safe"]),
        "retry": {
            "backoff_initial_ms": int(row["retry_backoff_initial_ms"]),
            "backoff_max_ms": int(row["retry_backoff_max_ms"]),
            "backoff_multiplier": float(row["retry_backoff_multiplier"]),
        },
        "resolution": json_value(row["resolution"]),
        "progress": progress,
        "progress_at": progress_at,
        "source": {
            "kind": row["source_kind"],
            "id": id_hex(row["source_id"]) if row["source_id"] is not None else None,
        },
    }


def currently_stuck(row: Mapping[str, Any]) -> bool:
    """True when the watchdog surfaced the task in its current state episode (``stuck_at``
    at or after ``state_changed_at``, reason written for the current state) and the task is
    not terminal (pulse/watchdog.py, pulse/sql/watchdog.sql)."""
    stuck_at, since = row.get("stuck_at"), row.get("state_changed_at")
    reason = row.get("stuck_reason") or ""
    return (
        stuck_at is not None
        and since is not None
        and row["state"] in UNFINISHED_STATES
        and stuck_at >= since
        and reason.startswith(row["state"] + " ")
    )


def result_snapshot(row: Mapping[str, Any]) -> dict[str, Any]:
    """The frozen snapshot fields of a result event, in API form
    (docs/api/admin.md#result-events)."""
    return {
        "task_id": id_hex(row["id"]),
        "queue": row["queue_name"],
        "kind": row["kind"],
        "owner_id": id_hex(row["owner_id"]),
        "state": row["state"],
        "result": raw_json(row["result"]),
        "error": json_value(row["error"]),
        "attempts": int(row["attempts"]),
        "finished_at": format_opt(row["finished_at"]),
    }


def result_event_type(state: str) -> str:
    """``task.succeeded`` etc. for a result state."""
    return "task." + state.lower()


def _raw_event_data(row: Mapping[str, Any], data: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "state": row["state"],
        "state_version": int(row["state_version"]),
        "queue": row["queue_name"],
        "attempts": int(row["attempts"]),
    }
    if row.get("current_attempt_id") is not None:
        out["attempt_id"] = id_hex(row["current_attempt_id"])
    if data:
        out.update(data)
    return out


async def record(
    tx: Tx,
    namespace_id: bytes,
    task_row_after: Mapping[str, Any],
    event_type: str,
    data: Mapping[str, Any] | None = None,
    *,
    result_event: bool | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> None:
    """Write the raw event of one task change and, for a result state, its result event.

    ``task_row_after`` is the task row as it is after the change (re-selected in this
    transaction). ``result_event`` forces (True) or suppresses (False) the result event;
    by default it is written when the row's state is in :data:`RESULT_STATES`.
    """
    await record_many(
        tx,
        namespace_id,
        [(task_row_after, event_type, data)],
        result_event=result_event,
        request_id=request_id,
        now=now,
    )


async def record_many(
    tx: Tx,
    namespace_id: bytes,
    changes: Sequence[Change],
    *,
    result_event: bool | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> None:
    """Batch form of :func:`record`: ``changes`` is ``[(row_after, event_type, data), ...]``.

    All raw events go in one multi-row INSERT, then all result events in one call (one
    increment of the stream row, sequence numbers in the order of ``changes``).
    """
    await record_across(
        tx,
        [(namespace_id, change) for change in changes],
        result_event=result_event,
        request_id=request_id,
        now=now,
    )


#: A change of a node round: (namespace id, (task row after, raw event type, event data)).
NsChange = tuple[bytes, tuple[Mapping[str, Any], str, Mapping[str, Any] | None]]


async def record_across(
    tx: Tx,
    changes: Sequence[NsChange],
    *,
    result_event: bool | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> None:
    """:func:`record_many` for the changes of several namespaces (a node round): the raw
    events of every namespace in ONE multi-row INSERT, the terminal hooks, then the result
    events of every namespace with one upsert of their stream rows (namespace order, last in
    the lock order) and one INSERT — per namespace, sequence numbers in the order of
    ``changes``."""
    if not changes:
        return
    # One pipeline (Tx.pipeline): the raw events, the hooks' statements and the streams'
    # advance go in one round trip, the result events' INSERT in the next — the same
    # statements in the same order as one by one.
    steps: list[Coroutine[Any, Any, Any]] = []
    steps.append(orbit_events.append_events_across(
        tx,
        [
            (
                ns,
                orbit_events.NewEvent(
                    type=event_type,
                    subject_kind="task",
                    subject_id=row["id"],
                    data=_raw_event_data(row, data),
                    request_id=request_id,
                ),
            )
            for ns, (row, event_type, data) in changes
        ],
        now=now,
    ))  # fmt: skip
    if TERMINAL_HOOKS:
        for ns, (row, _, _) in changes:
            if row["state"] in RESULT_STATES:
                steps += [hook(tx, ns, row, now) for hook in TERMINAL_HOOKS]
    results = [
        (ns, stored_snapshot(row))
        for ns, (row, _, _) in changes
        if (row["state"] in RESULT_STATES if result_event is None else result_event)
    ]
    if results:
        steps.append(orbit_events.append_result_events_across(tx, results, now=now))
    await tx.pipeline(*steps)


def stored_snapshot(row: Mapping[str, Any]) -> orbit_events.ResultSnapshot:
    """The platform's :class:`~orbit.events.ResultSnapshot` of a task row (texts verbatim)."""
    return orbit_events.ResultSnapshot(
        task_id=row["id"],
        queue=row["queue_name"],
        kind=row["kind"],
        owner_id=row["owner_id"],
        state=row["state"],
        result=row["result"],
        error=_json_text(row["error"]),
        attempts=int(row["attempts"]),
        finished_at=row["finished_at"],
    )


async def record_queue_event(
    tx: Tx,
    namespace_id: bytes,
    queue_id: bytes | None,
    event_type: str,
    data: Mapping[str, Any],
    *,
    request_id: str | None = None,
    now: datetime | None = None,
) -> None:
    """Raw event of a queue or gate change (``subject_kind`` queue, or namespace for the
    namespace gate when ``queue_id`` is None)."""
    await orbit_events.append_event(
        tx,
        namespace_id,
        event_type,
        "queue" if queue_id is not None else "namespace",
        queue_id if queue_id is not None else namespace_id,
        dict(data),
        request_id,
        now=now,
    )


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode()
    return business_json.encode(value).decode()


# -- usage counters --------------------------------------------------------------------------


async def lock_usage(
    tx: Tx,
    namespace_id: bytes,
    queue_ids: Iterable[bytes],
    owner_ids: Iterable[bytes] = (),
) -> tuple[dict[bytes, dict[str, Any]], dict[bytes, dict[str, Any]]]:
    """Lock the usage rows of ``owner_ids`` (applications) then ``queue_ids``, in the lock
    order and sorted, before the caller locks tasks — ONE round trip
    (:func:`pulse.store.queues.usage_lock_many`). Missing rows are ignored. Returns the
    locked rows (applications by id, queues by id) for callers that judge a quota on them.

    Every transaction that changes a usage counter calls this before its first task or
    attempt lock (docs/architecture.md, "Lock order"); :func:`adjust_usage` then only adds
    to rows the transaction holds already."""
    return await usage_store.usage_lock_many(tx, namespace_id, list(queue_ids), list(owner_ids))


async def lock_usage_keys(
    tx: Tx, queues: KeySet, owner_ids: Iterable[bytes] = ()
) -> tuple[dict[bytes, dict[str, Any]], dict[tuple[bytes, bytes], dict[str, Any]]]:
    """:func:`lock_usage` for the queues of several namespaces (a node round): the owners'
    application rows (sorted by id), then the queues' usage rows (sorted by namespace and
    queue id), in ONE statement. Returns the locked rows (applications by id, queues by
    (namespace id, queue id))."""
    return await usage_store.usage_lock_keys(tx, queues, list(owner_ids))


async def adjust_usage(
    tx: Tx,
    namespace_id: bytes,
    queue_id: bytes,
    unfinished: int = 0,
    reservations: int = 0,
    active: int = 0,
    *,
    owner_id: bytes | None = None,
) -> None:
    """Add the deltas to the queue's live counters (and, with ``owner_id``, to the owning
    application's usage row when it exists).

    A counter that would go below zero raises (a drift bug, never clamped silently).
    """
    if not (unfinished or reservations or active):
        return
    # The caller locked both rows with lock_usage before its task locks (the lock order).
    if owner_id is not None:
        await usage_store.application_usage_add(tx, owner_id, unfinished, reservations, active)
    await usage_store.queue_usage_add(tx, namespace_id, queue_id, unfinished, reservations, active)


def usage_delta(before_state: str | None, after_state: str) -> tuple[int, int, int]:
    """(unfinished, reservations, active) deltas of a task moving ``before`` → ``after``
    (``before`` None = a new task). LEASED counts a reservation, RUNNING an active attempt."""

    def vec(state: str | None) -> tuple[int, int, int]:
        if state is None:
            return (0, 0, 0)
        return (
            int(state in UNFINISHED_STATES),
            int(state == "LEASED"),
            int(state == "RUNNING"),
        )

    b, a = vec(before_state), vec(after_state)
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])
