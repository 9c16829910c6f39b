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

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pymysql

from orbit import audit, idempotency
from orbit import events as orbit_events
from orbit.audit import Actor
from orbit.business_json import check_json_text, enc_hook
from orbit.errors import InvalidRequest, OrbitError
from orbit.http.body import field_of
from orbit.idempotency import IdemRequest, Reply
from orbit.ids import id_hex, new_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.storage.errors import CHECK_VIOLATED, error_code
from orbit.times import format_time, parse_time
from pulse import retry_bounds, transitions
from pulse.errors import QueueNotFound, QueueQuotaExceeded
from pulse.store import queues as queue_store
from pulse.store import tasks as store
from pulse.types import TaskSubmit

#: Retry-After (seconds) of a quota refusal.
QUOTA_RETRY_AFTER_S = 1
#: Largest batch (docs/api/conventions.md#limits).
MAX_BATCH = 1000
#: From this many rows on, the task and raw-event INSERTs carry SQL literals
#: (orbit/storage/literals.py) instead of driver-escaped parameters: a single task (submit_one,
#: schedules, workflows) keeps the plain statements.
BULK_MIN = 2


@dataclass
class ItemResult:
    """Outcome of one submitted item: 201 created, 200 deduplicated, or an error status."""

    status: int
    row: dict[str, Any] | None = None
    error: OrbitError | None = None

    @property
    def deduplicated(self) -> bool:
        return self.status == 200

    def wire(self) -> dict[str, Any]:
        """The item object of the batch response (``{"status", "task"?, "error"?}``)."""
        out: dict[str, Any] = {"status": self.status}
        if self.row is not None:
            out["task"] = task_body(self.row, deduplicated=self.deduplicated)
        if self.error is not None:
            out["error"] = error_body(self.error)
            retry_after = getattr(self.error, "retry_after", None)
            if retry_after is not None:  # a 429 item: when to send it again
                out["retry_after_ms"] = int(retry_after) * 1000
        return out


@dataclass(frozen=True)
class Submitted:
    """A submit response produced inside the transaction (stored for Idempotency-Key
    replays), plus the queues that got new tasks (to wake the dispatcher after commit)."""

    reply: Reply
    new_work: frozenset[bytes] = frozenset()
    #: Items refused by a quota (429) in a batch answer (for the conflicts metric).
    refused: int = 0

    @property
    def status(self) -> int:
        return self.reply.status

    @property
    def body(self) -> bytes:
        return self.reply.body

    @property
    def replayed(self) -> bool:
        return self.reply.replayed

    def json(self) -> Any:
        return msgspec.json.decode(self.reply.body)


def task_body(row: dict[str, Any], *, deduplicated: bool = False) -> dict[str, Any]:
    """The task object of a submit response (the task view plus ``deduplicated``)."""
    view = transitions.task_view(row)
    view["deduplicated"] = deduplicated
    return view


def error_body(err: OrbitError) -> dict[str, Any]:
    """``{"code", "message", "details"}`` of an error (the API error object)."""
    return {"code": err.code, "message": err.message, "details": err.details}


def decode_item(raw: bytes | msgspec.Raw) -> TaskSubmit:
    """Decode one task body; raise InvalidRequest naming the offending field."""
    try:
        return msgspec.json.decode(bytes(raw), type=TaskSubmit)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(str(exc), field=field_of(exc)) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from exc


@dataclass
class _Prepared:
    index: int
    body: TaskSubmit
    payload: str
    available_at: datetime | None
    delay_ms: int
    deadline_at: datetime | None
    key_digest: bytes | None

    @property
    def identity(self) -> tuple[str, str, str] | None:
        if self.body.dedup_key is None:
            return None
        return (self.body.kind, self.body.pipeline_version, self.body.dedup_key)


def _no_trailing_space(value: str | None, name: str) -> None:
    # utf8mb4_bin is a PAD SPACE collation: "a" and "a " would be the same identity.
    if value is not None and value.endswith(" "):
        raise InvalidRequest(f"{name} must not end with a space", field=name)


def prepare(index: int, body: TaskSubmit, texts: dict[bytes, str] | None = None) -> _Prepared:
    """Validate what the wire type cannot (times, payload text, identity spelling).

    ``texts`` (one dict per batch) remembers payloads already checked: equal bytes give the
    same verdict, so a batch of repeated payloads parses each distinct one once."""
    payload = bytes(body.payload)
    text = texts.get(payload) if texts is not None else None
    if text is None:
        text = check_json_text(payload, "payload")
        if texts is not None:
            texts[payload] = text
    for name in ("kind", "pipeline_version", "dedup_key"):
        _no_trailing_space(getattr(body, name), name)
    if body.available_at is not None and body.delay_ms is not None:
        raise InvalidRequest("give delay_ms or available_at, not both", field="available_at")
    available_at = _time(body.available_at, "available_at")
    deadline_at = _time(body.deadline_at, "deadline_at")
    key_digest = (
        hashlib.sha256(body.concurrency_key.encode("utf-8")).digest()
        if body.concurrency_key is not None
        else None
    )
    return _Prepared(
        index=index,
        body=body,
        payload=text,
        available_at=available_at,
        delay_ms=body.delay_ms or 0,
        deadline_at=deadline_at,
        key_digest=key_digest,
    )


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise InvalidRequest(f"{name}: {exc}", field=name) from exc


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
        except OrbitError as err:
            results[i] = ItemResult(err.status, error=err)

    # The clock and the queues by name (unknown → 404 per item): ONE round trip.
    names = sorted({p.body.queue for p in prepared})
    stamp, *found = await tx.pipeline(
        store.clock_now(tx, now),
        *(queue_store.queue_get_by_name(tx, namespace_id, name) for name in names),
    )
    queues: dict[str, dict[str, Any]] = {
        name: row for name, row in zip(names, found, strict=True) if row is not None
    }
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
            err = QueueNotFound()
            results[p.index] = ItemResult(err.status, error=err)

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
            err = QueueNotFound()
            results[p.index] = ItemResult(err.status, error=err)
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


def _row(
    namespace_id: bytes,
    owner_id: bytes,
    queue: dict[str, Any],
    p: _Prepared,
    now: datetime,
    source_kind: str,
    source_id: bytes | None,
) -> dict[str, Any]:
    b = p.body
    available = p.available_at or (now + timedelta(milliseconds=p.delay_ms))
    backoff_initial, backoff_max, backoff_multiplier = retry_bounds.effective(b, queue)
    return {
        "namespace_id": namespace_id,
        "id": new_id(),
        "owner_id": owner_id,
        "queue_id": queue["id"],
        "queue_name": queue["name"],
        "kind": b.kind,
        "pipeline_version": b.pipeline_version,
        "dedup_key": b.dedup_key,
        "payload": p.payload,
        "priority": b.priority,
        "available_at": available,
        "deadline_at": p.deadline_at,
        "max_attempts": b.max_attempts or int(queue["retry_max_attempts"]),
        "retry_backoff_initial_ms": backoff_initial,
        "retry_backoff_max_ms": backoff_max,
        "retry_backoff_multiplier": backoff_multiplier,
        "retry_safe": int(b.retry_safe),
        "concurrency_key": b.concurrency_key,
        "concurrency_key_digest": p.key_digest,
        "state": "WAITING",
        "source_kind": source_kind,
        "source_id": source_id,
        "created_at": now,
    }


class _FreshRow(dict[str, Any]):
    """A task row built by :func:`_as_stored` (a plain dict otherwise)."""

    __slots__ = ()


def _as_stored(row: dict[str, Any]) -> dict[str, Any]:
    """The ``pulse_tasks`` row (every column of ``task_columns``) a fresh insert of ``row``
    stores: the inserted values plus the schema's defaults (migrations/0002_pulse.sql) and
    the generated ``dispatch_at``. tests/integration/test_submit_batch_fast.py checks it
    against a read-back column by column."""
    out = _FreshRow(row)
    out.update(
        dispatch_at=row["available_at"] - timedelta(seconds=30 * int(row["priority"])),
        state_version=1,
        attempts=0,
        current_attempt_id=None,
        session_id=None,
        lease_expires_at=None,
        cancel_requested=0,
        effect_uncertain=0,
        result=None,
        error=None,
        resolution=None,
        stuck_at=None,
        stuck_reason=None,
        state_changed_at=row["created_at"],
        started_at=None,
        finished_at=None,
        revision=1,
    )
    return out


class _FreshViews:
    """:meth:`ItemResult.wire` for a batch answer, with the task object of a new task
    (a row from :func:`_as_stored`) built here: the same dict as
    :func:`pulse.transitions.task_view` (key order included; test_submit_batch_fast checks
    it), with each distinct time formatted once per batch (created_at, available_at and
    state_changed_at are one stamp)."""

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: dict[datetime, str] = {}

    def _fmt(self, value: datetime | None) -> str | None:
        if value is None:
            return None
        out = self._times.get(value)
        if out is None:
            out = self._times[value] = format_time(value)
        return out

    def wire(self, res: ItemResult) -> dict[str, Any]:
        row = res.row
        if res.status != 201 or row is None or not isinstance(row, _FreshRow):
            return res.wire()
        return {"status": 201, "task": self.view(row)}

    def view(self, row: dict[str, Any]) -> dict[str, Any]:
        fmt = self._fmt
        return {
            "id": id_hex(row["id"]),
            "queue": row["queue_name"],
            "owner_id": id_hex(row["owner_id"]),
            "kind": row["kind"],
            "pipeline_version": row["pipeline_version"],
            "dedup_key": row["dedup_key"],
            "state": row["state"],
            "priority": int(row["priority"]),
            "payload": transitions.raw_json(row["payload"]),
            "result": None,
            "error": None,
            "attempts": 0,
            "max_attempts": int(row["max_attempts"]),
            "effect_uncertain": False,
            "created_at": fmt(row["created_at"]),
            "available_at": fmt(row["available_at"]),
            "deadline_at": fmt(row["deadline_at"]),
            "started_at": None,
            "finished_at": None,
            "state_changed_at": fmt(row["state_changed_at"]),
            "stuck_at": None,
            "stuck_reason": None,
            "revision": 1,
            "state_version": 1,
            "cancel_requested": False,
            "concurrency_key": row["concurrency_key"],
            "retry_safe": bool(row["retry_safe"]),
            "retry": {
                "backoff_initial_ms": int(row["retry_backoff_initial_ms"]),
                "backoff_max_ms": int(row["retry_backoff_max_ms"]),
                "backoff_multiplier": float(row["retry_backoff_multiplier"]),
            },
            "resolution": None,
            "source": {
                "kind": row["source_kind"],
                "id": id_hex(row["source_id"]) if row["source_id"] is not None else None,
            },
            "deduplicated": False,
        }


async def _insert(
    tx: Tx,
    namespace_id: bytes,
    owner_id: bytes,
    admitted: list[_Prepared],
    rows: list[dict[str, Any]],
    results: list[ItemResult | None],
) -> list[int]:
    """Insert ``rows``; return the positions actually inserted.

    One multi-row INSERT first. When it fails (an identity committed meanwhile by a
    concurrent submit to another queue, or a payload the server's JSON_VALID rejects) the
    statement alone is rolled back and the rows go in one by one, each failure becoming
    that item's dedup (200) or 400.
    """
    if not rows:
        return []
    try:
        if len(rows) >= BULK_MIN and rows[0]["created_at"].tzinfo is None:
            await store.task_insert_literal(tx, rows)
        else:
            await store.task_insert_many(tx, rows)
        return list(range(len(rows)))
    except DuplicateKey as exc:
        if exc.key != store.IDENTITY_INDEX:
            raise
    except pymysql.err.OperationalError as exc:
        if error_code(exc) not in CHECK_VIOLATED:
            raise
    inserted: list[int] = []
    for k, (p, row) in enumerate(zip(admitted, rows, strict=True)):
        try:
            await store.task_insert_many(tx, [row])
            inserted.append(k)
        except DuplicateKey as exc:
            if exc.key != store.IDENTITY_INDEX or p.identity is None:
                raise
            twin = await store.task_get_by_identity(tx, namespace_id, owner_id, *p.identity)
            assert twin is not None, "a duplicate identity is committed when we see 1062"
            results[p.index] = ItemResult(200, row=twin)
        except pymysql.err.OperationalError as exc:
            if error_code(exc) not in CHECK_VIOLATED:
                raise
            err = InvalidRequest("payload is not valid JSON for the database", field="payload")
            results[p.index] = ItemResult(err.status, error=err)
    return inserted


OPERATION = "tasks.submit"


async def _perform(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    idem: IdemRequest | None,
    effect: Callable[[Tx, set[bytes], list[int]], Awaitable[tuple[int, Any]]],
    retention_s: int,
) -> Submitted:
    async def run(tx: Tx) -> Submitted:
        new_work: set[bytes] = set()
        refused: list[int] = []

        async def bound(tx: Tx) -> tuple[int, Any]:
            return await effect(tx, new_work, refused)

        reply = await idempotency.perform(
            tx, idem, namespace_id, OPERATION, id_hex(owner_id), bound, retention_s=retention_s
        )
        return Submitted(reply, frozenset(new_work), sum(refused))

    return await db.transaction(run)


async def submit_one(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    body: TaskSubmit,
    *,
    idem: IdemRequest | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    retention_s: int = idempotency.DEFAULT_RETENTION_S,
    now: datetime | None = None,
) -> Submitted:
    """Submit one task: 201 with the task, 200 with the existing task (``deduplicated``).

    Raises 400 (invalid), 404 (unknown queue), 429 (quota; nothing is written except the
    queue's denial counter, in its own transaction). With ``idem`` the response is stored
    with the effect and replayed for the same key (``Submitted.replayed``).
    """
    prepare(0, body)  # 400 before any transaction

    async def effect(tx: Tx, new_work: set[bytes], _refused: list[int]) -> tuple[int, Any]:
        [res] = await submit_in_tx(
            tx, namespace_id, owner_id, [body], request_id=request_id, now=now
        )
        if res.error is not None:
            raise res.error  # rolls back everything, the idempotency claim included
        assert res.row is not None
        if res.status == 201:
            new_work.add(res.row["queue_id"])
            await _audit(tx, actor, namespace_id, res.row["id"], 201, {}, request_id)
        return res.status, task_body(res.row, deduplicated=res.deduplicated)

    try:
        return await _perform(db, namespace_id, owner_id, idem, effect, retention_s)
    except QueueQuotaExceeded as err:
        if err.scope == "queue":
            await _count_denial(db, namespace_id, body.queue)
        raise


@dataclass(frozen=True)
class SingleSubmit:
    """One ``POST …/tasks`` without an ``Idempotency-Key``, for :func:`submit_singles`."""

    body: TaskSubmit
    actor: Actor | None = None
    request_id: str | None = None


async def submit_singles(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    items: Sequence[SingleSubmit],
    *,
    now: datetime | None = None,
) -> list[Submitted | OrbitError]:
    """Single submits of one owner that arrived together, in ONE transaction; per item, in
    order, what :func:`submit_one` would return (its :class:`Submitted`) or raise (the
    error: 400, 404, 429). The one-group form of :func:`submit_round`."""
    return await submit_round(db, [(namespace_id, owner_id, item) for item in items], now=now)


#: One single submit of a round: (namespace id, owner id, the request).
SubmitItem = tuple[bytes, bytes, "SingleSubmit"]


async def submit_round(
    db: Database, items: Sequence[SubmitItem], *, now: datetime | None = None
) -> list[Submitted | OrbitError]:
    """The single submits that reached this node while the previous round ran, of every
    namespace and owner, in ONE transaction (group commit, pulse/batcher.py); per item, in
    order, what :func:`submit_one` would return (its :class:`Submitted`) or raise (the
    error: 400, 404, 429).

    Only requests without an ``Idempotency-Key`` are grouped (a keyed request's stored
    response belongs to its own transaction). Each item is judged as it would be alone —
    quotas in arrival order, a second identical identity gets the first one's task (200) —
    and a refused item writes nothing of its own (its quota denial is counted), while the
    others commit. Each item keeps its own audit record and its events their request id.

    The round's (namespace, owner) groups run as :func:`submit_in_tx` together in one
    pipeline (:meth:`~orbit.storage.Tx.pipeline`), in (owner, namespace) order: each step of
    every group goes out in one round trip — the queue reads, then the usage locks of every
    group (application rows in id order, each followed by its namespace's queue rows: an
    application's row always comes before its namespaces' queue rows, as in every other
    transaction), then the identities, the inserts and the counters.
    """
    out: list[Submitted | OrbitError | None] = [None] * len(items)
    groups: dict[tuple[bytes, bytes], list[int]] = {}
    for i, (ns, owner, item) in enumerate(items):
        try:
            prepare(0, item.body)
        except OrbitError as err:
            out[i] = err
        else:
            groups.setdefault((owner, ns), []).append(i)
    order = sorted(groups)

    async def group(tx: Tx, owner: bytes, ns: bytes, idxs: list[int]) -> list[ItemResult]:
        return await submit_in_tx(
            tx,
            ns,
            owner,
            [items[i][2].body for i in idxs],
            request_ids=[items[i][2].request_id for i in idxs],
            now=now,
        )

    async def run(tx: Tx) -> list[tuple[int, Submitted | OrbitError]]:
        per_group = await tx.pipeline(*(group(tx, o, n, groups[(o, n)]) for o, n in order))
        answers: list[tuple[int, Submitted | OrbitError]] = []
        audits: list[Coroutine[Any, Any, None]] = []
        for key, results in zip(order, per_group, strict=True):
            ns = key[1]
            for i, res in zip(groups[key], results, strict=True):
                item = items[i][2]
                if res.error is not None:
                    answers.append((i, res.error))
                    continue
                assert res.row is not None
                work: frozenset[bytes] = frozenset()
                if res.status == 201:
                    work = frozenset({res.row["queue_id"]})
                    audits.append(_audit(tx, item.actor, ns, res.row["id"], 201, {},
                                         item.request_id))  # fmt: skip
                body = _REPLY_ENCODER.encode(task_body(res.row, deduplicated=res.deduplicated))
                answers.append((i, Submitted(Reply(res.status, body, False), work)))
        await tx.pipeline(*audits)  # every item's audit record in one round trip
        return answers

    if groups:
        for i, answer in await db.transaction(run):
            out[i] = answer
    return out  # type: ignore[return-value]


_REPLY_ENCODER = msgspec.json.Encoder(enc_hook=enc_hook)


async def _audit(
    tx: Tx,
    actor: Actor | None,
    namespace_id: bytes,
    task_id: bytes | None,
    status: int,
    details: dict[str, Any],
    request_id: str | None,
) -> None:
    if actor is None:
        return
    await audit.record(
        tx,
        actor=actor,
        action=OPERATION,
        resource_kind="task",
        resource_id=task_id,
        outcome=audit.outcome_for_status(status),
        status_code=status,
        namespace_id=namespace_id,
        request_id=request_id,
        details=details or None,
    )


async def _count_denial(db: Database, namespace_id: bytes, queue_name: str) -> None:
    async def run(tx: Tx) -> None:
        q = await queue_store.queue_get_by_name(tx, namespace_id, queue_name)
        if q is not None:
            await queue_store.queue_usage_add_quota_denials(tx, namespace_id, q["id"], 1)

    with contextlib.suppress(Exception):  # a counter must never replace the client's 429
        await db.transaction(run, retries=2)


async def submit_batch(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    items: Sequence[bytes | msgspec.Raw],
    *,
    allowed_queues: frozenset[str] | None = None,
    idem: IdemRequest | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    retention_s: int = idempotency.DEFAULT_RETENTION_S,
    now: datetime | None = None,
) -> Submitted:
    """Submit up to :data:`MAX_BATCH` raw task bodies in one transaction.

    Answers 200 with ``{"items": [{"status", "task"?, "error"?}, ...]}`` in request order;
    valid items commit together, invalid ones (400/404/429) are reported and skipped.
    """
    if len(items) > MAX_BATCH:
        raise InvalidRequest(f"at most {MAX_BATCH} tasks per batch", field="tasks")
    decoded: list[TaskSubmit | OrbitError] = []
    for raw in items:
        try:
            decoded.append(decode_item(raw))
        except OrbitError as err:
            decoded.append(err)

    async def effect(tx: Tx, new_work: set[bytes], refused: list[int]) -> tuple[int, Any]:
        results = await submit_in_tx(
            tx,
            namespace_id,
            owner_id,
            decoded,
            allowed_queues=allowed_queues,
            request_id=request_id,
            now=now,
        )
        new_work.update(r.row["queue_id"] for r in results if r.status == 201 and r.row)
        denied = [i for i, r in enumerate(results) if r.status == 429]
        refused.append(len(denied))
        created = sum(1 for r in results if r.status == 201)
        if created:
            details = {"items": len(results), "created": created}
            await _audit(tx, actor, namespace_id, None, 200, details, request_id)
        if denied:  # the per-item 429s: one conflict event for the call, naming the items
            details = {"code": "quota_exceeded", "kind": "quota_exceeded",
                       "items": len(results), "refused": denied}  # fmt: skip
            await _audit(tx, actor, namespace_id, None, 429, details, request_id)
        fresh = _FreshViews()
        return 200, {"items": [fresh.wire(r) for r in results]}

    return await _perform(db, namespace_id, owner_id, idem, effect, retention_s)


__all__ = [
    "MAX_BATCH",
    "OPERATION",
    "ItemResult",
    "Submitted",
    "decode_item",
    "error_body",
    "prepare",
    "submit_batch",
    "submit_in_tx",
    "submit_one",
    "task_body",
]
