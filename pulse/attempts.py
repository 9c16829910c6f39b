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

import hashlib
from collections import defaultdict
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit.errors import Conflict, InvalidRequest, StaleToken
from orbit.ids import digest, digest_matches, id_hex, new_id, new_secret, parse_id
from orbit.storage import Database, Tx
from orbit.store.events import clock_now
from orbit.times import format_opt, format_time
from pulse import permits, transitions, wire
from pulse.errors import AttemptNotFound
from pulse.store import attempts as store
from pulse.store import queues as queue_store
from pulse.store import sessions as session_store

Row = dict[str, Any]
#: A task change to record: (task row after, raw event type, event data).
Change = tuple[Row, str, Mapping[str, Any] | None]

# Start denial reasons (``start_denied.reason``; docs/api/workers.md).
DENY_NOT_FOUND = "not_found"  # no such attempt in this namespace, or another session's
DENY_ALREADY_STARTED = "already_started"  # RUNNING, but its lease passed or the task moved on
DENY_NOT_OFFERED = "not_offered"  # released, finished or lost
DENY_OFFER_EXPIRED = "offer_expired"  # the offer's lease passed before start
DENY_NOT_CURRENT = "not_current"  # the task moved on (cancelled, re-offered)
DENY_PAUSED = "paused"  # the namespace or queue gate is closed
DENY_DEADLINE = "deadline_exceeded"  # the task's deadline passed: it is now FAILED
DENY_SESSION = "session_inactive"  # the session expired or was closed

#: Error object of a task that was not started before its deadline.
DEADLINE_ERROR = {
    "type": "deadline_exceeded",
    "message": "the deadline passed before the task started",
}

_encode = msgspec.json.Encoder(order="sorted")
_decode_any = msgspec.json.Decoder()


# -- pure helpers ----------------------------------------------------------------------------


def backoff_ms(task: Mapping[str, Any], attempts: int, retry_after_ms: int | None = None) -> int:
    """Delay before the next attempt after ``attempts`` attempts, by the task's frozen policy:
    ``min(max, initial × multiplier^(attempts-1))``, or ``retry_after_ms`` when larger."""
    initial = int(task["retry_backoff_initial_ms"])
    cap = int(task["retry_backoff_max_ms"])
    mult = float(task["retry_backoff_multiplier"])
    exponent = max(0, attempts - 1)
    try:
        delay = initial * mult**exponent
    except OverflowError:
        delay = float(cap)
    value = int(min(float(cap), delay))
    if retry_after_ms is not None and retry_after_ms > value:
        value = int(retry_after_ms)
    return max(0, value)


def _ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


def _json_text(raw: msgspec.Raw | None) -> str | None:
    return None if raw is None else bytes(raw).decode()


def _error_json(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


@dataclass(frozen=True)
class Report:
    """A result report: ``op`` is ``complete``, ``fail`` or ``cancelled``."""

    op: str
    attempt_id: bytes
    execution_token: str
    result: msgspec.Raw | None = None
    error: wire.FailError | None = None
    retryable: bool = False
    retry_after_ms: int | None = None

    @classmethod
    def from_frame(
        cls, frame: wire.Complete | wire.Fail | wire.Cancelled, attempt_id: bytes
    ) -> Report:
        if isinstance(frame, wire.Complete):
            return cls("complete", attempt_id, frame.execution_token, result=frame.result)
        if isinstance(frame, wire.Fail):
            return cls(
                "fail",
                attempt_id,
                frame.execution_token,
                error=frame.error,
                retryable=frame.retryable,
                retry_after_ms=frame.retry_after_ms,
            )
        return cls("cancelled", attempt_id, frame.execution_token)

    def canonical(self) -> dict[str, Any]:
        """The report without transport details (msg_id, type, token), values decoded so
        that formatting differences (whitespace, key order) do not change the digest."""
        out: dict[str, Any] = {"op": self.op, "attempt_id": id_hex(self.attempt_id)}
        if self.op == "complete":
            out["result"] = _decode_any.decode(bytes(self.result or wire.NULL))
        elif self.op == "fail":
            assert self.error is not None
            out["error"] = {
                "type": self.error.type,
                "message": self.error.message,
                "details": None
                if wire.is_null(self.error.details)
                else _decode_any.decode(bytes(self.error.details)),
            }
            out["retryable"] = self.retryable
            out["retry_after_ms"] = self.retry_after_ms
        return out

    def digest(self) -> bytes:
        """SHA-256 of the canonical report (keys sorted, compact)."""
        return hashlib.sha256(_encode.encode(self.canonical())).digest()

    def error_object(self) -> dict[str, Any] | None:
        """The error stored on the attempt and task for a ``fail``."""
        if self.error is None:
            return None
        out: dict[str, Any] = {"type": self.error.type, "message": self.error.message}
        if not wire.is_null(self.error.details):
            out["details"] = _decode_any.decode(bytes(self.error.details))
        out["retryable"] = self.retryable
        return out


# -- locking ---------------------------------------------------------------------------------


async def now_in_tx(tx: Tx, now: datetime | None) -> datetime:
    """``now`` when pinned (tests), else the database clock."""
    return now if now is not None else await clock_now(tx)


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


async def _reselect(tx: Tx, namespace_id: bytes, task_id: bytes) -> Row:
    row = await store.task_get(tx, namespace_id, task_id)
    assert row is not None
    return row


def _is_current(task: Mapping[str, Any], attempt: Mapping[str, Any]) -> bool:
    """The attempt is the task's running generation."""
    return (
        attempt["state"] == "RUNNING"
        and task["state"] == "RUNNING"
        and task["current_attempt_id"] == attempt["id"]
        and int(task["attempts"]) == int(attempt["generation"])
    )


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
    after = await _reselect(tx, namespace_id, task["id"])
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
    error = {"type": "attempt_lost", "reason": reason, "generation": int(attempt["generation"])}
    finished = await store.attempt_finish_if_running(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt["id"],
            "state": "LOST",
            "now": now,
            "result": None,
            "error": _error_json(error),
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
    if not _is_current(task, attempt):
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
    available_at = now + _ms(backoff_ms(task, attempts)) if state == "WAITING" else None
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
    after = await _reselect(tx, namespace_id, task["id"])
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


async def _authorise_resources(
    tx: Tx,
    namespace_id: bytes,
    task: Row,
    attempt: Row,
    now: datetime,
    *,
    budget: permits.StartBudget,
) -> permits.Decision:
    """Resource checks of the start transaction, after every other check passed:
    application quota, start-rate windows, queue permits and the concurrency key, judged by
    ``budget`` (:mod:`pulse.permits`), which counts the grants made earlier in the same
    batch (the usage rows are only updated, with the summed deltas, at the end). Returns the
    :class:`~pulse.permits.Decision`: a deny reason, or the grant with its concurrency token
    (keyed tasks; the key permit row is written here). ``now`` is ``budget.now``."""
    assert now == budget.now
    return await budget.authorise(tx, task, attempt)


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
    transaction (group commit, :mod:`pulse.batcher`); one reply per item, in order.

    The hot rows are locked once for the batch, in the lock order: the owners' application
    rows and the queues' usage rows (each sorted), then every task, then every attempt (each
    in id order). Each item is then judged alone, exactly as :func:`start` judges it; the
    granted ones are written with one round trip of guarded per-row UPDATEs, the usage
    counters change once per (queue, owner) with the summed deltas, and every raw event is
    written with one INSERT. Items about a task another item of the batch already touched
    are applied in a following transaction (so each sees the other's result).
    """
    if not items:
        return []
    replies: list[wire.Started | wire.StartDenied | None] = [None] * len(items)

    async def tx_fn(tx: Tx) -> tuple[list[wire.Started | wire.StartDenied | None], list[int]]:
        out: list[wire.Started | wire.StartDenied | None] = [None] * len(items)
        deferred: list[int] = []
        peeks = await store.attempt_peek_many(tx, namespace_id, [aid for _, aid in items])
        if not peeks:
            return [_denied(id_hex(aid), DENY_NOT_FOUND) for _, aid in items], []
        queue_ids = {p["queue_id"] for p in peeks.values()}
        owner_ids = {p["owner_id"] for p in peeks.values()}
        keyed = any(p["concurrency_key_digest"] is not None for p in peeks.values())
        # The usage rows first, always (the lock order; one statement that also tells
        # whether a start limit is in play): a limit is judged on them, and the summed
        # deltas go into them at the end. A keyed task's permit row comes last.
        # The locks (usage rows, tasks, attempts: the lock order) and the reads the judgement
        # needs, in ONE round trip (Tx.pipeline: the same statements in the same order).
        usage, tasks, locked, sessions, queues = await tx.pipeline(
            transitions.lock_usage(tx, namespace_id, queue_ids, owner_ids)
            if keyed
            else store.usage_lock_for_start(tx, namespace_id, list(queue_ids), list(owner_ids)),
            store.task_lock_many(tx, namespace_id, [p["task_id"] for p in peeks.values()]),
            store.attempt_lock_many(tx, namespace_id, list(peeks), now),
            store.session_state_many(tx, namespace_id, [sid for sid, _ in items]),
            store.queue_start_context_many(tx, namespace_id, queue_ids, queue_store.NAMESPACE_GATE),
        )
        limited: bool = True if keyed else usage
        t = now if now is not None else next(iter(locked.values()))["db_now"] if locked else None
        changes: list[Change] = []
        attempt_rows: list[dict[str, Any]] = []  # the granted starts' writes, one per table
        task_rows: list[dict[str, Any]] = []
        granted: list[tuple[int, Row, Row, str, datetime, int | None]] = []
        pending: dict[tuple[bytes, bytes], int] = defaultdict(int)
        budget: permits.StartBudget | None = None  # opened at the first resource check
        touched: set[bytes] = set()
        for idx, (session_id, attempt_id) in enumerate(items):
            aid = id_hex(attempt_id)
            peek = peeks.get(attempt_id)
            if peek is not None and peek["task_id"] in touched:
                deferred.append(idx)
                continue
            attempt = locked.get(attempt_id)
            task = tasks.get(peek["task_id"]) if peek is not None else None
            if attempt is None or task is None or attempt["session_id"] != session_id:
                out[idx] = _denied(aid, DENY_NOT_FOUND)
                continue
            assert t is not None
            touched.add(task["id"])
            if attempt["state"] == "RUNNING":  # a re-sent start (its `started` was lost)
                out[idx], change = await _restart(
                    tx, namespace_id, session_id, task, attempt, sessions.get(session_id), t
                )
                changes += change
                continue
            if attempt["state"] != "OFFERED":
                out[idx] = _denied(aid, DENY_NOT_OFFERED)
                continue
            deny: str | None = None
            if attempt["lease_expires_at"] <= t:
                deny = DENY_OFFER_EXPIRED
            elif not (
                task["state"] == "LEASED"
                and task["current_attempt_id"] == attempt_id
                and int(task["attempts"]) + 1 == int(attempt["generation"])
            ):
                deny = DENY_NOT_CURRENT
            else:
                session = sessions.get(session_id)
                if session is None or session["state"] != "ACTIVE" or session["expires_at"] <= t:
                    deny = DENY_SESSION
                elif queues[task["queue_id"]]["gate_closed"]:
                    deny = DENY_PAUSED
                elif task["deadline_at"] is not None and task["deadline_at"] <= t:
                    out[idx] = _denied(aid, DENY_DEADLINE)
                    changes += await _fail_deadline(tx, namespace_id, task, attempt, t)
                    continue
            concurrency_token: int | None = None
            not_before: datetime | None = None
            if deny is None:
                if budget is None:
                    budget = await permits.open_budget(
                        tx, namespace_id, tasks.values(), limited=limited, now=t
                    )
                decision = await _authorise_resources(
                    tx, namespace_id, task, attempt, t, budget=budget
                )
                deny, concurrency_token = decision.deny, decision.token
                not_before = decision.not_before
            if deny is not None:
                out[idx] = _denied(aid, deny)
                changes += await release_offer(
                    tx, namespace_id, task, attempt, t, deny, available_at=not_before
                )
                continue
            lease = t + _ms(int(queues[task["queue_id"]]["lease_ms"]))
            token = "ext_" + new_secret()
            attempt_rows.append({
                "id": attempt_id, "token_digest": digest(token),
                "concurrency_token": concurrency_token, "lease_expires_at": lease,
                "revision": attempt["revision"],
            })  # fmt: skip
            task_rows.append({
                "id": task["id"], "attempt_id": attempt_id, "generation": attempt["generation"],
                "lease_expires_at": lease, "revision": task["revision"],
            })  # fmt: skip
            pending[(task["queue_id"], task["owner_id"])] += 1
            granted.append((idx, task, attempt, token, lease, concurrency_token))
        if granted:
            for idx, task, attempt, token, lease, concurrency_token in granted:
                generation = int(attempt["generation"])
                # The row as task_start_if_leased left it (computed, not re-read: every
                # column it sets is known here, and the row is locked).
                after = {
                    **task, "state": "RUNNING", "attempts": generation, "started_at": t,
                    "lease_expires_at": lease, "state_version": int(task["state_version"]) + 1,
                    "state_changed_at": t, "revision": int(task["revision"]) + 1,
                }  # fmt: skip
                out[idx] = wire.Started(
                    ref_msg_id=None,
                    attempt_id=id_hex(attempt["id"]),
                    execution_token=token,
                    generation=generation,
                    concurrency_token=concurrency_token,
                    lease_expires_at=format_time(lease),
                )
                data = {"session_id": id_hex(items[idx][0]), "generation": generation}
                changes.append((after, transitions.EVENT_STARTED, data))
        # The writes in ONE round trip: each table's guarded UPDATE for every granted start
        # in ONE statement (each row's own guard and values by id; the matched count must be
        # the number of rows: they are locked), then the summed usage deltas, the permit
        # budget, the events — in that order.
        statements = (
            [store.attempts_start_statement(namespace_id, attempt_rows, t),
             store.tasks_start_statement(namespace_id, task_rows, t)]
            if task_rows
            else []
        )  # fmt: skip
        counts, *_ = await tx.pipeline(
            tx.execute_batch(statements),
            *(
                transitions.adjust_usage(
                    tx, namespace_id, queue_id, reservations=-n, active=n, owner_id=owner_id
                )
                for (queue_id, owner_id), n in sorted(pending.items())
            ),
            *([budget.flush(tx)] if budget is not None else []),
            transitions.record_many(tx, namespace_id, changes, now=t),
        )
        if counts != [len(task_rows)] * len(counts):  # pragma: no cover - every row is locked
            raise Conflict("attempt or task changed while locked", kind="start")
        return out, deferred

    done, deferred = await db.transaction(tx_fn)
    for idx, reply in enumerate(done):
        replies[idx] = reply
    if deferred:
        again = await start_many(db, namespace_id, [items[i] for i in deferred], now=now)
        for idx, reply in zip(deferred, again, strict=True):
            replies[idx] = reply
    assert all(r is not None for r in replies)
    return replies  # type: ignore[return-value]


def _denied(attempt_hex: str, reason: str) -> wire.StartDenied:
    return wire.StartDenied(ref_msg_id=None, attempt_id=attempt_hex, reason=reason)


#: Raw event of a re-sent ``start`` that rotated a running attempt's execution token.
EVENT_START_RESENT = "task.start_resent"


async def _restart(
    tx: Tx,
    namespace_id: bytes,
    session_id: bytes,
    task: Row,
    attempt: Row,
    session: Row | None,
    now: datetime,
) -> tuple[wire.Started | wire.StartDenied, list[Change]]:
    """A ``start`` for an attempt that is already RUNNING, from the session that holds it
    (the caller checked the session): the ``started`` reply was lost in transit, so the
    worker cannot know its token. When the session is active, the attempt is the task's
    current generation and its lease has not passed, a NEW execution token replaces the old
    one (the old one answers ``stale_token`` from now on) and ``started`` is answered again
    with the same generation, concurrency token (no permit is granted again) and lease.
    Raw event ``task.start_resent`` records it. Otherwise: ``session_inactive`` or
    ``already_started`` (its lease passed or the task moved on: recovery decides)."""
    aid = id_hex(attempt["id"])
    if session is None or session["state"] != "ACTIVE" or session["expires_at"] <= now:
        return _denied(aid, DENY_SESSION), []
    if not _is_current(task, attempt) or attempt["lease_expires_at"] <= now:
        return _denied(aid, DENY_ALREADY_STARTED), []
    token = "ext_" + new_secret()
    ok = await store.attempt_rotate_token_if_running(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt["id"],
            "session_id": session_id,
            "token_digest": digest(token),
            "now": now,
            "revision": attempt["revision"],
        },
    )
    if not ok:  # pragma: no cover - the attempt row is locked
        raise Conflict("attempt changed while locked", kind="start")
    generation = int(attempt["generation"])
    concurrency = attempt["concurrency_token"]
    reply = wire.Started(
        ref_msg_id=None,
        attempt_id=aid,
        execution_token=token,
        generation=generation,
        concurrency_token=None if concurrency is None else int(concurrency),
        lease_expires_at=format_time(attempt["lease_expires_at"]),
    )
    data = {"session_id": id_hex(session_id), "generation": generation, "token_rotated": True}
    return reply, [(task, EVENT_START_RESENT, data)]


async def _fail_deadline(
    tx: Tx, namespace_id: bytes, task: Row, attempt: Row, now: datetime
) -> list[Change]:
    """The deadline passed before the start: the offer is released and the task FAILED."""
    await store.attempt_release_if_offered(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt["id"],
            "now": now,
            "error": _error_json({"type": "released", "reason": DENY_DEADLINE}),
            "revision": attempt["revision"],
        },
    )
    ok = await store.task_fail_if_leased(
        tx,
        {
            "namespace_id": namespace_id,
            "id": task["id"],
            "attempt_id": attempt["id"],
            "error": _error_json(DEADLINE_ERROR),
            "now": now,
            "revision": task["revision"],
        },
    )
    if not ok:  # pragma: no cover - the task row is locked
        raise Conflict("task changed while locked", kind="task_state")
    await transitions.adjust_usage(
        tx,
        namespace_id,
        task["queue_id"],
        unfinished=-1,
        reservations=-1,
        owner_id=task["owner_id"],
    )
    after = await _reselect(tx, namespace_id, task["id"])
    data = {"reason": "deadline_exceeded", "released_attempt_id": id_hex(attempt["id"])}
    return [(after, transitions.EVENT_FAILED, data)]


# -- heartbeat -------------------------------------------------------------------------------


class SessionGone(Exception):
    """The session is no longer ACTIVE (expired or closed): its stream must end."""


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
    session is not ACTIVE any more.
    """
    parsed = [(text, _parse_hex(text)) for text in attempt_ids]
    wanted = sorted({raw for _, raw in parsed if raw is not None})

    async def run(tx: Tx) -> HeartbeatResult:
        session = await session_store.session_lock(tx, namespace_id, session_id)
        t = await now_in_tx(tx, now)
        if session is None or session["state"] != "ACTIVE" or session["expires_at"] <= t:
            raise SessionGone()
        expires = t + _ms(int(session["lease_ms"]))
        await session_store.session_extend_if_active(tx, namespace_id, session_id, expires, t)
        await session_store.instance_touch(tx, namespace_id, session["instance_id"], t)
        views = await store.attempt_heartbeat_view(tx, namespace_id, wanted)
        answers: dict[bytes, wire.HeartbeatAttempt] = {}
        cancels: list[str] = []
        # Running attempts to extend: (attempt id, view, new lease, cancel flag). Their
        # guarded UPDATEs (task, then attempt, in attempt-id order) go in one round trip.
        extend: list[tuple[bytes, Row, datetime, bool]] = []
        statements: list[tuple[str, Any]] = []
        for raw in wanted:
            v = views.get(raw)
            hexid = id_hex(raw)
            if v is None or v["session_id"] != session_id:
                answers[raw] = wire.HeartbeatAttempt(
                    attempt_id=hexid, ok=False, lease_expires_at=None, cancel_requested=False
                )
                continue
            cancel = bool(v["cancel_requested"]) and v["current_attempt_id"] == raw
            live = v["lease_expires_at"] > t
            if (
                v["state"] == "RUNNING"
                and live
                and v["task_state"] == "RUNNING"
                and v["current_attempt_id"] == raw
            ):
                lease = t + _ms(int(v["lease_ms"]))
                params = {
                    "namespace_id": namespace_id,
                    "id": v["task_id"],
                    "attempt_id": raw,
                    "session_id": session_id,
                    "lease_expires_at": lease,
                    "now": t,
                }
                statements.append((store.Q.task_heartbeat_if_running, params))
                statements.append((store.Q.attempt_heartbeat_if_running, {**params, "id": raw}))
                extend.append((raw, v, lease, cancel))
            elif v["state"] == "OFFERED" and live:
                answers[raw] = wire.HeartbeatAttempt(
                    attempt_id=hexid,
                    ok=True,
                    lease_expires_at=format_time(v["lease_expires_at"]),
                    cancel_requested=False,
                )
            else:
                answers[raw] = wire.HeartbeatAttempt(
                    attempt_id=hexid,
                    ok=False,
                    lease_expires_at=format_time(v["lease_expires_at"]),
                    cancel_requested=cancel,
                )
        counts = await tx.execute_batch(statements)
        for k, (raw, v, lease, cancel) in enumerate(extend):
            task_ok, attempt_ok = counts[2 * k] == 1, counts[2 * k + 1] == 1
            if task_ok != attempt_ok:  # pragma: no cover - every writer changes both at once
                raise Conflict("task and attempt leases diverged", kind="heartbeat")
            answers[raw] = wire.HeartbeatAttempt(
                attempt_id=id_hex(raw),
                ok=task_ok,
                lease_expires_at=format_time(lease if task_ok else v["lease_expires_at"]),
                cancel_requested=cancel,
            )
            if task_ok and cancel:
                cancels.append(id_hex(raw))
        out: list[wire.HeartbeatAttempt] = []
        for text, raw in parsed:
            if raw is None:
                out.append(
                    wire.HeartbeatAttempt(
                        attempt_id=text, ok=False, lease_expires_at=None, cancel_requested=False
                    )
                )
            else:
                out.append(answers[raw])
        reply = wire.HeartbeatOk(
            ref_msg_id=None, attempts=out, session_expires_at=format_time(expires)
        )
        return HeartbeatResult(reply=reply, cancel_requested=cancels)

    return await db.transaction(run)


def _parse_hex(text: str) -> bytes | None:
    return parse_id(text)


# -- result reports --------------------------------------------------------------------------


@dataclass
class _Late:
    """A correct token for an attempt that is no longer current: evidence was recorded.
    ``applied``: the operation of the report already applied to it, when one was."""

    attempt_state: str
    applied: str | None = None


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
    """:func:`report` for many reports of one namespace in ONE transaction (group commit,
    :mod:`pulse.batcher`); per item, in order, its receipt or the exception :func:`report`
    would raise (a stale token fails only its own item).

    Lock order (docs/invariants.md#5-compare-and-swap): the owners' application rows and the
    queues' usage rows once per batch (sorted), then the tasks, then the attempts (each in id
    order). Each item keeps all of :func:`report`'s checks (token,
    receipt replay, lease, current generation); the applied ones are written with one round
    trip of guarded per-row UPDATEs, one of receipts, usage counters once per (queue, owner)
    with the summed deltas, and their raw and result events with one INSERT each and ONE
    range of result sequence numbers. Items about a task another item already touched in
    the batch (e.g. the same report re-sent) go in a following transaction, so they see it.
    """
    if not reports:
        return []
    digests: list[bytes] = []
    unreadable: dict[int, Exception] = {}
    for idx, rep in enumerate(reports):
        try:
            digests.append(rep.digest())
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # not JSON: only this one
            digests.append(b"")
            unreadable[idx] = InvalidRequest(f"the report is not valid JSON: {exc}")

    async def tx_fn(tx: Tx) -> tuple[list[wire.Receipt | _Late | Exception | None], list[int]]:
        out: list[wire.Receipt | _Late | Exception | None] = [None] * len(reports)
        deferred: list[int] = []
        peeks = await store.attempt_peek_many(tx, namespace_id, [r.attempt_id for r in reports])
        if not peeks:
            return [AttemptNotFound() for _ in reports], []
        # The lock order (docs/invariants.md#5-compare-and-swap): the owners' application rows
        # and the queues' usage rows first (sorted; their ids were peeked without locks and never change), then
        # the tasks, then the attempts. The counters are updated at the end with the summed
        # deltas, on rows this transaction already holds.
        # ONE round trip (Tx.pipeline: the same statements in the same order). The receipts
        # are read for the peeked attempts: rows of attempts that are not locked (gone) are
        # never looked at.
        _, tasks, locked, receipts = await tx.pipeline(
            transitions.lock_usage(
                tx,
                namespace_id,
                {p["queue_id"] for p in peeks.values()},
                {p["owner_id"] for p in peeks.values()},
            ),
            store.task_lock_many(tx, namespace_id, [p["task_id"] for p in peeks.values()]),
            store.attempt_lock_many(tx, namespace_id, list(peeks), now),
            store.receipt_get_many(tx, namespace_id, list(peeks)),
        )
        t = now if now is not None else next(iter(locked.values()))["db_now"] if locked else None
        changes: list[Change] = []
        statements: list[tuple[str, Any]] = []
        receipt_rows: list[tuple[str, Any]] = []
        usage: dict[tuple[bytes, bytes], list[int]] = defaultdict(lambda: [0, 0, 0])
        applied: list[tuple[int, Row, str, str, dict[str, Any], bytes]] = []  # after-rows
        touched: set[bytes] = set()
        for idx, rep in enumerate(reports):
            aid = id_hex(rep.attempt_id)
            if idx in unreadable:
                out[idx] = unreadable[idx]
                continue
            peek = peeks.get(rep.attempt_id)
            if peek is not None and peek["task_id"] in touched:
                deferred.append(idx)
                continue
            attempt = locked.get(rep.attempt_id)
            task = tasks.get(peek["task_id"]) if peek is not None else None
            if attempt is None or task is None:
                out[idx] = AttemptNotFound()
                continue
            assert t is not None
            stored = attempt["execution_token_digest"]
            if stored is None or not digest_matches(rep.execution_token, stored):
                out[idx] = StaleToken(attempt_id=aid)
                continue
            receipt = receipts.get(rep.attempt_id)
            if receipt is not None:
                if receipt["operation"] == rep.op and receipt["request_digest"] == digests[idx]:
                    out[idx] = wire.Receipt(
                        ref_msg_id=None,
                        attempt_id=aid,
                        receipt_id=id_hex(receipt["id"]),
                        outcome="replayed",
                        task_state=receipt["task_state"],
                    )
                else:
                    # The token's attempt already ended with another report: the token is
                    # stale for any other outcome. Kept as evidence, the task is untouched.
                    reason = "report_already_applied"
                    await _record_late(tx, namespace_id, rep, attempt, digests[idx], t, reason)
                    out[idx] = _Late(attempt_state=attempt["state"], applied=receipt["operation"])
                continue
            touched.add(task["id"])
            reason = "attempt_not_current"
            if _is_current(task, attempt) and attempt["lease_expires_at"] <= t:
                # The lease passed and recovery has not run yet: decide as recovery would.
                changes += await lose_running(tx, namespace_id, task, attempt, t, "lease_expired")
                attempt = {**attempt, "state": "LOST"}
                reason = "lease_expired"
            if not _is_current(task, attempt):
                await _record_late(tx, namespace_id, rep, attempt, digests[idx], t, reason)
                out[idx] = _Late(attempt_state=attempt["state"])
                continue
            if rep.op == "cancelled" and not task["cancel_requested"]:
                out[idx] = Conflict(
                    "no cancel was requested for this attempt's task",
                    kind="not_cancel_requested",
                    attempt_id=aid,
                )
                continue
            plan = _plan_report(namespace_id, task, attempt, rep, t)
            statements += plan.statements
            delta = usage[(task["queue_id"], task["owner_id"])]
            for i, d in enumerate(transitions.usage_delta("RUNNING", plan.state)):
                delta[i] += d
            receipt_id = new_id()
            receipt_rows.append((
                store.Q.receipt_insert,
                {
                    "namespace_id": namespace_id, "id": receipt_id, "attempt_id": rep.attempt_id,
                    "operation": rep.op, "request_digest": digests[idx],
                    "task_state": plan.state, "now": t,
                },
            ))  # fmt: skip
            applied.append((idx, plan.after, plan.state, plan.event, plan.data, receipt_id))
        for idx, after, state, event, data, receipt_id in applied:
            changes.append((after, event, data))
            out[idx] = wire.Receipt(
                ref_msg_id=None,
                attempt_id=id_hex(reports[idx].attempt_id),
                receipt_id=id_hex(receipt_id),
                outcome="applied",
                task_state=state,
            )
        # The writes in ONE round trip (then the result events' INSERT): the guarded per-row
        # UPDATEs, the summed usage deltas, the ended attempts' key permits (last in the lock
        # order, pulse.permits), the receipts, the events — in that order, as one by one.
        writes: list[Coroutine[Any, Any, Any]] = [tx.execute_batch(statements)]
        writes += [
            transitions.adjust_usage(tx, namespace_id, queue_id, unfinished=unfinished,
                                     reservations=reservations, active=active, owner_id=owner_id)
            for (queue_id, owner_id), (unfinished, reservations, active) in sorted(usage.items())
        ]  # fmt: skip
        if applied:
            ended = [(reports[i].attempt_id, after.get("concurrency_key_digest"))
                     for i, after, *_ in applied]  # fmt: skip
            writes.append(permits.release_many(tx, namespace_id, ended, t))
        writes.append(tx.execute_batch(receipt_rows))
        writes.append(transitions.record_many(tx, namespace_id, changes, now=t))
        counts, *_ = await tx.pipeline(*writes)
        if any(c != 1 for c in counts):  # pragma: no cover - every row is locked
            raise Conflict("attempt or task changed while locked", kind="report")
        return out, deferred

    done, deferred = await db.transaction(tx_fn)
    outcomes: list[wire.Receipt | Exception | None] = [None] * len(reports)
    for idx, value in enumerate(done):
        if isinstance(value, _Late):
            extra = {} if value.applied is None else {"applied": value.applied}
            outcomes[idx] = StaleToken(
                "the attempt is no longer current; the report was recorded as evidence"
                if value.applied is None
                else f"a different report ({value.applied}) was already applied to this"
                " attempt; this one was recorded as evidence",
                attempt_id=id_hex(reports[idx].attempt_id),
                attempt_state=value.attempt_state,
                evidence=True,
                **extra,
            )
        else:
            outcomes[idx] = value
    if deferred:
        again = await report_many(db, namespace_id, [reports[i] for i in deferred], now=now)
        for idx, value in zip(deferred, again, strict=True):
            outcomes[idx] = value
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


async def _record_late(
    tx: Tx,
    namespace_id: bytes,
    rep: Report,
    attempt: Row,
    request_digest: bytes,
    now: datetime,
    reason: str,
) -> None:
    kind = "late_" + rep.op
    hexdigest = request_digest.hex()
    if await store.evidence_exists(
        tx, namespace_id, attempt["task_id"], rep.attempt_id, kind, hexdigest
    ):
        return
    data: dict[str, Any] = {
        "request_digest": hexdigest,
        "reason": reason,
        "attempt_state": attempt["state"],
        "generation": int(attempt["generation"]),
    }
    if rep.op == "fail":
        data["error"] = rep.error_object()
        data["retry_after_ms"] = rep.retry_after_ms
    await store.evidence_insert(
        tx,
        {
            "namespace_id": namespace_id,
            "id": new_id(),
            "attempt_id": rep.attempt_id,
            "task_id": attempt["task_id"],
            "kind": kind,
            "result": _json_text(rep.result) if rep.op == "complete" else None,
            "data": _error_json(data),
            "now": now,
        },
    )


@dataclass
class _ReportPlan:
    """What applying a report to its current attempt writes (see :func:`_plan_report`)."""

    state: str  # the task's new state
    event: str  # its raw event type
    data: dict[str, Any]  # the raw event's data
    statements: list[tuple[str, Any]]  # attempt finish + task end-run, guarded, by key
    after: Row  # the task row as the end-run UPDATE leaves it (computed, not re-read)


def _plan_report(
    namespace_id: bytes, task: Row, attempt: Row, rep: Report, now: datetime
) -> _ReportPlan:
    """The outcome of a report on the current attempt (pure): the task's new state and the
    two guarded UPDATEs — attempt RUNNING → its end state, task RUNNING → the new state."""
    result_text: str | None = None
    error: dict[str, Any] | None = None
    available_at: datetime | None = None
    if rep.op == "complete":
        attempt_state = state = "SUCCEEDED"
        result_text = _json_text(rep.result or wire.NULL)
        event = transitions.EVENT_SUCCEEDED
    elif rep.op == "fail":
        attempt_state = "FAILED"
        error = rep.error_object()
        attempts = int(task["attempts"])
        if task["cancel_requested"]:
            state = "CANCELLED" if rep.retryable else "FAILED"
        elif rep.retryable and attempts < int(task["max_attempts"]):
            state = "WAITING"
            available_at = now + _ms(backoff_ms(task, attempts, rep.retry_after_ms))
        else:
            state = "FAILED"
        event = {
            "WAITING": transitions.EVENT_RETRY_SCHEDULED,
            "FAILED": transitions.EVENT_FAILED,
            "CANCELLED": transitions.EVENT_CANCELLED,
        }[state]
    else:
        attempt_state = state = "CANCELLED"
        error = {"type": "cancelled", "message": "cancelled on request; the worker stopped"}
        event = transitions.EVENT_CANCELLED
    error_text = _error_json(error)
    finish = {
        "namespace_id": namespace_id,
        "id": attempt["id"],
        "state": attempt_state,
        "now": now,
        "result": result_text,
        "error": error_text,
        "retryable": int(rep.retryable) if rep.op == "fail" else None,
        "revision": attempt["revision"],
    }
    end_run = {
        "namespace_id": namespace_id,
        "id": task["id"],
        "attempt_id": attempt["id"],
        "state": state,
        "result": result_text,
        "error": error_text,
        "finished_at": now if state in transitions.TERMINAL_STATES else None,
        "available_at": available_at,
        "effect_uncertain": 0,
        "now": now,
        "revision": task["revision"],
    }
    data: dict[str, Any] = {"attempt_id": id_hex(attempt["id"]), "report": rep.op}
    if available_at is not None:
        data["available_at"] = format_time(available_at)
    after = {
        **task,
        "state": state,
        "result": result_text,
        "error": error_text,
        "finished_at": end_run["finished_at"],
        "available_at": available_at if available_at is not None else task["available_at"],
        "effect_uncertain": 0,
        "current_attempt_id": None,
        "session_id": None,
        "lease_expires_at": None,
        "cancel_requested": 0,
        "state_version": int(task["state_version"]) + 1,
        "state_changed_at": now,
        "revision": int(task["revision"]) + 1,
    }
    return _ReportPlan(
        state=state,
        event=event,
        data=data,
        after=after,
        statements=[
            (store.Q.attempt_finish_if_running, finish),
            (store.Q.task_end_run_if_running, end_run),
        ],
    )


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
