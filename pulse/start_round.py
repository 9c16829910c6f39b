"""The start round: every ``start`` that reached this node while the previous round ran, for
every namespace, authorised in ONE transaction (two-step dispatch, step 2).

The round locks, level by level across all its namespaces (the lock order; each level
sorted): the owners' application rows, then the queues' usage rows, then every task, then
every attempt — one statement per level (:mod:`pulse.store.rounds`), every statement with
one ``namespace_id`` group per namespace. Each item is then judged alone, exactly as a
single start is (:func:`pulse.attempts.start` documents the checks); the granted ones are
written with ONE guarded UPDATE per table for the whole round (each row its own guard and
values; the matched count must be the number of rows), the usage deltas with one UPDATE per
table, concurrency-key permits (the last level, per namespace in key order), and every raw
event with one INSERT. Items about a task another item of the round already touched go in a
following transaction, so each sees the other's result.

Rare paths (a denied start releasing its offer, a deadline that passed, a re-sent start)
write their own rows with per-row statements inside the same transaction: their rows are
locked already.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.errors import Conflict
from orbit.ids import digest, id_hex, new_secret
from orbit.storage import Database, Tx
from orbit.storage.keys import KeySet
from orbit.times import format_time
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
    Row,
    _error_json,
    is_current,
    ms,
)
from pulse.attempts import (
    Change,
    release_offer,
    reselect,
)
from pulse.store import attempts as attempt_store
from pulse.store import queues as queue_store
from pulse.store import rounds as store

#: One start of a round: (namespace id, session id, attempt id).
StartItem = tuple[bytes, bytes, bytes]
StartReply = wire.Started | wire.StartDenied


async def start_round(
    db: Database, items: Sequence[StartItem], *, now: datetime | None = None
) -> list[StartReply]:
    """Authorise ``items`` (of any namespaces) in one transaction; one reply per item, in
    order (see the module docstring)."""
    if not items:
        return []
    replies: list[StartReply | None] = [None] * len(items)
    done, deferred = await db.transaction(lambda tx: _round(tx, items, now))
    for idx, reply in enumerate(done):
        replies[idx] = reply
    if deferred:
        again = await start_round(db, [items[i] for i in deferred], now=now)
        for idx, reply in zip(deferred, again, strict=True):
            replies[idx] = reply
    assert all(r is not None for r in replies)
    return replies  # type: ignore[return-value]


def _denied(attempt_hex: str, reason: str) -> wire.StartDenied:
    return wire.StartDenied(ref_msg_id=None, attempt_id=attempt_hex, reason=reason)


async def _round(
    tx: Tx, items: Sequence[StartItem], now: datetime | None
) -> tuple[list[StartReply | None], list[int]]:
    out: list[StartReply | None] = [None] * len(items)
    deferred: list[int] = []
    peeks = await store.attempt_peek_keys(tx, KeySet((ns, aid) for ns, _, aid in items))
    if not peeks:
        return [_denied(id_hex(aid), DENY_NOT_FOUND) for _, _, aid in items], []
    queue_keys = KeySet((k[0], p["queue_id"]) for k, p in peeks.items())
    owners = {p["owner_id"] for p in peeks.values()}
    keyed_ns = {k[0] for k, p in peeks.items() if p["concurrency_key_digest"] is not None}
    # The locks, level by level across every namespace of the round (application rows, queue
    # usage rows, tasks, attempts: the lock order), and the reads the judgement needs, in
    # ONE round trip (Tx.pipeline: the same statements in the same order).
    (app_limited, queue_limited), tasks, locked, sessions, queues = await tx.pipeline(
        store.usage_lock_for_start_keys(tx, queue_keys, sorted(owners)),
        store.task_lock_keys(tx, KeySet((k[0], p["task_id"]) for k, p in peeks.items())),
        store.attempt_lock_keys(tx, KeySet(peeks), now),
        store.session_state_keys(tx, KeySet((ns, sid) for ns, sid, _ in items)),
        store.queue_start_context_keys(tx, queue_keys, queue_store.NAMESPACE_GATE),
    )
    # A namespace's starts are judged against their limits when one of its queues or owners
    # limits starts, or one of its tasks is keyed (its key row is locked, last).
    limited_ns = set(keyed_ns)
    limited_ns |= {ns for (ns, _), limited in queue_limited.items() if limited}
    limited_owners = {a for a, limited in app_limited.items() if limited}
    limited_ns |= {k[0] for k, p in peeks.items() if p["owner_id"] in limited_owners}
    t = now if now is not None else next(iter(locked.values()))["db_now"] if locked else None
    changes: list[transitions.NsChange] = []
    attempt_rows: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    task_rows: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    granted: list[tuple[int, bytes, Row, Row, str, datetime, int | None]] = []
    app_deltas: dict[bytes, list[int]] = defaultdict(lambda: [0, 0, 0])
    queue_deltas: dict[tuple[bytes, bytes], list[int]] = defaultdict(lambda: [0, 0, 0])
    # The start budgets, one per namespace, opened before any item is judged and in
    # namespace order: a budget locks its namespace's concurrency-key rows (the permit
    # level, after every attempt), so two rounds always take them in the same order.
    share = permits.ApplicationShare()
    budgets: dict[bytes, permits.StartBudget] = {}
    if t is not None:
        for ns in sorted({k[0] for k in tasks}):
            budgets[ns] = await permits.open_budget(
                tx,
                ns,
                [r for (n, _), r in tasks.items() if n == ns],
                limited=ns in limited_ns,
                now=t,
                share=share,
            )
    touched: set[bytes] = set()
    for idx, (ns, session_id, attempt_id) in enumerate(items):
        aid = id_hex(attempt_id)
        peek = peeks.get((ns, attempt_id))
        if peek is not None and peek["task_id"] in touched:
            deferred.append(idx)
            continue
        attempt = locked.get((ns, attempt_id))
        task = tasks.get((ns, peek["task_id"])) if peek is not None else None
        if attempt is None or task is None or attempt["session_id"] != session_id:
            out[idx] = _denied(aid, DENY_NOT_FOUND)
            continue
        assert t is not None
        touched.add(task["id"])
        session = sessions.get((ns, session_id))
        if attempt["state"] == "RUNNING":  # a re-sent start (its `started` was lost)
            out[idx], change = await restart(tx, ns, session_id, task, attempt, session, t)
            changes += [(ns, c) for c in change]
            continue
        if attempt["state"] != "OFFERED":
            out[idx] = _denied(aid, DENY_NOT_OFFERED)
            continue
        deny: str | None = None
        queue = queues[(ns, task["queue_id"])]
        if attempt["lease_expires_at"] <= t:
            deny = DENY_OFFER_EXPIRED
        elif not (
            task["state"] == "LEASED"
            and task["current_attempt_id"] == attempt_id
            and int(task["attempts"]) + 1 == int(attempt["generation"])
        ):
            deny = DENY_NOT_CURRENT
        elif session is None or session["state"] != "ACTIVE" or session["expires_at"] <= t:
            deny = DENY_SESSION
        elif queue["gate_closed"]:
            deny = DENY_PAUSED
        elif task["deadline_at"] is not None and task["deadline_at"] <= t:
            out[idx] = _denied(aid, DENY_DEADLINE)
            changes += [(ns, c) for c in await fail_deadline(tx, ns, task, attempt, t)]
            continue
        concurrency_token: int | None = None
        not_before: datetime | None = None
        if deny is None:
            decision = await budgets[ns].authorise(tx, task, attempt)
            deny, concurrency_token = decision.deny, decision.token
            not_before = decision.not_before
        if deny is not None:
            out[idx] = _denied(aid, deny)
            released = await release_offer(tx, ns, task, attempt, t, deny, available_at=not_before)
            changes += [(ns, c) for c in released]
            continue
        lease = t + ms(int(queue["lease_ms"]))
        token = "ext_" + new_secret()
        attempt_rows[(ns, attempt_id)] = {
            "token_digest": digest(token), "concurrency_token": concurrency_token,
            "lease_expires_at": lease, "revision": attempt["revision"],
        }  # fmt: skip
        task_rows[(ns, task["id"])] = {
            "attempt_id": attempt_id, "generation": attempt["generation"],
            "lease_expires_at": lease, "revision": task["revision"],
        }  # fmt: skip
        app_deltas[task["owner_id"]][1] -= 1
        app_deltas[task["owner_id"]][2] += 1
        queue_deltas[(ns, task["queue_id"])][1] -= 1
        queue_deltas[(ns, task["queue_id"])][2] += 1
        granted.append((idx, ns, task, attempt, token, lease, concurrency_token))
    for idx, ns, task, attempt, token, lease, concurrency_token in granted:
        generation = int(attempt["generation"])
        # The row as the start UPDATE leaves it (computed, not re-read: every column it sets
        # is known here, and the row is locked).
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
        data = {"session_id": id_hex(items[idx][1]), "generation": generation}
        changes.append((ns, (after, transitions.EVENT_STARTED, data)))
    # The writes in ONE round trip: each table's guarded UPDATE for every granted start of
    # every namespace in ONE statement (the matched count must be the number of rows: they
    # are locked), then the summed usage deltas, the permit budgets, the events.
    assert t is not None
    statements = (
        [store.attempts_start_statement(attempt_rows, t), store.tasks_start_statement(task_rows, t)]
        if task_rows
        else []
    )
    usage = queue_store.usage_add_statements(
        {a: (d[0], d[1], d[2]) for a, d in app_deltas.items()},
        {q: (d[0], d[1], d[2]) for q, d in queue_deltas.items()},
    )
    counts, _, *_ = await tx.pipeline(
        tx.execute_batch(statements),
        tx.execute_batch(usage),
        *(budgets[ns].flush(tx) for ns in sorted(budgets)),
        transitions.record_across(tx, changes, now=t),
    )
    if counts != [len(task_rows)] * len(counts):  # pragma: no cover - every row is locked
        raise Conflict("attempt or task changed while locked", kind="start")
    return out, deferred


#: Raw event of a re-sent ``start`` that rotated a running attempt's execution token.
EVENT_START_RESENT = "task.start_resent"


async def restart(
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
    if not is_current(task, attempt) or attempt["lease_expires_at"] <= now:
        return _denied(aid, DENY_ALREADY_STARTED), []
    token = "ext_" + new_secret()
    ok = await attempt_store.attempt_rotate_token_if_running(
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


async def fail_deadline(
    tx: Tx, namespace_id: bytes, task: Row, attempt: Row, now: datetime
) -> list[Change]:
    """The deadline passed before the start: the offer is released and the task FAILED."""
    await attempt_store.attempt_release_if_offered(
        tx,
        {
            "namespace_id": namespace_id,
            "id": attempt["id"],
            "now": now,
            "error": _error_json({"type": "released", "reason": DENY_DEADLINE}),
            "revision": attempt["revision"],
        },
    )
    ok = await attempt_store.task_fail_if_leased(
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
    after = await reselect(tx, namespace_id, task["id"])
    data = {"reason": "deadline_exceeded", "released_attempt_id": id_hex(attempt["id"])}
    return [(after, transitions.EVENT_FAILED, data)]
