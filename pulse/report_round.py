"""The report round: every result report (``complete``, ``fail``, ``cancelled``) that reached
this node while the previous round ran, for every namespace, applied in ONE transaction.

Lock order, level by level across all the round's namespaces (each level sorted): the
owners' application rows and the queues' usage rows, then the tasks, then the attempts
(:mod:`pulse.store.rounds`: one statement per level, one ``namespace_id`` group per
namespace in each). Each item keeps every check of a single report (token, receipt replay,
lease, current generation — :func:`pulse.attempts.report` documents them); the applied ones
are written with ONE guarded UPDATE of their attempts (the receipt is a part of the attempt
row) and ONE of their tasks for the whole round (each row its own guard and values; the
matched count must be the number of rows), the summed usage deltas (one UPDATE per table), the
ended attempts' key permits (the permit level, per namespace in order), and their raw and
result events (one INSERT each; one upsert of the namespaces' stream rows, last). Items
about a task another item already touched (e.g. the same report re-sent) go in a following
transaction, so they see it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orbit.errors import Conflict, InvalidRequest, StaleToken
from orbit.ids import digest_matches, id_hex, new_id
from orbit.storage import Database, Tx
from orbit.storage.keys import KeySet
from pulse import permits, transitions, wire
from pulse.attempt_rules import Report, Row, _error_json, _json_text, is_current, plan_report
from pulse.attempts import lose_running
from pulse.errors import AttemptNotFound
from pulse.store import attempts as attempt_store
from pulse.store import queues as queue_store
from pulse.store import rounds as store

#: One report of a round: (namespace id, report).
ReportItem = tuple[bytes, Report]
ReportOutcome = wire.Receipt | Exception


class _Late:
    """A correct token for an attempt that is no longer current: evidence was recorded.
    ``applied``: the operation of the report already applied to it, when one was."""

    __slots__ = ("applied", "attempt_state")

    def __init__(self, attempt_state: str, applied: str | None = None) -> None:
        self.attempt_state = attempt_state
        self.applied = applied


async def report_round(
    db: Database, items: Sequence[ReportItem], *, now: datetime | None = None
) -> list[ReportOutcome]:
    """Apply ``items`` (of any namespaces) in one transaction; per item, in order, its receipt
    or the exception a single report would raise (a stale token fails only its own item)."""
    if not items:
        return []
    digests: list[bytes] = []
    unreadable: dict[int, Exception] = {}
    for idx, (_, rep) in enumerate(items):
        try:
            rep.check()
            digests.append(rep.digest())
        except InvalidRequest as exc:  # not business JSON: only this one fails
            digests.append(b"")
            unreadable[idx] = exc
    done, deferred = await db.transaction(lambda tx: _round(tx, items, digests, unreadable, now))
    outcomes: list[ReportOutcome | None] = [None] * len(items)
    for idx, value in enumerate(done):
        if isinstance(value, _Late):
            extra = {} if value.applied is None else {"applied": value.applied}
            outcomes[idx] = StaleToken(
                "the attempt is no longer current; the report was recorded as evidence"
                if value.applied is None
                else f"a different report ({value.applied}) was already applied to this"
                " attempt; this one was recorded as evidence",
                attempt_id=id_hex(items[idx][1].attempt_id),
                attempt_state=value.attempt_state,
                evidence=True,
                **extra,
            )
        else:
            outcomes[idx] = value
    if deferred:
        again = await report_round(db, [items[i] for i in deferred], now=now)
        for idx, value in zip(deferred, again, strict=True):
            outcomes[idx] = value
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


async def _round(
    tx: Tx,
    items: Sequence[ReportItem],
    digests: list[bytes],
    unreadable: dict[int, Exception],
    now: datetime | None,
) -> tuple[list[ReportOutcome | _Late | None], list[int]]:
    out: list[ReportOutcome | _Late | None] = [None] * len(items)
    deferred: list[int] = []
    peeks = await store.attempt_peek_keys(tx, KeySet((ns, r.attempt_id) for ns, r in items))
    if not peeks:
        return [unreadable.get(i) or AttemptNotFound() for i in range(len(items))], []
    # The lock order, level by level across the round's namespaces: application rows and
    # queue usage rows (their ids were peeked without locks and never change), the tasks,
    # the attempts (each with the receipt of its applied report, if any). ONE round trip.
    _, tasks, locked = await tx.pipeline(
        transitions.lock_usage_keys(
            tx,
            KeySet((k[0], p["queue_id"]) for k, p in peeks.items()),
            {p["owner_id"] for p in peeks.values()},
        ),
        store.task_lock_keys(tx, KeySet((k[0], p["task_id"]) for k, p in peeks.items())),
        store.attempt_lock_keys(tx, KeySet(peeks), now),
    )
    t = now if now is not None else next(iter(locked.values()))["db_now"] if locked else None
    changes: list[transitions.NsChange] = []
    attempt_rows: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    task_rows: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    app_deltas: dict[bytes, list[int]] = defaultdict(lambda: [0, 0, 0])
    queue_deltas: dict[tuple[bytes, bytes], list[int]] = defaultdict(lambda: [0, 0, 0])
    ended: dict[bytes, list[tuple[bytes, bytes | None]]] = defaultdict(list)
    touched: set[bytes] = set()
    for idx, (ns, rep) in enumerate(items):
        aid = id_hex(rep.attempt_id)
        if idx in unreadable:
            out[idx] = unreadable[idx]
            continue
        peek = peeks.get((ns, rep.attempt_id))
        if peek is not None and peek["task_id"] in touched:
            deferred.append(idx)
            continue
        attempt = locked.get((ns, rep.attempt_id))
        task = tasks.get((ns, peek["task_id"])) if peek is not None else None
        if attempt is None or task is None:
            out[idx] = AttemptNotFound()
            continue
        assert t is not None
        stored = attempt["execution_token_digest"]
        if stored is None or not digest_matches(rep.execution_token, stored):
            out[idx] = StaleToken(attempt_id=aid)
            continue
        if attempt["receipt_id"] is not None:
            if attempt["receipt_op"] == rep.op and attempt["receipt_digest"] == digests[idx]:
                out[idx] = wire.Receipt(
                    ref_msg_id=None,
                    attempt_id=aid,
                    receipt_id=id_hex(attempt["receipt_id"]),
                    outcome="replayed",
                    task_state=attempt["receipt_task_state"],
                )
            else:
                # The token's attempt already ended with another report: the token is stale
                # for any other outcome. Kept as evidence; the task is untouched.
                reason = "report_already_applied"
                await record_late(tx, ns, rep, attempt, digests[idx], t, reason)
                out[idx] = _Late(attempt["state"], applied=attempt["receipt_op"])
            continue
        touched.add(task["id"])
        reason = "attempt_not_current"
        if is_current(task, attempt) and attempt["lease_expires_at"] <= t:
            # The lease passed and recovery has not run yet: decide as recovery would.
            lost = await lose_running(tx, ns, task, attempt, t, "lease_expired")
            changes += [(ns, c) for c in lost]
            attempt = {**attempt, "state": "LOST"}
            reason = "lease_expired"
        if not is_current(task, attempt):
            await record_late(tx, ns, rep, attempt, digests[idx], t, reason)
            out[idx] = _Late(attempt["state"])
            continue
        if rep.op == "cancelled" and not task["cancel_requested"]:
            out[idx] = Conflict(
                "no cancel was requested for this attempt's task",
                kind="not_cancel_requested",
                attempt_id=aid,
            )
            continue
        plan = plan_report(ns, task, attempt, rep, t)
        receipt_id = new_id()
        attempt_rows[(ns, attempt["id"])] = {
            **plan.finish, "receipt_id": receipt_id, "receipt_op": rep.op,
            "receipt_digest": digests[idx], "receipt_task_state": plan.state,
        }  # fmt: skip
        task_rows[(ns, task["id"])] = plan.end_run
        unfinished, reservations, active = transitions.usage_delta("RUNNING", plan.state)
        for deltas, key in ((app_deltas, task["owner_id"]), (queue_deltas, (ns, task["queue_id"]))):
            d = deltas[key]  # type: ignore[index]
            d[0] += unfinished
            d[1] += reservations
            d[2] += active
        ended[ns].append((rep.attempt_id, task.get("concurrency_key_digest")))
        changes.append((ns, (plan.after, plan.event, plan.data)))
        out[idx] = wire.Receipt(
            ref_msg_id=None,
            attempt_id=aid,
            receipt_id=id_hex(receipt_id),
            outcome="applied",
            task_state=plan.state,
        )
    # The writes in ONE round trip (then the result events' INSERT): the guarded UPDATEs of
    # the attempts (with their receipts) and of the tasks (one statement each for the whole
    # round), the summed usage deltas, the ended attempts' key permits (the permit level, per
    # namespace in order), the events — in that order.
    assert t is not None or not attempt_rows
    statements = (
        [store.attempts_finish_statement(attempt_rows, t), store.tasks_end_run_statement(task_rows, t)]
        if attempt_rows and t is not None
        else []
    )
    usage = queue_store.usage_add_statements(
        {a: (d[0], d[1], d[2]) for a, d in app_deltas.items()},
        {q: (d[0], d[1], d[2]) for q, d in queue_deltas.items()},
    )
    counts, *_ = await tx.pipeline(
        tx.execute_batch(statements),
        tx.execute_batch(usage),
        *(permits.release_many(tx, ns, ended[ns], t) for ns in sorted(ended) if t is not None),
        transitions.record_across(tx, changes, now=t),
    )
    if counts != [len(attempt_rows)] * len(counts):  # pragma: no cover - every row is locked
        raise Conflict("attempt or task changed while locked", kind="report")
    return out, deferred


__all__ = ["ReportItem", "report_round"]


async def record_late(
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
    if await attempt_store.evidence_exists(
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
    await attempt_store.evidence_insert(
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
