"""Tasks on the producer/operator side: read, list, attempts, cancel (single and bulk),
resolve NEEDS_REVIEW, and the deadline sweep. Submission is in :mod:`pulse.submit`.

State changes here follow the lock order (docs/architecture.md): the owner's application
resources row, then the queue usage row(s), then the task rows (by primary key), then the
result stream (``transitions.record`` last). Each change re-checks the task's state under
its row lock and writes its raw event, and for CANCELLED/SUCCEEDED/FAILED its result event,
in the same transaction.

Hub calls (``request_cancel``, ``notify_new_work``) happen only after COMMIT and only when a
hub is given (the node's ``PulseRuntime.hub``; ``pulse.hub.wake_queue`` / ``push_cancel``): a
transaction may be retried, a push cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from orbit import audit, pagination
from orbit import resources as orbit_resources
from orbit.audit import Actor
from orbit.business_json import check_json_text, enc_hook
from orbit.errors import InvalidRequest
from orbit.ids import id_hex, new_id, parse_id
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from orbit.times import format_opt, format_time
from pulse import transitions
from pulse.errors import TaskNotFound, TaskStateConflict
from pulse.progress import attempt_progress
from pulse.store import attempts as attempt_store
from pulse.store import queues as queue_store
from pulse.store import tasks as store
from pulse.store import watchdog as watchdog_store
from pulse.types import Resolve, ResolveAction, TaskListFilters, TaskState

if TYPE_CHECKING:
    from pulse.hub import Notifier

log = logging.getLogger("pulse.tasks")

#: Rows changed per transaction by a bulk cancel.
BULK_CANCEL_BATCH = 500
#: The ``attempt_id`` of evidence that concerns no attempt (a task never started).
NO_ATTEMPT = bytes(16)

CANCELLED_ERROR = msgspec.json.encode(
    {"type": "cancelled", "message": "cancelled on request"}
).decode()
_ENC = msgspec.json.Encoder(enc_hook=enc_hook)
_EPOCH = datetime(1970, 1, 1)


def _task_id(text: str) -> bytes:
    task_id = parse_id(text)
    if task_id is None:
        raise TaskNotFound()
    return task_id


# -- reads -----------------------------------------------------------------------------------


async def get_task(db: Database, namespace_id: bytes, task_id: str) -> dict[str, Any]:
    """The task view; 404 for a malformed id, an absent task or another namespace's."""
    tid = _task_id(task_id)

    async def run(tx: Tx) -> dict[str, Any]:
        row = await store.task_get(tx, namespace_id, tid)
        if row is None:
            raise TaskNotFound()
        return transitions.task_view(row)

    return await db.read(run)


async def list_tasks(
    db: Database,
    namespace_id: bytes,
    filters: TaskListFilters,
    *,
    limit: int = pagination.DEFAULT_LIMIT,
    cursor: str | None = None,
    stuck: bool | None = None,
    max_bytes: int = pagination.MAX_PAGE_BYTES,
    charge: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Tasks oldest first (``created_at``, ``id``), filtered; ``{"items", "next_cursor"}``.
    A page holds at most ``max_bytes`` of stored JSON (at least one task): it is sized first
    and only its rows are read (orbit/pagination.py); ``charge(bytes)`` is called with the
    page's bytes before they are read (it may refuse: orbit/list_bytes.py).

    The cursor is bound to the filters: reusing it with other filters is a 400. An unknown
    queue name matches nothing (empty page); an invalid state or owner id is a 400.
    ``stuck=True`` keeps only the tasks currently stuck (surfaced by the watchdog in their
    current state episode, not terminal: ``pulse.watchdog``), ``stuck=False`` only the
    others; None does not filter.
    """
    bound = {k: v for k, v in msgspec.structs.asdict(filters).items() if v is not None}
    if stuck is not None:
        bound["stuck"] = stuck
    position = pagination.decode_cursor(cursor, bound)
    if filters.state is not None and filters.state not in TaskState.__members__:
        raise InvalidRequest("unknown task state", field="state")
    owner_id = None
    if filters.owner_id is not None:
        owner_id = parse_id(filters.owner_id)
        if owner_id is None:
            raise InvalidRequest("owner_id must be 32 lowercase hex", field="owner_id")
    after_created, after_id = _EPOCH, b""
    if position is not None:
        try:
            after_created = datetime.fromisoformat(str(position["t"]))
            after_id = bytes.fromhex(str(position["i"]))
        except (KeyError, ValueError):
            raise InvalidRequest("cursor is not valid", field="cursor") from None

    async def run(tx: Tx) -> dict[str, Any]:
        queue_id: bytes | None = None
        if filters.queue is not None:
            q = await queue_store.queue_get_by_name(tx, namespace_id, filters.queue)
            if q is None:
                return {"items": [], "next_cursor": None}
            queue_id = q["id"]
        params = {
            "namespace_id": namespace_id,
            "queue_id": queue_id,
            "state": filters.state,
            "kind": filters.kind,
            "owner_id": owner_id,
            "dedup_key": filters.dedup_key,
            "after_created_at": after_created,
            "after_id": after_id,
            "limit": limit + 1,
        }
        if stuck is None:
            sized = await store.task_list_sizes(tx, params)
        else:
            sized = await watchdog_store.task_list_sizes(tx, {**params, "stuck": int(stuck)})
        keys = sized[: pagination.fitting((int(r["page_bytes"] or 0) for r in sized[:limit]),
                                          max_bytes)]  # fmt: skip
        if charge is not None:
            charge(sum(int(k["page_bytes"] or 0) for k in keys))
        found = await store.task_get_many(tx, namespace_id, [k["id"] for k in keys])
        rows = [found[k["id"]] for k in keys if k["id"] in found]
        next_cursor = None
        if len(sized) > len(keys) and keys:
            last = keys[-1]
            next_cursor = pagination.encode_cursor(
                {"t": last["created_at"].isoformat(), "i": last["id"].hex()}, bound
            )
        return {"items": [transitions.task_view(r) for r in rows], "next_cursor": next_cursor}

    return await db.read(run)


def attempt_view(row: dict[str, Any], evidence: list[dict[str, Any]]) -> dict[str, Any]:
    """The API attempt object (no token digests), with its evidence and its last progress
    document (pulse/progress.py)."""
    progress, progress_at = attempt_progress(row)
    return {
        "id": id_hex(row["id"]),
        "generation": int(row["generation"]),
        "session_id": id_hex(row["session_id"]),
        "state": row["state"],
        "concurrency_token": row["concurrency_token"],
        "lease_expires_at": format_opt(row["lease_expires_at"]),
        "offered_at": format_opt(row["offered_at"]),
        "started_at": format_opt(row["started_at"]),
        "finished_at": format_opt(row["finished_at"]),
        "result": transitions.raw_json(row["result"]),
        "error": transitions.json_value(row["error"]),
        "retryable": None if row["retryable"] is None else bool(row["retryable"]),
        "progress": progress,
        "progress_at": progress_at,
        "evidence": evidence,
    }


def evidence_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": id_hex(row["id"]),
        "attempt_id": None if row["attempt_id"] == NO_ATTEMPT else id_hex(row["attempt_id"]),
        "kind": row["kind"],
        "result": transitions.raw_json(row["result"]),
        "data": transitions.json_value(row["data"]),
        "created_at": format_time(row["created_at"]),
    }


async def list_attempts(db: Database, namespace_id: bytes, task_id: str) -> dict[str, Any]:
    """``{"task_id", "items": [attempt + evidence, by generation], "evidence": [...],
    "next_cursor": null}``; ``evidence`` at the top level holds facts tied to no attempt."""
    tid = _task_id(task_id)

    async def run(tx: Tx) -> dict[str, Any]:
        if await store.task_get(tx, namespace_id, tid) is None:
            raise TaskNotFound()
        attempts = await attempt_store.attempt_list_for_task(tx, namespace_id, tid)
        evidence = await attempt_store.evidence_list_for_task(tx, namespace_id, tid)
        by_attempt: dict[bytes, list[dict[str, Any]]] = {}
        for e in evidence:
            by_attempt.setdefault(e["attempt_id"], []).append(evidence_view(e))
        known = {a["id"] for a in attempts}
        orphans = [evidence_view(e) for e in evidence if e["attempt_id"] not in known]
        return {
            "task_id": id_hex(tid),
            "items": [attempt_view(a, by_attempt.get(a["id"], [])) for a in attempts],
            "evidence": orphans,
            "next_cursor": None,
        }

    return await db.read(run)


# -- cancel ----------------------------------------------------------------------------------


@dataclass
class CancelOutcome:
    """Result of :func:`cancel_task`: 200 (CANCELLED now or already) or 202 (requested)."""

    status: int
    task: dict[str, Any]
    #: (task id, attempt id) of running attempts the hub must ask to stop.
    notify: list[tuple[bytes, bytes]] = field(default_factory=list)


def _cancellable(row: dict[str, Any]) -> bool:
    """True when a cancel would change the task (WAITING, LEASED, RUNNING not yet asked)."""
    return row["state"] in ("WAITING", "LEASED") or (
        row["state"] == "RUNNING" and not row["cancel_requested"]
    )


def _owner_ids(rows: Iterable[dict[str, Any]]) -> list[bytes]:
    return sorted({r["owner_id"] for r in rows})


async def _release_offer(tx: Tx, namespace_id: bytes, attempt_id: bytes, now: datetime) -> None:
    """The offer of a cancelled LEASED task is RELEASED, so its later start is denied. The
    attempt is locked after its task (the lock order) and released under its revision."""
    attempt = await attempt_store.attempt_lock(tx, namespace_id, attempt_id)
    if attempt is None or attempt["state"] != "OFFERED":
        return
    ok = await attempt_store.attempt_release_if_offered(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt_id,
            "now": now,
            "error": CANCELLED_ERROR,
            "revision": attempt["revision"],
        },
    )
    assert ok, "the attempt row is locked"


async def _cancel_locked(
    tx: Tx, namespace_id: bytes, rows: list[dict[str, Any]], now: datetime
) -> tuple[list[transitions.Change], list[tuple[bytes, bytes]], dict[bytes, dict[str, Any]]]:
    """Cancel already-locked ``rows``: WAITING/LEASED → CANCELLED, RUNNING → cancel
    requested. Returns (changes for record_many, running attempts to notify, rows after)."""
    cancelled: list[bytes] = []
    requested: list[tuple[bytes, bytes]] = []
    deltas: dict[tuple[bytes, bytes], list[int]] = {}
    for row in rows:
        state = row["state"]
        if state in ("WAITING", "LEASED"):
            ok = await store.task_cancel_if_unstarted(
                tx, namespace_id, row["id"], row["revision"], CANCELLED_ERROR, now
            )
            assert ok, "the task row is locked"
            if state == "LEASED" and row["current_attempt_id"] is not None:
                await _release_offer(tx, namespace_id, row["current_attempt_id"], now)
            u, r, a = transitions.usage_delta(state, "CANCELLED")
            d = deltas.setdefault((row["queue_id"], row["owner_id"]), [0, 0, 0])
            d[0] += u
            d[1] += r
            d[2] += a
            cancelled.append(row["id"])
        elif state == "RUNNING" and not row["cancel_requested"]:
            ok = await store.task_request_cancel_if_running(
                tx, namespace_id, row["id"], row["revision"]
            )
            assert ok, "the task row is locked"
            requested.append((row["id"], row["current_attempt_id"]))
    for (queue_id, owner_id), (u, r, a) in sorted(deltas.items()):
        await transitions.adjust_usage(tx, namespace_id, queue_id, u, r, a, owner_id=owner_id)
    changed = [*cancelled, *(t for t, _ in requested)]
    after = await store.task_get_many(tx, namespace_id, changed)
    changes: list[transitions.Change] = [
        (after[t], transitions.EVENT_CANCELLED, {"reason": "cancel_requested"}) for t in cancelled
    ]
    changes += [
        (after[t], transitions.EVENT_CANCEL_REQUESTED, {"attempt_id": id_hex(a)})
        for t, a in requested
    ]
    return changes, requested, after


async def cancel_task(
    db: Database,
    namespace_id: bytes,
    task_id: str,
    *,
    hub: Notifier | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> CancelOutcome:
    """Cancel one task (docs/api/tasks.md#cancel).

    WAITING or LEASED → CANCELLED at once (200; a LEASED task's offered attempt becomes
    RELEASED, so the worker's later ``start`` is denied). RUNNING → ``cancel_requested``
    (202) and, after commit, ``hub.request_cancel(namespace_id, task_id, attempt_id)``.
    Already CANCELLED → 200 unchanged. SUCCEEDED, FAILED, NEEDS_REVIEW → 409 (a task under
    review is resolved, not cancelled).
    """
    tid = _task_id(task_id)

    async def run(tx: Tx) -> CancelOutcome:
        stamp = await clock_now(tx, now)
        peek = await store.task_get(tx, namespace_id, tid)
        if peek is None:
            raise TaskNotFound()
        if not _cancellable(peek):
            # Decided on the committed row, no locks taken: terminal states never change,
            # and a cancel request is never withdrawn.
            row = peek
        else:
            await transitions.lock_usage(tx, namespace_id, [peek["queue_id"]], [peek["owner_id"]])
            locked = await store.task_get(tx, namespace_id, tid, for_update=True)
            assert locked is not None
            row = locked
        state = row["state"]
        if state == "CANCELLED":
            return CancelOutcome(200, transitions.task_view(row))
        if state in ("SUCCEEDED", "FAILED", "NEEDS_REVIEW"):
            raise TaskStateConflict(f"a {state} task cannot be cancelled", state=state)
        if state == "RUNNING" and row["cancel_requested"]:
            return CancelOutcome(202, transitions.task_view(row))
        changes, requested, after = await _cancel_locked(tx, namespace_id, [row], stamp)
        status = 202 if requested else 200
        if actor is not None:
            await audit.record(
                tx, actor=actor, action="tasks.cancel", resource_kind="task", resource_id=tid,
                status_code=status, namespace_id=namespace_id, request_id=request_id,
                details={"from_state": state}, now=stamp,
            )  # fmt: skip
        await transitions.record_many(tx, namespace_id, changes, request_id=request_id, now=stamp)
        return CancelOutcome(status, transitions.task_view(after[tid]), requested)

    outcome = await db.transaction(run)
    await _notify_cancel(hub, namespace_id, outcome.notify)
    return outcome


async def _notify_cancel(
    hub: Notifier | None, namespace_id: bytes, items: list[tuple[bytes, bytes]]
) -> None:
    if hub is None or not items:
        return
    from pulse.hub import push_cancel

    for task_id, attempt_id in items:
        await push_cancel(hub, namespace_id, task_id, attempt_id)


async def cancel_in_tx(
    tx: Tx,
    namespace_id: bytes,
    task_ids: Iterable[bytes],
    *,
    request_id: str | None = None,
    now: datetime | None = None,
) -> list[tuple[bytes, bytes]]:
    """Cancel tasks inside the caller's transaction (for a package whose own change cancels
    work, e.g. a workflow instance that is cancelled or fails).

    WAITING/LEASED → CANCELLED, RUNNING → cancel requested, other states untouched (no error).
    Locks in the lock order (application resources → queue usage → tasks) and writes the
    events with :func:`transitions.record_many`, so call it as the last write of the
    transaction. Returns the (task id, attempt id) of running attempts: after COMMIT, push
    their cancels with ``pulse.hub.push_cancel(hub, namespace_id, task_id, attempt_id)``.
    """
    ids = sorted(set(task_ids))
    if not ids:
        return []
    stamp = await clock_now(tx, now)
    peek = await store.task_get_many(tx, namespace_id, ids)
    todo = [r for r in peek.values() if _cancellable(r)]
    if not todo:
        return []
    await transitions.lock_usage(tx, namespace_id, [r["queue_id"] for r in todo], _owner_ids(todo))
    locked = await store.task_get_many(
        tx, namespace_id, sorted(r["id"] for r in todo), for_update=True
    )
    rows = [locked[k] for k in sorted(locked) if _cancellable(locked[k])]
    changes, requested, _ = await _cancel_locked(tx, namespace_id, rows, stamp)
    await transitions.record_many(tx, namespace_id, changes, request_id=request_id, now=stamp)
    return requested


async def cancel_bulk(
    db: Database,
    namespace_id: bytes,
    *,
    owner_id: str | None = None,
    queue: str | None = None,
    kind: str | None = None,
    hub: Notifier | None = None,
    batch: int = BULK_CANCEL_BATCH,
    actor: Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, int]:
    """Cancel every matching task, ``batch`` rows per transaction, until none is left:
    ``{"cancelled": n, "cancel_requested": m}``.

    Filters combine with AND; none = every task of the namespace. A task of another owner is
    never touched when ``owner_id`` is given. An unknown queue matches nothing.
    """
    owner: bytes | None = None
    if owner_id is not None:
        owner = parse_id(owner_id)
        if owner is None:
            raise InvalidRequest("owner_id must be 32 lowercase hex", field="owner_id")
    total = {"cancelled": 0, "cancel_requested": 0}

    async def run(tx: Tx) -> tuple[int, int, list[tuple[bytes, bytes]], bool]:
        stamp = await clock_now(tx, now)
        queue_id: bytes | None = None
        if queue is not None:
            q = await queue_store.queue_get_by_name(tx, namespace_id, queue)
            if q is None:
                return 0, 0, [], True
            queue_id = q["id"]
        candidates = await store.task_cancel_candidates(
            tx, namespace_id, owner, queue_id, kind, batch
        )
        if not candidates:
            return 0, 0, [], True
        await transitions.lock_usage(
            tx,
            namespace_id,
            [c["queue_id"] for c in candidates],
            _owner_ids(candidates),
        )
        locked = await store.task_get_many(
            tx, namespace_id, sorted(c["id"] for c in candidates), for_update=True
        )
        rows = [locked[k] for k in sorted(locked)]
        # Re-check the filter under the lock (owner, queue, kind never change; state may).
        rows = [
            r
            for r in rows
            if (owner is None or r["owner_id"] == owner)
            and (queue_id is None or r["queue_id"] == queue_id)
            and (kind is None or r["kind"] == kind)
        ]
        changes, requested, _ = await _cancel_locked(tx, namespace_id, rows, stamp)
        n_cancelled = len(changes) - len(requested)
        if actor is not None and changes:
            await audit.record(
                tx, actor=actor, action="tasks.cancel_bulk", resource_kind="namespace",
                resource_id=namespace_id, status_code=200, namespace_id=namespace_id,
                request_id=request_id,
                details={
                    "owner_id": owner_id, "queue": queue, "kind": kind,
                    "cancelled": n_cancelled, "cancel_requested": len(requested),
                },
                now=stamp,
            )  # fmt: skip
        await transitions.record_many(tx, namespace_id, changes, request_id=request_id, now=stamp)
        return n_cancelled, len(requested), requested, len(candidates) < batch

    while True:
        n, m, requested, done = await db.transaction(run)
        total["cancelled"] += n
        total["cancel_requested"] += m
        await _notify_cancel(hub, namespace_id, requested)
        if done:
            return total


# -- resolve ---------------------------------------------------------------------------------


async def resolve_task(
    db: Database,
    namespace_id: bytes,
    task_id: str,
    body: Resolve,
    *,
    actor: Actor,
    hub: Notifier | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Resolve a NEEDS_REVIEW task (else 409): ``retry`` → WAITING (history kept, at least
    one more attempt allowed), ``succeed`` → SUCCEEDED with ``result``, ``fail`` → FAILED
    with ``error`` (default ``{"type": "operator_failed", "message": note}``).

    In one transaction: the task update (``effect_uncertain`` cleared, ``resolution``
    recorded), an ``operator_resolution`` evidence row, the audit event, the raw event and,
    for succeed/fail, the result event. Returns the task view.
    """
    tid = _task_id(task_id)
    result_text = None
    if body.result is not msgspec.UNSET and bytes(body.result).strip() != b"null":
        result_text = check_json_text(bytes(body.result), "result")
    if body.action is not ResolveAction.SUCCEED and result_text is not None:
        raise InvalidRequest("result is only allowed with action succeed", field="result")
    if body.action is not ResolveAction.FAIL and body.error is not None:
        raise InvalidRequest("error is only allowed with action fail", field="error")
    error_obj = body.error
    if body.action is ResolveAction.FAIL and error_obj is None:
        error_obj = {"type": "operator_failed", "message": body.note}

    async def run(tx: Tx) -> tuple[dict[str, Any], bytes | None]:
        stamp = await clock_now(tx, now)
        peek = await store.task_get(tx, namespace_id, tid)
        if peek is None:
            raise TaskNotFound()
        if peek["state"] != "NEEDS_REVIEW":
            raise TaskStateConflict("only a NEEDS_REVIEW task can be resolved", state=peek["state"])
        await transitions.lock_usage(tx, namespace_id, [peek["queue_id"]], [peek["owner_id"]])
        row = await store.task_get(tx, namespace_id, tid, for_update=True)
        assert row is not None
        if row["state"] != "NEEDS_REVIEW":
            raise TaskStateConflict("only a NEEDS_REVIEW task can be resolved", state=row["state"])
        resolution = {
            "action": body.action.value,
            "note": body.note,
            "by": {
                "credential_id": None
                if actor.credential_id is None
                else id_hex(actor.credential_id),
                "application_id": None
                if actor.application_id is None
                else id_hex(actor.application_id),
            },
            "at": format_time(stamp),
            "previous_error": transitions.json_value(row["error"]),
            "effect_uncertain": bool(row["effect_uncertain"]),
            "attempts": int(row["attempts"]),
        }
        resolution_text = _ENC.encode(resolution).decode()
        if body.action is ResolveAction.RETRY:
            ok = await store.task_resolve_retry_if_review(
                tx, namespace_id, tid, row["revision"], resolution_text, stamp
            )
            new_state = "WAITING"
        else:
            new_state = "SUCCEEDED" if body.action is ResolveAction.SUCCEED else "FAILED"
            ok = await store.task_resolve_finish_if_review(
                tx,
                namespace_id,
                tid,
                row["revision"],
                new_state,
                result_text,
                None if error_obj is None else _ENC.encode(error_obj).decode(),
                resolution_text,
                stamp,
            )
        assert ok, "the task row is locked"
        u, r, a = transitions.usage_delta("NEEDS_REVIEW", new_state)
        await transitions.adjust_usage(
            tx, namespace_id, row["queue_id"], u, r, a, owner_id=row["owner_id"]
        )
        latest = await store.attempt_latest_for_task(tx, namespace_id, tid)
        await attempt_store.evidence_insert(
            tx,
            {
                "namespace_id": namespace_id,
                "id": new_id(),
                "attempt_id": latest["id"] if latest else NO_ATTEMPT,
                "task_id": tid,
                "kind": "operator_resolution",
                "result": result_text,
                "data": resolution_text,
                "now": stamp,
            },
        )
        await audit.record(
            tx,
            actor=actor,
            action="tasks.resolve",
            resource_kind="task",
            resource_id=tid,
            status_code=200,
            namespace_id=namespace_id,
            request_id=request_id,
            details={"action": body.action.value, "state": new_state},
            now=stamp,
        )
        after = await store.task_get(tx, namespace_id, tid)
        assert after is not None
        await transitions.record(
            tx,
            namespace_id,
            after,
            transitions.EVENT_RESOLVED,
            {"action": body.action.value},
            request_id=request_id,
            now=stamp,
        )
        return transitions.task_view(after), (row["queue_id"] if new_state == "WAITING" else None)

    view, wake = await db.transaction(run)
    if wake is not None:
        from pulse.hub import wake_queue

        await wake_queue(hub, namespace_id, wake)
    return view


# -- deadlines -------------------------------------------------------------------------------


async def expire_deadlines_once(
    db: Database, limit: int = 500, *, now: datetime | None = None
) -> int:
    """Move up to ``limit`` WAITING tasks (any namespace) whose ``deadline_at`` has passed to
    FAILED with ``{"type": "deadline_exceeded"}``; return how many. Safe on many nodes at
    once (candidates are claimed with SKIP LOCKED). Judged by the database clock. Then, in a
    transaction of its own, deletes up to ``limit`` deadline rows past their deadline whose
    task is finished, gone or without that deadline (pulse_task_deadlines: a row outlives
    its task's wait, so the scan stays the size of what is in flight).
    """
    expired = await db.transaction(partial(_expire, limit=limit, now=now))

    async def clean(tx: Tx) -> None:
        stamp = await clock_now(tx, now)
        by_ns: dict[bytes, list[bytes]] = {}
        for r in await store.deadline_stale_rows(tx, stamp, limit):
            by_ns.setdefault(bytes(r["namespace_id"]), []).append(bytes(r["task_id"]))
        for ns, ids in sorted(by_ns.items()):
            await store.deadline_delete_many(tx, ns, sorted(ids), stamp)

    await db.transaction(clean)
    return expired


async def _expire(tx: Tx, *, limit: int, now: datetime | None) -> int:
    """The sweep's transaction: fail the WAITING tasks past their deadline."""
    stamp = await clock_now(tx, now)
    candidates = await store.task_expire_candidates(tx, stamp, limit)
    if not candidates:
        return 0
    # Lock order across namespaces: every owner's resources row, then every queue's
    # usage row, then the tasks (SKIP LOCKED), then the result streams.
    for app in sorted({c["owner_id"] for c in candidates}):
        await orbit_resources.lock_resources(tx, app)
    for ns, queue_id in sorted({(c["namespace_id"], c["queue_id"]) for c in candidates}):
        await queue_store.queue_usage_lock(tx, ns, queue_id)
    by_ns: dict[bytes, list[bytes]] = {}
    for c in candidates:
        by_ns.setdefault(c["namespace_id"], []).append(c["id"])
    err = _ENC.encode(
        {"type": "deadline_exceeded", "message": "the deadline passed before the task started"}
    ).decode()
    done: dict[bytes, list[bytes]] = {}
    for ns, ids in sorted(by_ns.items()):
        deltas: dict[tuple[bytes, bytes], int] = {}
        for row in await store.task_lock_expired_many(tx, ns, sorted(ids), stamp):
            ok = await store.task_fail_deadline_if_waiting(
                tx, ns, row["id"], row["revision"], err, stamp
            )
            assert ok, "the task row is locked"
            done.setdefault(ns, []).append(row["id"])
            key = (row["queue_id"], row["owner_id"])
            deltas[key] = deltas.get(key, 0) + 1
        for (queue_id, owner_id), n in sorted(deltas.items()):
            await transitions.adjust_usage(tx, ns, queue_id, -n, owner_id=owner_id)
    # Result streams last, one namespace after the other in a fixed order.
    for ns, ids in sorted(done.items()):
        after = await store.task_get_many(tx, ns, ids)
        await transitions.record_many(
            tx,
            ns,
            [(after[i], transitions.EVENT_FAILED, {"reason": "deadline_exceeded"}) for i in ids],
            now=stamp,
        )
    return sum(len(ids) for ids in done.values())
