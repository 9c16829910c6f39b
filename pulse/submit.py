"""Task submission: single and batch, one transaction per request.

Rules (docs/api/tasks.md#submit; docs/invariants.md, rules 1–3):

* The owner is the submitting credential's application; identity
  ``(owner, kind, pipeline_version, dedup_key)`` is unique per namespace when ``dedup_key``
  is set. Submitting an existing identity returns the existing task (200,
  ``deduplicated: true``). Concurrent identical submits resolve through the unique index:
  the loser's INSERT waits for the winner, gets a duplicate key, re-reads and answers the
  dedup response.
* Max attempts and the retry policy are frozen at submit — the task's own (``max_attempts``,
  ``retry``, within the queue's ``retry_bounds``: :mod:`pulse.retry_bounds`) or the queue's;
  the payload is stored as the exact bytes sent.
* Quotas: the queue's (and the owning application's) ``max_unfinished_tasks``. A refused
  single submit writes nothing (429, ``Retry-After``); in a batch the refused items get 429
  and the others commit. Usage counters change in the same transaction as the insert.
* Lock order: application resources → queue usage rows (sorted) → tasks → result stream.
  The application's row and every queue's usage row are locked first, in one statement,
  whether or not a quota is set: quotas are judged on them, two identical submits to one
  queue serialise there (the second one simply finds the first one's task), and the counts
  go into them at the end of the transaction.

:func:`submit_in_tx` is the building block other services (schedules, workflows) call
inside their own transaction; :func:`submit_batch` / :func:`submit_one` run it with the
``Idempotency-Key`` handling of :mod:`orbit.idempotency`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from datetime import datetime
from typing import Any

from orbit import events as orbit_events
from orbit.errors import OrbitError
from orbit.storage import Tx
from orbit.store.clock import clock_now
from pulse import retry_bounds, transitions
from pulse.errors import QueueNotFound, QueueQuotaExceeded
from pulse.store import queues as queue_store
from pulse.store import tasks as store
from pulse.submit_items import (
    BULK_MIN,
    MAX_BATCH,
    QUOTA_RETRY_AFTER_S,
    ItemResult,
    Submitted,
    _Prepared,
    decode_item,
    error_body,
    prepare,
    task_body,
)
from pulse.submit_rows import _as_stored, _insert, _row
from pulse.types import TaskSubmit


async def submit_in_tx(
    tx: Tx,
    namespace_id: bytes,
    owner_id: bytes,
    items: Sequence[TaskSubmit | OrbitError],
    *,
    source_kind: str = "api",
    source_id: bytes | None = None,
    source_ids: Sequence[bytes | None] | None = None,
    allowed_queues: frozenset[str] | None = None,
    request_id: str | None = None,
    request_ids: Sequence[str | None] | None = None,
    now: datetime | None = None,
) -> list[ItemResult]:
    """Submit ``items`` (already-decoded bodies, or the error an item failed to decode with)
    in the caller's transaction; return one result per item, in order.

    Writes the tasks, their ``task.accepted`` raw events and the usage counters. Quota
    refusals are counted in ``pulse_queue_usage.denials_quota`` here too. With
    ``allowed_queues`` (a key limited to some queues) an item for another queue is the same
    404 as an unknown queue. ``request_ids`` (one per item) replaces ``request_id`` on the
    items' raw events (grouped single submits, :func:`submit_singles`); ``source_ids`` (one
    per item) likewise replaces ``source_id`` (a schedule backfill: one occurrence each).
    """
    results: list[ItemResult | None] = [None] * len(items)
    prepared: list[_Prepared] = []
    texts: dict[bytes, str] = {}
    for i, item in enumerate(items):
        if isinstance(item, OrbitError):
            results[i] = ItemResult(item.status, error=item)
            continue
        try:
            prepared.append(prepare(i, item, texts))
        except OrbitError as exc:
            results[i] = ItemResult(exc.status, error=exc)

    # The queues by name (unknown → 404 per item), each with the clock: ONE round trip; a
    # clock of its own only when no queue is known.
    names = sorted({p.body.queue for p in prepared})
    found = await tx.pipeline(
        *(queue_store.queue_get_by_name_clock(tx, namespace_id, name) for name in names)
    )
    queues: dict[str, dict[str, Any]] = {
        name: row for name, (row, _) in zip(names, found, strict=True) if row is not None
    }
    clocks = [at for _, at in found if at is not None]
    stamp = now or (clocks[0] if clocks else await clock_now(tx))
    live: list[_Prepared] = []
    for p in prepared:
        allowed = allowed_queues is None or p.body.queue in allowed_queues
        if allowed and p.body.queue in queues:
            # A task's own retry policy must stay within its queue's bounds (400 per item).
            bad = retry_bounds.check(p.body, queues[p.body.queue])
            if bad is not None:
                results[p.index] = ItemResult(bad.status, error=bad)
            else:
                live.append(p)
        else:
            missing = QueueNotFound()
            results[p.index] = ItemResult(missing.status, error=missing)

    # Lock order: the application's resources row, then the queues' usage rows (sorted by
    # id), in ONE statement, before any task row: every decision (quotas, a dedup identity
    # that serialises identical submits on the queue row) reads them locked, and the counts
    # go into them at the end.
    app: dict[str, Any] | None = None
    usage: dict[bytes, dict[str, Any]] = {}
    if live:
        apps, usage = await transitions.lock_usage(
            tx, namespace_id, {queues[p.body.queue]["id"] for p in live}, [owner_id]
        )
        app = apps.get(owner_id)
        # A queue deleted after it was read above has no usage row any more: 404 like an
        # unknown queue (the delete held the row; pulse/queue_delete.py).
        for p in [p for p in live if queues[p.body.queue]["id"] not in usage]:
            missing = QueueNotFound()
            results[p.index] = ItemResult(missing.status, error=missing)
        live = [p for p in live if queues[p.body.queue]["id"] in usage]

    # Identity: existing tasks (read after the locks, so a serialised twin is visible),
    # and twins inside this batch (the later ones get the first one's task).
    identities = sorted({p.identity for p in live if p.identity is not None})
    existing = await store.task_find_identities(tx, namespace_id, owner_id, identities)
    first_of: dict[tuple[str, str, str], _Prepared] = {}
    twins: list[tuple[_Prepared, _Prepared]] = []
    fresh: list[_Prepared] = []
    for p in live:
        ident = p.identity
        if ident is not None and ident in existing:
            results[p.index] = ItemResult(200, row=existing[ident])
        elif ident is not None and ident in first_of:
            twins.append((p, first_of[ident]))
        else:
            if ident is not None:
                first_of[ident] = p
            fresh.append(p)

    # Quotas, in request order.
    admitted: list[_Prepared] = []
    per_queue: dict[bytes, int] = {}
    denied_per_queue: dict[bytes, int] = {}
    app_used = int(app["unfinished_tasks"]) if app else 0
    app_max = app["max_unfinished_tasks"] if app else None
    for p in fresh:
        q = queues[p.body.queue]
        err: OrbitError | None = None
        limit = q["max_unfinished_tasks"]
        if limit is not None and (
            int(usage[q["id"]]["unfinished_tasks"]) + per_queue.get(q["id"], 0) + 1 > int(limit)
        ):
            err = QueueQuotaExceeded("queue", int(q["max_unfinished_tasks"]), QUOTA_RETRY_AFTER_S)
            denied_per_queue[q["id"]] = denied_per_queue.get(q["id"], 0) + 1
        elif app_max is not None and app_used + 1 > int(app_max):
            err = QueueQuotaExceeded("application", int(app_max), QUOTA_RETRY_AFTER_S)
        if err is not None:
            results[p.index] = ItemResult(err.status, error=err)
            continue
        per_queue[q["id"]] = per_queue.get(q["id"], 0) + 1
        app_used += 1
        admitted.append(p)

    rows = [
        _row(
            namespace_id, owner_id, queues[p.body.queue], p, stamp, source_kind,
            source_id if source_ids is None else source_ids[p.index],
        )
        for p in admitted
    ]  # fmt: skip
    inserted = await _insert(tx, namespace_id, owner_id, admitted, rows, results)

    # The rows as stored, without reading them back (a 1000-row read of every column cost
    # about half the batch in the driver's row parser): the insert fixes every column but
    # the defaults, which _as_stored fills in. A caller-pinned clock with a time zone is the
    # one case where the stored value differs from ours (naive UTC), so that case re-reads.
    if stamp.tzinfo is None:
        fetched = {rows[k]["id"]: _as_stored(rows[k]) for k in inserted}
    else:
        fetched = await store.task_get_many(tx, namespace_id, [rows[k]["id"] for k in inserted])
    counts: dict[bytes, int] = {}
    for k in inserted:
        row = fetched[rows[k]["id"]]
        results[admitted[k].index] = ItemResult(201, row=row)
        counts[row["queue_id"]] = counts.get(row["queue_id"], 0) + 1
    for p, first in twins:
        twin = results[first.index]
        assert twin is not None
        results[p.index] = (
            ItemResult(200, row=twin.row)
            if twin.row is not None
            else ItemResult(twin.status, error=twin.error)
        )

    # Into the rows locked above: the application's, then the queues'; then the events —
    # all in ONE round trip (Tx.pipeline: the same statements in the same order).
    writes: list[Coroutine[Any, Any, Any]] = []
    if counts and app is not None:
        writes.append(queue_store.application_usage_add(tx, owner_id, sum(counts.values()), 0, 0))
    for queue_id, n in sorted(counts.items()):
        writes.append(transitions.adjust_usage(tx, namespace_id, queue_id, unfinished=n))
    for queue_id, n in sorted(denied_per_queue.items()):
        writes.append(queue_store.queue_usage_add_quota_denials(tx, namespace_id, queue_id, n))

    # One INSERT of raw events per request (a group of single submits carries one request
    # id per item; a batch request one for all).
    by_request: dict[str | None, list[tuple[dict[str, Any], str, dict[str, Any]]]] = {}
    for k in inserted:
        rid = request_ids[admitted[k].index] if request_ids is not None else request_id
        by_request.setdefault(rid, []).append(
            (fetched[rows[k]["id"]], transitions.EVENT_ACCEPTED, {"source": source_kind})
        )
    for rid, changes in by_request.items():
        if len(changes) >= BULK_MIN and stamp.tzinfo is None:
            # A new WAITING task has no result event and no terminal hook: record_many's
            # raw-event INSERT is all it would do, here with literal values (one statement).
            # The event body (record_many's) depends on the queue only: one object per queue.
            bodies: dict[str, dict[str, Any]] = {}
            events: list[orbit_events.NewEvent] = []
            for row, event_type, data in changes:
                body = bodies.get(row["queue_name"])
                if body is None:
                    body = bodies[row["queue_name"]] = transitions._raw_event_data(row, data)
                events.append(
                    orbit_events.NewEvent(
                        type=event_type,
                        subject_kind="task",
                        subject_id=row["id"],
                        data=body,
                        request_id=rid,
                    )
                )
            writes.append(orbit_events.append_events_bulk(tx, namespace_id, events, now=stamp))
        else:
            writes.append(
                transitions.record_many(tx, namespace_id, changes, request_id=rid, now=stamp)
            )
    await tx.pipeline(*writes)
    out = [r for r in results if r is not None]
    assert len(out) == len(items)
    return out


__all__ = [
    "MAX_BATCH",
    "OPERATION",
    "ItemResult",
    "SingleSubmit",
    "Submitted",
    "decode_item",
    "error_body",
    "prepare",
    "submit_batch",
    "submit_in_tx",
    "submit_one",
    "submit_round",
    "submit_singles",
    "task_body",
]

# The requests over submit_in_tx live in pulse/submit_requests.py; they are part of this
# module's interface (imported last: that module builds on the names above).
from pulse.submit_requests import (  # noqa: E402
    OPERATION,
    SingleSubmit,
    submit_batch,
    submit_one,
    submit_round,
    submit_singles,
)
