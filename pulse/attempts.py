"""Attempts: start authorisation, heartbeats, result reports with receipts, evidence, and the
release/lost transitions recovery shares.

An attempt is one execution generation of a task, bound to one worker session
(docs/api/workers.md has the state machine):

    OFFERED ──start──▶ RUNNING ──complete──▶ SUCCEEDED
       │                  ├──fail──────────▶ FAILED
       │                  ├──cancelled─────▶ CANCELLED
       │                  └──lease lost────▶ LOST
       └──offer expired / start denied──────▶ RELEASED

Rules every function here keeps:

* **One transaction per decision**, with the rows locked in the lock order
  *application resources → queue usage → task → attempt → permit → result stream*
  (:func:`lock_chain`). The clock (``now``) is read from the database *after* the locks are
  held, so a lease is judged at the moment the decision is made. Tests pass ``now``.
* **Fencing.** ``complete``/``fail``/``cancelled``/``effect`` need the attempt's execution
  token (compared as SHA-256 digests in constant time), whichever session carries them: the
  token, not the session, binds a report to its attempt (docs/api/workers.md, "Which
  session may send what"). A wrong token changes nothing (409 ``stale_token``). A right
  token for an attempt that is no longer current (lease expired, LOST, a newer generation
  exists, another report already applied) is recorded as evidence and never applied (409
  ``stale_token``, ``details.evidence``).
* **Receipts.** The first applied report of an attempt stores a receipt; the same report
  again (same operation and canonical digest, whatever its ``msg_id``) gets that receipt with
  ``outcome: "replayed"``; a different report after it is stale (evidence, ``stale_token``).
* Every task change writes its raw event (and result event) through
  :func:`pulse.transitions.record_many`, as the last write of the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit.errors import Conflict
from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx
from orbit.times import format_opt, format_time
from pulse import permits, transitions, wire
from pulse.attempt_rules import (
    DEADLINE_ERROR,
    DENY_ALREADY_STARTED,
    DENY_DEADLINE,
    DENY_NOT_CURRENT,
    DENY_NOT_FOUND,
    DENY_NOT_OFFERED,
    DENY_OFFER_EXPIRED,
    DENY_PAUSED,
    DENY_SESSION,
    Report,
    ReportPlan,
    _error_json,
    backoff_ms,
    is_current,
    ms,
    plan_report,
)
from pulse.errors import SessionGone
from pulse.store import attempts as store
from pulse.store import tasks as task_store

Row = dict[str, Any]
#: A task change to record: (task row after, raw event type, event data).
Change = tuple[Row, str, Mapping[str, Any] | None]

# -- locking ---------------------------------------------------------------------------------


async def lock_chain(
    tx: Tx, namespace_id: bytes, attempt_id: bytes, now: datetime | None = None
) -> tuple[Row, Row, datetime] | None:
    """Lock, in the lock order, the owner's resources row, the queue usage row, the task and
    the attempt; return (task, attempt, now) as locked — ``now`` read from the database
    clock once the locks are held (or the pinned ``now``) — or None when the attempt does
    not exist.

    The attempt and its task are first read without locks only to learn the queue and owner
    (which never change); every decision uses the rows as locked.
    """
    peek = await store.attempt_peek(tx, namespace_id, attempt_id)
    if peek is None:
        return None
    await transitions.lock_usage(tx, namespace_id, [peek["queue_id"]], [peek["owner_id"]])
    task = await store.task_lock(tx, namespace_id, peek["task_id"])
    attempt = await store.attempt_lock(tx, namespace_id, attempt_id, now)
    if task is None or attempt is None:
        return None
    return task, attempt, attempt["db_now"]


async def reselect(tx: Tx, namespace_id: bytes, task_id: bytes) -> Row:
    row = await task_store.task_get(tx, namespace_id, task_id)
    assert row is not None
    return row


# -- shared transitions (caller holds the lock chain) ----------------------------------------


async def release_offer(
    tx: Tx,
    namespace_id: bytes,
    task: Row,
    attempt: Row,
    now: datetime,
    reason: str,
    *,
    available_at: datetime | None = None,
) -> list[Change]:
    """OFFERED → RELEASED; the task, when leased to it, goes back to WAITING (attempts
    unchanged: nothing ran), not dispatched before ``available_at`` when given (a full
    start-rate window). Returns the task change to record (empty when the task had already
    moved on)."""
    released = await store.attempt_release_if_offered(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt["id"],
            "now": now,
            "error": _error_json({"type": "released", "reason": reason}),
            "revision": attempt["revision"],
        },
    )
    if not released:
        return []
    if not (task["state"] == "LEASED" and task["current_attempt_id"] == attempt["id"]):
        return []
    params = {
        "namespace_id": namespace_id,
        "id": task["id"],
        "attempt_id": attempt["id"],
        "now": now,
        "revision": task["revision"],
    }
    if available_at is None:
        ok = await store.task_release_if_leased(tx, params)
    else:
        ok = await store.task_release_until_if_leased(tx, {**params, "available_at": available_at})
    if not ok:  # pragma: no cover - the task row is locked
        raise Conflict("task changed while locked", kind="task_state")
    await transitions.adjust_usage(
        tx, namespace_id, task["queue_id"], reservations=-1, owner_id=task["owner_id"]
    )
    after = await reselect(tx, namespace_id, task["id"])
    data: dict[str, Any] = {"released_attempt_id": id_hex(attempt["id"]), "reason": reason}
    if available_at is not None:
        data["available_at"] = format_time(available_at)
    return [(after, transitions.EVENT_RELEASED, data)]


async def lose_running(
    tx: Tx, namespace_id: bytes, task: Row, attempt: Row, now: datetime, reason: str
) -> list[Change]:
    """RUNNING → LOST: its effect may or may not have happened.

    Evidence ``lost`` is recorded. The task (when this attempt is its current one):
    a cancel was requested → CANCELLED if ``retry_safe`` else NEEDS_REVIEW; otherwise
    ``retry_safe`` with attempts left → WAITING after the backoff; ``retry_safe`` with none
    left (a poison task that kills its worker every time) → FAILED ``attempts_exhausted``
    (its effect is idempotent, so nothing is uncertain: ``effect_uncertain`` stays 0); not
    ``retry_safe`` → NEEDS_REVIEW with ``effect_uncertain = 1``.
    """
    attempt_error = {
        "type": "attempt_lost",
        "reason": reason,
        "generation": int(attempt["generation"]),
    }
    finished = await store.attempt_finish_if_running(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt["id"],
            "state": "LOST",
            "now": now,
            "result": None,
            "error": _error_json(attempt_error),
            "retryable": None,
            "revision": attempt["revision"],
        },
    )
    if not finished:
        return []
    await store.evidence_insert(
        tx,
        {
            "namespace_id": namespace_id,
            "id": new_id(),
            "attempt_id": attempt["id"],
            "task_id": task["id"],
            "kind": "lost",
            "result": None,
            "data": _error_json(
                {
                    "reason": reason,
                    "generation": int(attempt["generation"]),
                    "session_id": id_hex(attempt["session_id"]),
                    "lease_expires_at": format_opt(attempt["lease_expires_at"]),
                }
            ),
            "now": now,
        },
    )
    if not is_current(task, attempt):
        return []
    retry_safe = bool(task["retry_safe"])
    attempts = int(task["attempts"])
    message = f"attempt {attempts} was lost ({reason}); its effect is uncertain"
    error: dict[str, Any] = {"type": "attempt_lost", "message": message, "reason": reason}
    if task["cancel_requested"]:
        state = "CANCELLED" if retry_safe else "NEEDS_REVIEW"
    elif retry_safe and attempts < int(task["max_attempts"]):
        state = "WAITING"
    elif retry_safe:
        state = "FAILED"
        error = {
            "type": "attempts_exhausted",
            "message": f"all {attempts} attempts were used up; attempt {attempts} was lost"
            f" ({reason}) — its worker stopped before reporting",
            "reason": reason,
            "lost_attempt_id": id_hex(attempt["id"]),
        }
    else:
        state = "NEEDS_REVIEW"
    available_at = now + ms(backoff_ms(task, attempts)) if state == "WAITING" else None
    await _end_run(
        tx,
        namespace_id,
        task,
        attempt,
        now,
        state=state,
        error=error,
        available_at=available_at,
        effect_uncertain=state == "NEEDS_REVIEW",
    )
    event = {
        "WAITING": transitions.EVENT_RETRY_SCHEDULED,
        "CANCELLED": transitions.EVENT_CANCELLED,
        "NEEDS_REVIEW": transitions.EVENT_NEEDS_REVIEW,
        "FAILED": transitions.EVENT_FAILED,
    }[state]
    after = await reselect(tx, namespace_id, task["id"])
    data: dict[str, Any] = {"lost_attempt_id": id_hex(attempt["id"]), "reason": reason}
    if available_at is not None:
        data["available_at"] = format_time(available_at)
    return [(after, event, data)]


async def _end_run(
    tx: Tx,
    namespace_id: bytes,
    task: Row,
    attempt: Row,
    now: datetime,
    *,
    state: str,
    result: str | None = None,
    error: Any = None,
    available_at: datetime | None = None,
    effect_uncertain: bool = False,
) -> None:
    """Move a RUNNING task off its attempt and adjust the usage counters to match; the
    attempt's permits are released (queue: ``active_attempts``; key: :mod:`pulse.permits`)."""
    terminal = state in transitions.TERMINAL_STATES
    ok = await store.task_end_run_if_running(
        tx,
        {
            "namespace_id": namespace_id,
            "id": task["id"],
            "attempt_id": attempt["id"],
            "state": state,
            "result": result,
            "error": _error_json(error),
            "finished_at": now if terminal else None,
            "available_at": available_at,
            "effect_uncertain": int(effect_uncertain),
            "now": now,
            "revision": task["revision"],
        },
    )
    if not ok:  # pragma: no cover - the task row is locked
        raise Conflict("task changed while locked", kind="task_state")
    unfinished, reservations, active = transitions.usage_delta("RUNNING", state)
    await transitions.adjust_usage(
        tx,
        namespace_id,
        task["queue_id"],
        unfinished=unfinished,
        reservations=reservations,
        active=active,
        owner_id=task["owner_id"],
    )
    await permits.release_many(
        tx, namespace_id, [(attempt["id"], task.get("concurrency_key_digest"))], now
    )


# -- start -----------------------------------------------------------------------------------


async def start(
    db: Database,
    namespace_id: bytes,
    session_id: bytes,
    attempt_id: bytes,
    *,
    now: datetime | None = None,
) -> wire.Started | wire.StartDenied:
    """Authorise the start of an offered attempt in one transaction (two-step dispatch,
    step 2) and return the execution token, or the reason it was refused.

    Checked, in order, with the rows locked: the attempt is this session's and OFFERED, its
    offer lease has not passed, the task is LEASED to it at the expected generation, the
    session is active, the namespace and queue gates are open, the deadline has not passed
    (else the task ends FAILED ``deadline_exceeded``), and the resources of
    :func:`_authorise_resources`. A refused offer is released (task back to WAITING).
    The one-item form of :func:`start_many`.
    """
    return (await start_many(db, namespace_id, [(session_id, attempt_id)], now=now))[0]


async def start_many(
    db: Database,
    namespace_id: bytes,
    items: Sequence[tuple[bytes, bytes]],
    *,
    now: datetime | None = None,
) -> list[wire.Started | wire.StartDenied]:
    """:func:`start` for many ``(session_id, attempt_id)`` of one namespace in ONE
    transaction; one reply per item, in order. The namespace's form of
    :func:`pulse.start_round.start_round` (a node round takes the starts of every
    namespace)."""
    from pulse.start_round import start_round

    return await start_round(db, [(namespace_id, s, a) for s, a in items], now=now)


# -- heartbeat -------------------------------------------------------------------------------


@dataclass
class HeartbeatResult:
    reply: wire.HeartbeatOk
    #: Attempts whose task has a cancel requested (the stream pushes ``cancel`` for them).
    cancel_requested: list[str] = field(default_factory=list)


async def heartbeat(
    db: Database,
    namespace_id: bytes,
    session_id: bytes,
    attempt_ids: Sequence[str],
    *,
    now: datetime | None = None,
) -> HeartbeatResult:
    """Extend the session's lease and the leases of the listed attempts.

    Per attempt: ``ok`` true with the new lease for a RUNNING attempt of this session whose
    lease has not passed; ``ok`` true with the unchanged offer lease for an OFFERED one;
    ``ok`` false otherwise (unknown, another session's, finished, released, lost, or its
    lease already passed: recovery decides, a heartbeat never revives an attempt).
    ``cancel_requested`` mirrors the task's flag. Raises :class:`SessionGone` when the
    session is not ACTIVE any more. The one-item form of
    :func:`pulse.heartbeat_round.heartbeat_round` (a node round takes the heartbeats of
    every session)."""
    from pulse.heartbeat_round import heartbeat_round

    (outcome,) = await heartbeat_round(db, [(namespace_id, session_id, attempt_ids)], now=now)
    if isinstance(outcome, SessionGone):
        raise outcome
    return outcome


# -- result reports --------------------------------------------------------------------------


async def report(
    db: Database,
    namespace_id: bytes,
    rep: Report,
    *,
    now: datetime | None = None,
) -> wire.Receipt:
    """Apply a ``complete``, ``fail`` or ``cancelled`` report, or replay its receipt.

    Raises :class:`~pulse.errors.AttemptNotFound` (no such attempt in the namespace),
    :class:`~orbit.errors.StaleToken` (wrong token: nothing changes; or a right token for an
    attempt that is no longer current or already has a different report applied: evidence
    ``late_<op>`` is committed, the task is untouched), :class:`~orbit.errors.Conflict`
    (``cancelled`` without a cancel request).

    ``complete`` → SUCCEEDED (a result after a cancel request stands). ``fail`` →
    WAITING after the backoff when retryable with attempts left, else FAILED; after a cancel
    request a retryable failure ends CANCELLED instead of retrying. ``cancelled`` → CANCELLED.
    The one-item form of :func:`report_many`.
    """
    outcome = (await report_many(db, namespace_id, [rep], now=now))[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


async def report_many(
    db: Database,
    namespace_id: bytes,
    reports: Sequence[Report],
    *,
    now: datetime | None = None,
) -> list[wire.Receipt | Exception]:
    """:func:`report` for many reports of one namespace in ONE transaction; per item, in
    order, its receipt or the exception :func:`report` would raise (a stale token fails only
    its own item). The namespace's form of :func:`pulse.report_round.report_round` (a node
    round takes the reports of every namespace)."""
    from pulse.report_round import report_round

    return await report_round(db, [(namespace_id, r) for r in reports], now=now)


# -- reads (tests, tools) --------------------------------------------------------------------


async def list_attempts(db: Database, namespace_id: bytes, task_id: bytes) -> list[Row]:
    """Attempts of a task by generation (rows as stored)."""

    async def run(tx: Tx) -> list[Row]:
        return await store.attempt_list_for_task(tx, namespace_id, task_id)

    return await db.read(run)


async def list_evidence(db: Database, namespace_id: bytes, task_id: bytes) -> list[Row]:
    """Evidence rows of a task, oldest first."""

    async def run(tx: Tx) -> list[Row]:
        return await store.evidence_list_for_task(tx, namespace_id, task_id)

    return await db.read(run)


__all__ = [
    "DEADLINE_ERROR",
    "DENY_ALREADY_STARTED",
    "DENY_DEADLINE",
    "DENY_NOT_CURRENT",
    "DENY_NOT_FOUND",
    "DENY_NOT_OFFERED",
    "DENY_OFFER_EXPIRED",
    "DENY_PAUSED",
    "DENY_SESSION",
    "Change",
    "HeartbeatResult",
    "Report",
    "ReportPlan",
    "SessionGone",
    "backoff_ms",
    "heartbeat",
    "is_current",
    "list_attempts",
    "list_evidence",
    "lock_chain",
    "lose_running",
    "ms",
    "plan_report",
    "release_offer",
    "report",
    "report_many",
    "reselect",
    "start",
    "start_many",
]
