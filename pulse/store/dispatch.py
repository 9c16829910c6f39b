"""SQL of dispatch (``pulse/sql/dispatch.sql``): the node dispatch round's look, locks and
claim, and the usage rows locked first (with the limits offers are capped by) and the
reservation counters of the submit's offer.

Every function runs one query on the caller's open :class:`~orbit.storage.Tx`. The claim
locks what it returns (``FOR UPDATE SKIP LOCKED``: rows another transaction holds are
skipped, never waited for).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries
from orbit.storage.keys import KeySet, expand
from pulse.store.queues import Q as queue_queries

Q = load_queries(__file__, "dispatch")

Row = dict[str, Any]


async def usage_lock_with_limits(
    tx: Tx, namespace_id: bytes, queue_ids: Sequence[bytes], app_ids: Sequence[bytes]
) -> tuple[dict[bytes, Row], dict[bytes, Row]]:
    """Lock the applications' resources rows then the queues' usage rows (each sorted; ONE
    statement, the lock order's first two steps); return (application rows by id, queue
    usage rows by queue id). Application rows carry ``max_reservations`` and
    ``max_active_attempts``, queue rows ``max_concurrency`` (None = unlimited), besides the
    usage counters. Missing rows are absent. Both id lists must be non-empty (with no
    application, use :func:`pulse.transitions.lock_usage`)."""
    apps = tuple(sorted(set(app_ids)))
    queues = tuple(sorted(set(queue_ids)))
    assert apps and queues, "usage_lock_with_limits needs applications and queues"
    rows = await tx.fetchall(
        Q.usage_lock_with_limits,
        {"namespace_id": namespace_id, "app_ids": apps, "queue_ids": queues},
    )
    by_app: dict[bytes, Row] = {}
    by_queue: dict[bytes, Row] = {}
    for row in rows:
        (by_app if row["kind"] == "a" else by_queue)[bytes(row["id"])] = row
    return by_app, by_queue


# -- the node dispatch round (pulse/dispatch_round.py) --------------------------------------

#: A (namespace id, queue id) pair.
QueueKey = tuple[bytes, bytes]


#: Steps of the look's first round trip for a queue not seen before (a queue seen before: as
#: many as the subjects it had); a walk not done by then goes on in a next round trip with
#: at least twice as many steps as it has done (a few round trips for 128 subjects).
LOOK_FIRST_STEPS = 1


def _body(sql: str) -> str:
    """A named query without its leading comment lines (to embed it in another statement)."""
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


_DIVE = _body(Q.round_look_dive)
_TOP = _body(Q.round_look_top)
_WALKED = _body(Q.round_look_walked)


async def round_look(
    tx: Tx,
    queues: Sequence[tuple[QueueKey, bytes | None]],
    max_subjects: int,
    now: datetime | None,
    expect: Mapping[QueueKey, int] | None = None,
) -> list[Row]:
    """The fairness subjects with WAITING tasks of each queue (``(queue, after)``: the walk
    starts after ``after``, None: from the first), at most ``max_subjects`` per queue, each
    with its first task's ``owner_id``, ``first_dispatch_at``, ``first_available_at``, its
    position ``n`` in the walk and ``db_now`` (no lock).

    A skip scan of ``ix_pulse_tasks_fair``, one index dive per subject: a round trip sends
    one SET statement per step but the last (every queue still walking dives once, after
    the subject its step before found, read from a user variable: a constant for that
    statement, so the dive is a range) and one SELECT of what the steps found, with the last
    step's dives and each queue's last subject (the walk is done when it reaches it).
    ``expect`` (subjects per queue at the last look) sizes the first round trip, so a walk
    as long as the last one takes one round trip (one statement for a queue of one subject
    or none); a longer one goes on in the next."""
    todo: dict[QueueKey, tuple[bytes | None, int, int]] = {}  # after, done, steps this trip
    for qk, after in sorted(queues, key=lambda x: x[0]):
        first = (expect or {}).get(qk, LOOK_FIRST_STEPS)
        todo[qk] = (after, 0, max(1, min(max_subjects, first)))
    out: list[Row] = []
    while todo:
        order = list(todo)
        sets: list[tuple[str, Any]] = []
        walked: list[str] = []
        wargs: list[Any] = []
        for step in range(1, max(steps for _, _, steps in todo.values()) + 1):
            parts: list[str] = []
            args: list[Any] = []
            for i, qk in enumerate(order):
                after, done, steps = todo[qk]
                if step > steps:
                    continue
                if step > 1:
                    bound, extra = f"AND x.fair_subject > @pulse_look_{i}_{step - 1}", []
                elif after is not None:
                    bound, extra = "AND x.fair_subject > %s", [after]
                else:
                    bound, extra = "", []
                dive = _DIVE.replace("/*after*/", bound)
                var = f"@pulse_look_{i}_{step}"
                if step < steps:
                    parts.append(f"{var} = {dive}")
                    args += [qk[0], qk[1], *extra]
                    walked.append(_WALKED.replace("/*subject*/", var).replace("/*top*/", "NULL"))
                    wargs += [qk[0], qk[1], done + step]
                else:
                    walked.append(_WALKED.replace("/*subject*/", dive).replace("/*top*/", _TOP))
                    wargs += [qk[0], qk[1], qk[0], qk[1], *extra, done + step, qk[0], qk[1]]
            if parts:
                sets.append(("SET " + ",\n".join(parts), args))
        sql = _body(Q.round_look).replace("/*walked*/", "\n  UNION ALL\n".join(walked))
        if sets:
            _, rows = await tx.pipeline(tx.execute_batch(sets), tx.fetchall(sql, [now, *wargs]))
        else:
            rows = await tx.fetchall(sql, [now, *wargs])
        out += rows
        going: dict[QueueKey, tuple[bytes | None, int, int]] = {}
        for r in rows:
            qk = (bytes(r["namespace_id"]), bytes(r["queue_id"]))
            _, done, steps = todo[qk]
            n = int(r["n"])
            subject = bytes(r["subject"])
            last = n == done + steps and r["top"] is not None
            # The batch's last step found a subject that is not the queue's last: go on.
            if last and n < max_subjects and bytes(r["top"]) != subject:
                going[qk] = (subject, n, min(max_subjects - n, max(2 * n, 4)))
        todo = going
    out.sort(key=lambda r: (bytes(r["namespace_id"]), bytes(r["queue_id"]), int(r["n"])))
    return out


async def round_sessions_lock(tx: Tx, keys: KeySet, now: datetime | None) -> list[Row]:
    """Lock the sessions (in (namespace, id) order) with their held counts and ``db_now``."""
    sql, args = expand(Q.round_sessions_lock, keys, now)
    return await tx.fetchall(sql, args)


async def round_gates(tx: Tx, keys: KeySet) -> dict[QueueKey, bool]:
    """``paused`` of the gates named by ``keys`` ((namespace, queue id or the namespace gate's
    zero id)); a gate without a row is open."""
    sql, args = expand(Q.round_gates, keys)
    rows = await tx.fetchall(sql, args)
    return {(bytes(r["namespace_id"]), bytes(r["queue_id"])): bool(r["paused"]) for r in rows}


async def round_usage_lock(
    tx: Tx, queues: KeySet, app_ids: Sequence[bytes]
) -> tuple[dict[bytes, Row], dict[QueueKey, Row]]:
    """Lock the owners' application rows (sorted) then the queues' usage rows (sorted by
    namespace, queue) in ONE statement, with their limits: (applications by id, queues by
    (namespace, queue id))."""
    apps = sorted(set(app_ids))
    sql = Q.round_usage_lock.replace("/*apps*/", ", ".join(["%s"] * len(apps)) if apps else "NULL")
    sql, args = expand(sql, queues, *apps)
    by_app: dict[bytes, Row] = {}
    by_queue: dict[QueueKey, Row] = {}
    for row in await tx.fetchall(sql, args):
        if row["kind"] == "a":
            by_app[bytes(row["id"])] = row
        else:
            by_queue[(bytes(row["namespace_id"]), bytes(row["id"]))] = row
    return by_app, by_queue


#: One part of a round's claim: (namespace id, queue id, fairness subject, keys_ok, limit).
ClaimPart = tuple[bytes, bytes, bytes, bool, int]


async def round_claim(tx: Tx, parts: Sequence[ClaimPart], now: datetime) -> list[Row]:
    """Lock the due tasks of every part (each its subject's, in dispatch order, at most its
    limit; ``FOR UPDATE SKIP LOCKED``) in ONE statement; rows in part order."""
    if not parts:
        return []
    args: list[Any] = []
    for ns, q, subject, keys_ok, limit in parts:
        args += [ns, q, subject, now, now, now, int(keys_ok), limit]
    sql = "\nUNION ALL\n".join([Q.round_claim_part] * len(parts))
    return await tx.fetchall(sql, args)


def reservation_statements(
    namespace_id: bytes, per_owner: Mapping[bytes, int], per_queue: Mapping[bytes, int]
) -> list[tuple[str, Any]]:
    """The statements that add freshly offered attempts to the reservations of their owners'
    resources rows, then of their queues' usage rows (each sorted: the lock order), for
    :meth:`~orbit.storage.Tx.execute_batch`. The rows must be locked by the transaction
    already (the owners' quota guard cannot refuse what was judged on them)."""
    out: list[tuple[str, Any]] = [
        (Q.application_reservations_add_within_limit, {"application_id": owner, "n": n})
        for owner, n in sorted(per_owner.items())
    ]
    out += [
        (
            queue_queries.usage_add,
            {"namespace_id": namespace_id, "queue_id": queue_id, "unfinished": 0,
             "reservations": n, "active": 0},
        )
        for queue_id, n in sorted(per_queue.items())
    ]  # fmt: skip
    return out
