"""The rows a submit writes: each task's row built from its item, the rows as stored
(without reading them back), the batch answer's task objects, and the INSERT with its
fallback to one row at a time (an identity that a concurrent submit committed meanwhile, a
payload the database's JSON check refuses).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orbit.errors import InvalidRequest
from orbit.ids import id_hex, new_id
from orbit.storage import CheckViolation, DuplicateKey, Tx
from orbit.times import format_time
from pulse import retry_bounds, transitions
from pulse.store import tasks as store
from pulse.submit_items import BULK_MIN, ItemResult, _Prepared


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
        "fairness_key": b.fairness_key,
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
        progress=None,
        progress_at=None,
        progress_generation=None,
    )
    out.setdefault("fairness_key", None)
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
            "fairness_key": row.get("fairness_key"),
            "retry_safe": bool(row["retry_safe"]),
            "retry": {
                "backoff_initial_ms": int(row["retry_backoff_initial_ms"]),
                "backoff_max_ms": int(row["retry_backoff_max_ms"]),
                "backoff_multiplier": float(row["retry_backoff_multiplier"]),
            },
            "resolution": None,
            "progress": None,
            "progress_at": None,
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

    The identities of the rows with a dedup key go first (pulse_task_identities, one
    multi-row INSERT), then the tasks (one multi-row INSERT), then the deadlines of the rows
    with one (pulse_task_deadlines, one multi-row INSERT). When one of the first two fails (an identity
    committed meanwhile by a concurrent submit to another queue, or a payload the server's
    JSON_VALID rejects) the failed statement alone is rolled back, the identities already
    written are taken back, and the rows go in one by one, each failure becoming that item's
    dedup (200) or 400.
    """
    if not rows:
        return []
    identities_in = False
    try:
        await store.identity_insert_many(tx, rows)
        identities_in = True
        if len(rows) >= BULK_MIN and rows[0]["created_at"].tzinfo is None:
            await store.task_insert_literal(tx, rows)
        else:
            await store.task_insert_many(tx, rows)
        await store.deadline_insert_many(tx, rows)
        return list(range(len(rows)))
    except DuplicateKey:
        if identities_in:  # the tasks' own primary key: not an identity
            raise
    except CheckViolation:
        pass
    if identities_in:
        for row in rows:
            await store.identity_delete(tx, row)
    inserted: list[int] = []
    for k, (p, row) in enumerate(zip(admitted, rows, strict=True)):
        try:
            await store.identity_insert_many(tx, [row])
        except DuplicateKey:
            if p.identity is None:
                raise
            twin = await store.task_get_by_identity(tx, namespace_id, owner_id, *p.identity)
            assert twin is not None, "a duplicate identity is committed when we see 1062"
            results[p.index] = ItemResult(200, row=twin)
            continue
        try:
            await store.task_insert_many(tx, [row])
            await store.deadline_insert_many(tx, [row])
            inserted.append(k)
        except CheckViolation:
            await store.identity_delete(tx, row)
            err = InvalidRequest("payload is not valid JSON for the database", field="payload")
            results[p.index] = ItemResult(err.status, error=err)
    return inserted
