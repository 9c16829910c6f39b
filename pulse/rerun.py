"""Re-running finished tasks: an operator sends a FAILED or CANCELLED task back to WAITING.

* :func:`rerun_task` (``POST …/tasks/{id}/retry``, a note required): in one transaction,
  in the lock order (the owner's application resources and the queue's usage rows, then the
  task), the task goes back to WAITING — available now, its result and error cleared, at
  least ``attempts`` more attempts allowed (``max_attempts`` raised to ``attempts made +
  attempts`` when that is more), a deadline that has passed dropped. Its attempts, their
  evidence and its identity (id, dedup key) are kept: the next attempt is generation
  ``attempts + 1``. The decision is written on the task (``resolution``: action ``rerun``,
  the note, who, when, the previous state and error) and as an ``operator_rerun`` evidence
  row (the history of every re-run), audited ``tasks.retry`` with a ``task.rerun`` event. A
  re-run counts against the queue's and the application's ``max_unfinished_tasks`` like a
  submit (429 when full). Any other state is a 409; a task of a workflow instance too (the
  instance has moved on: re-run the workflow, not its step).
* :func:`rerun_bulk` (``POST …/tasks:retry``) does the same for every finished task of a
  filter — states, queue, kind, owner, error type, finish-time range — in bounded batches,
  oldest finish first. Tasks that finish again while it runs are not taken twice (the range
  ends at the request's start). ``dry_run`` only counts. A quota that fills up stops it;
  the answer says how many were re-run and how many a quota refused.

After COMMIT the dispatcher is woken for the queues that got work back.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from orbit import audit
from orbit.audit import Actor
from orbit.business_json import enc_hook
from orbit.errors import Conflict, InvalidRequest
from orbit.ids import id_hex, new_id, parse_id
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from orbit.times import Time, format_time, parse_time
from orbit.types import IdText
from pulse import transitions
from pulse.errors import QueueQuotaExceeded, TaskNotFound, TaskStateConflict
from pulse.hub import wake_queue
from pulse.store import attempts as attempt_store
from pulse.store import queues as queue_store
from pulse.store import rerun as store
from pulse.store import tasks as task_store
from pulse.tasks import NO_ATTEMPT
from pulse.types import Name

if TYPE_CHECKING:
    from pulse.hub import Notifier

#: Tasks re-run per transaction by a bulk re-run.
BULK_BATCH = 500
#: A dry run counts at most this many.
COUNT_CAP = 100_000
#: Retry-After (seconds) of a quota refusal.
QUOTA_RETRY_AFTER_S = 1
FINISHED = ("FAILED", "CANCELLED")
ACTION = "tasks.retry"
BULK_ACTION = "tasks.retry_bulk"
EVENT_RERUN = "task.rerun"
_EPOCH = datetime(1970, 1, 1)
_ENC = msgspec.json.Encoder(enc_hook=enc_hook)  # a previous error keeps its numbers

Note = Annotated[str, Meta(min_length=1, max_length=2000)]
Extra = Annotated[int, Meta(ge=1, le=1000)]


class Rerun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST …/tasks/{id}/retry``."""

    note: Note
    #: At least this many more attempts (``max_attempts`` is raised when needed).
    attempts: Extra = 1


class RerunBulk(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST …/tasks:retry``: every filter is optional (none: every finished task)."""

    note: Note
    attempts: Extra = 1
    states: list[Literal["FAILED", "CANCELLED"]] | None = None
    queue: Name | None = None
    kind: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    owner_id: IdText | None = None
    error_type: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    finished_after: Time | None = None
    finished_before: Time | None = None
    dry_run: bool = False


class WorkflowTask(Conflict):
    """A task of a workflow instance cannot be re-run on its own."""

    def __init__(self) -> None:
        super().__init__(
            "this task belongs to a workflow instance: re-run the workflow, not its step",
            kind="workflow_task",
        )


def _resolution(actor: Actor, note: str, row: dict[str, Any], stamp: datetime) -> str:
    return _ENC.encode(
        {
            "action": "rerun",
            "note": note,
            "by": {
                "credential_id": None if actor.credential_id is None else id_hex(actor.credential_id),
                "application_id": None
                if actor.application_id is None
                else id_hex(actor.application_id),
            },
            "at": format_time(stamp),
            "previous_state": row["state"],
            "previous_error": transitions.json_value(row["error"]),
            "attempts": int(row["attempts"]),
        }
    ).decode()


class _Quotas:
    """The unfinished-task quotas of the rows a transaction locked, counted as it re-runs."""

    def __init__(self, apps: dict[bytes, dict[str, Any]], queues: dict[bytes, dict[str, Any]],
                 limits: dict[bytes, int | None]) -> None:  # fmt: skip
        self.apps, self.queues, self.limits = apps, queues, limits
        self.added: dict[bytes, int] = {}
        self.added_apps: dict[bytes, int] = {}

    def admit(self, queue_id: bytes, owner_id: bytes) -> QueueQuotaExceeded | None:
        limit = self.limits.get(queue_id)
        used = self.queues.get(queue_id)
        n = 0 if used is None else int(used["unfinished_tasks"])
        if limit is not None and n + self.added.get(queue_id, 0) + 1 > limit:
            return QueueQuotaExceeded("queue", limit, QUOTA_RETRY_AFTER_S)
        app = self.apps.get(owner_id)
        if app is not None and app["max_unfinished_tasks"] is not None:
            app_n = int(app["unfinished_tasks"]) + self.added_apps.get(owner_id, 0)
            if app_n + 1 > int(app["max_unfinished_tasks"]):
                return QueueQuotaExceeded(
                    "application", int(app["max_unfinished_tasks"]), QUOTA_RETRY_AFTER_S
                )
        self.added[queue_id] = self.added.get(queue_id, 0) + 1
        self.added_apps[owner_id] = self.added_apps.get(owner_id, 0) + 1
        return None


async def _lock(
    tx: Tx, namespace_id: bytes, queue_ids: set[bytes], owner_ids: set[bytes]
) -> _Quotas:
    apps, queues = await transitions.lock_usage(tx, namespace_id, queue_ids, sorted(owner_ids))
    limits: dict[bytes, int | None] = {}
    for queue_id in sorted(queue_ids):
        q = await queue_store.queue_get(tx, namespace_id, queue_id)
        limits[queue_id] = None if q is None or q["max_unfinished_tasks"] is None else int(
            q["max_unfinished_tasks"]
        )
    return _Quotas(apps, queues, limits)


async def _rerun_locked(
    tx: Tx,
    namespace_id: bytes,
    row: dict[str, Any],
    actor: Actor,
    note: str,
    extra: int,
    stamp: datetime,
) -> None:
    """Re-run one locked, finished task; the usage counters are the caller's."""
    resolution = _resolution(actor, note, row, stamp)
    ok = await store.task_rerun_if_finished(
        tx, namespace_id, row["id"], row["revision"], extra, resolution, stamp
    )
    assert ok, "the task row is locked and finished"
    await attempt_store.evidence_insert(
        tx,
        {
            "namespace_id": namespace_id,
            "id": new_id(),
            "attempt_id": NO_ATTEMPT,
            "task_id": row["id"],
            "kind": "operator_rerun",
            "result": None,
            "data": resolution,
            "now": stamp,
        },
    )


async def rerun_task(
    db: Database,
    namespace_id: bytes,
    task_id: str,
    body: Rerun,
    *,
    actor: Actor,
    hub: Notifier | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Re-run one FAILED or CANCELLED task (module docstring); the task view. 404 absent,
    409 another state (or a workflow's task), 429 a quota is full."""
    tid = parse_id(task_id)
    if tid is None:
        raise TaskNotFound()

    async def run(tx: Tx) -> tuple[dict[str, Any], bytes]:
        stamp = await clock_now(tx, now)
        peek = await task_store.task_get(tx, namespace_id, tid)
        if peek is None:
            raise TaskNotFound()
        if peek["state"] not in FINISHED:
            raise TaskStateConflict(
                f"only a FAILED or CANCELLED task can be re-run, not a {peek['state']} one",
                state=peek["state"],
            )
        if peek["source_kind"] == "workflow":
            raise WorkflowTask()
        quotas = await _lock(tx, namespace_id, {peek["queue_id"]}, {peek["owner_id"]})
        row = await task_store.task_get(tx, namespace_id, tid, for_update=True)
        assert row is not None
        if row["state"] not in FINISHED:
            raise TaskStateConflict("the task is not finished any more", state=row["state"])
        refused = quotas.admit(row["queue_id"], row["owner_id"])
        if refused is not None:
            raise refused
        await _rerun_locked(tx, namespace_id, row, actor, body.note, body.attempts, stamp)
        await transitions.adjust_usage(
            tx, namespace_id, row["queue_id"], unfinished=1, owner_id=row["owner_id"]
        )
        await audit.record(
            tx, actor=actor, action=ACTION, resource_kind="task", resource_id=tid,
            status_code=200, namespace_id=namespace_id, request_id=request_id,
            details={"from_state": row["state"], "attempts": int(row["attempts"]),
                     "extra_attempts": body.attempts},
            now=stamp,
        )  # fmt: skip
        after = await task_store.task_get(tx, namespace_id, tid)
        assert after is not None
        await transitions.record(
            tx, namespace_id, after, EVENT_RERUN,
            {"from_state": row["state"], "note": body.note}, request_id=request_id, now=stamp,
        )  # fmt: skip
        return transitions.task_view(after), row["queue_id"]

    view, queue_id = await db.transaction(run)
    await wake_queue(hub, namespace_id, queue_id)
    return view


def _time(value: str | None, field: str, default: datetime) -> datetime:
    if value is None:
        return default
    try:
        return parse_time(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: {exc}", field=field) from None


async def rerun_bulk(
    db: Database,
    namespace_id: bytes,
    body: RerunBulk,
    *,
    actor: Actor,
    hub: Notifier | None = None,
    batch: int = BULK_BATCH,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Re-run every finished task of the filter (module docstring): ``{"retried": n,
    "quota_refused": m}``; with ``dry_run`` ``{"matched": n, "more": bool}`` (counted up to
    :data:`COUNT_CAP`). An unknown queue matches nothing."""
    owner: bytes | None = None
    if body.owner_id is not None:
        owner = parse_id(body.owner_id)
        if owner is None:
            raise InvalidRequest("owner_id must be 32 lowercase hex", field="owner_id")
    since = _time(body.finished_after, "finished_after", _EPOCH)

    async def start(tx: Tx) -> tuple[datetime, bytes | None, bool]:
        stamp = await clock_now(tx, now)
        if body.queue is None:
            return stamp, None, True
        q = await queue_store.queue_get_by_name(tx, namespace_id, body.queue)
        return stamp, None if q is None else q["id"], q is not None

    stamp, queue_id, known = await db.read(start)
    until = _time(body.finished_before, "finished_before", stamp)
    if until <= since:
        raise InvalidRequest("finished_before must be after finished_after", field="finished_before")
    filters: dict[str, Any] = {
        "states": sorted(set(body.states or FINISHED)), "since": since, "until": until,
        "queue_id": queue_id, "kind": body.kind, "owner_id": owner,
        "error_type": body.error_type,
    }  # fmt: skip
    if body.dry_run:
        if not known:
            return {"matched": 0, "more": False}

        async def count(tx: Tx) -> int:
            return await store.task_rerun_count(tx, namespace_id, filters, COUNT_CAP)

        n = await db.read(count)
        return {"matched": min(n, COUNT_CAP), "more": n >= COUNT_CAP}
    total = {"retried": 0, "quota_refused": 0}
    if not known:
        return total
    position: tuple[datetime, bytes] = (_EPOCH, b"")

    async def step(tx: Tx) -> tuple[int, int, set[bytes], tuple[datetime, bytes] | None]:
        t = await clock_now(tx, now)
        candidates = await store.task_rerun_candidates(
            tx, namespace_id, filters, position[0], position[1], batch
        )
        if not candidates:
            return 0, 0, set(), None
        quotas = await _lock(
            tx, namespace_id, {c["queue_id"] for c in candidates}, {c["owner_id"] for c in candidates}
        )
        locked = await task_store.task_get_many(
            tx, namespace_id, sorted(c["id"] for c in candidates), for_update=True
        )
        changes: list[Any] = []
        refused = 0
        woke: set[bytes] = set()
        deltas: dict[tuple[bytes, bytes], int] = {}
        for c in candidates:  # oldest finish first: a quota that fills up keeps the oldest
            row = locked.get(c["id"])
            if row is None or row["state"] not in filters["states"]:
                continue  # re-run or changed since it was read
            if quotas.admit(row["queue_id"], row["owner_id"]) is not None:
                refused += 1
                continue
            await _rerun_locked(tx, namespace_id, row, actor, body.note, body.attempts, t)
            key = (row["queue_id"], row["owner_id"])
            deltas[key] = deltas.get(key, 0) + 1
            woke.add(row["queue_id"])
            changes.append((row["id"], row["state"]))
        for (qid, oid), n in sorted(deltas.items()):
            await transitions.adjust_usage(tx, namespace_id, qid, unfinished=n, owner_id=oid)
        if changes:
            await audit.record(
                tx, actor=actor, action=BULK_ACTION, resource_kind="namespace",
                resource_id=namespace_id, status_code=200, namespace_id=namespace_id,
                request_id=request_id,
                details={"retried": len(changes), "quota_refused": refused,
                         "queue": body.queue, "kind": body.kind, "error_type": body.error_type},
                now=t,
            )  # fmt: skip
            after = await task_store.task_get_many(tx, namespace_id, [i for i, _ in changes])
            await transitions.record_many(
                tx, namespace_id,
                [(after[i], EVENT_RERUN, {"from_state": s, "note": body.note}) for i, s in changes],
                request_id=request_id, now=t,
            )  # fmt: skip
        last = candidates[-1]
        more = len(candidates) == batch and not refused
        return len(changes), refused, woke, (last["state_changed_at"], last["id"]) if more else None

    while True:
        n, refused, woke, nxt = await db.transaction(step)
        total["retried"] += n
        total["quota_refused"] += refused
        for qid in sorted(woke):
            await wake_queue(hub, namespace_id, qid)
        if nxt is None:
            return total
        position = nxt


__all__ = ["Rerun", "RerunBulk", "WorkflowTask", "rerun_bulk", "rerun_task"]
