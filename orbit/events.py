"""Raw events and result events: the platform interface every state change writes through.

Two kinds of record, both immutable (triggers reject UPDATE and DELETE):

* **Raw events** (``orbit_events``): one row per state change (task accepted, leased, started,
  schedule fired, workflow advanced…). :func:`append_event` / :func:`append_events` write them
  inside the caller's transaction.
* **Result events** (``orbit_result_events``): frozen task snapshots for SUCCEEDED, FAILED,
  CANCELLED and NEEDS_REVIEW, numbered by a per-namespace sequence. :func:`append_result_events`
  takes a *range* of sequence numbers with one statement on ``orbit_event_streams`` and must
  be called **last** in the caller's transaction: the stream row stays locked until COMMIT,
  which is what makes the sequence gap-free and committed in order (a reader that has seen
  seq n has seen every seq < n), and holding it briefly is what keeps throughput.

Every function takes the caller's open :class:`~orbit.storage.Tx`; none commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx
from orbit.storage.literals import insert_values
from orbit.store import events as store
from orbit.times import format_opt, format_time

#: Task state → result event type (docs/api/admin.md#result-events).
RESULT_EVENT_TYPES: dict[str, str] = {
    "SUCCEEDED": "task.succeeded",
    "FAILED": "task.failed",
    "CANCELLED": "task.cancelled",
    "NEEDS_REVIEW": "task.needs_review",
}

_JSON = msgspec.json.Encoder()


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A raw event to append. ``data`` is JSON-encodable (use 32-hex strings for ids)."""

    type: str
    subject_kind: str
    subject_id: bytes | None = None
    data: Any = msgspec.field(default_factory=dict)
    request_id: str | None = None


class ResultSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The frozen task snapshot a result event stores (docs/api/admin.md#result-events).

    ``result`` and ``error`` are each None, pre-encoded JSON *text* (``str``, ``bytes`` or
    ``msgspec.Raw``, stored and returned byte for byte), or any other JSON-encodable object
    (a dict, list, number…), which is encoded here. A plain message must therefore be passed
    encoded (``'"boom"'``) or wrapped (``{"message": "boom"}``).
    ``event_id`` is generated when None. ``state`` must be a key of RESULT_EVENT_TYPES.
    """

    task_id: bytes
    queue: str
    kind: str | None
    owner_id: bytes
    state: str
    result: Any = None
    error: Any = None
    attempts: int = 0
    finished_at: datetime | None = None
    event_id: bytes | None = None


class ResultEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A stored result event (ids as bytes, ``result``/``error`` as JSON text or None)."""

    seq: int
    event_id: bytes
    type: str
    created_at: datetime
    task_id: bytes
    queue: str
    kind: str | None
    owner_id: bytes
    state: str
    result: str | None
    error: str | None
    attempts: int
    finished_at: datetime | None

    def to_wire(self) -> ResultEventOut:
        """The API object (``/events`` items and a delivery's ``event``)."""
        return ResultEventOut(
            seq=self.seq,
            event_id=id_hex(self.event_id),
            type=self.type,
            created_at=format_time(self.created_at),
            task_id=id_hex(self.task_id),
            queue=self.queue,
            kind=self.kind,
            owner_id=id_hex(self.owner_id),
            state=self.state,
            result=None if self.result is None else msgspec.Raw(self.result.encode()),
            error=None if self.error is None else msgspec.Raw(self.error.encode()),
            attempts=self.attempts,
            finished_at=format_opt(self.finished_at),
        )


class ResultEventOut(msgspec.Struct, frozen=True, kw_only=True):
    """Wire form of a result event: ``result`` and ``error`` are JSON values, not strings."""

    seq: int
    event_id: str
    type: str
    created_at: str
    task_id: str
    queue: str
    kind: str | None
    owner_id: str
    state: str
    result: msgspec.Raw | None
    error: msgspec.Raw | None
    attempts: int
    finished_at: str | None


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, msgspec.Raw):
        return bytes(value).decode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    if isinstance(value, str):
        return value
    return _JSON.encode(value).decode()


async def append_event(
    tx: Tx,
    namespace_id: bytes,
    type: str,
    subject_kind: str,
    subject_id: bytes | None,
    data: Any = None,
    request_id: str | None = None,
    *,
    now: datetime | None = None,
) -> bytes:
    """Append one raw event in the caller's transaction; return its id.

    ``now`` None stamps the database clock.
    """
    event_id = new_id()
    await store.event_insert(
        tx,
        {
            "namespace_id": namespace_id,
            "id": event_id,
            "type": type,
            "subject_kind": subject_kind,
            "subject_id": subject_id,
            "data": _JSON.encode({} if data is None else data).decode(),
            "request_id": request_id,
            "created_at": now,
        },
    )
    return event_id


async def append_events(
    tx: Tx, namespace_id: bytes, events: Sequence[NewEvent], *, now: datetime | None = None
) -> list[bytes]:
    """Append many raw events with one multi-row INSERT; return their ids in order."""
    return await append_events_across(tx, [(namespace_id, e) for e in events], now=now)


#: The column list of ``event_insert_many`` (orbit/sql/events.sql), for
#: :func:`append_events_bulk`: the statement up to VALUES, without comments.
_BULK_HEAD = (
    "\n".join(
        line
        for line in store.Q.event_insert_many.splitlines()
        if not line.lstrip().startswith("--")
    )
    .split("VALUES")[0]
    .strip()
    + "\nVALUES"
)
_BULK_COLUMNS = tuple(
    c.strip() for c in _BULK_HEAD[_BULK_HEAD.index("(") + 1 : _BULK_HEAD.index(")")].split(",")
)


async def append_events_bulk(
    tx: Tx, namespace_id: bytes, events: Sequence[NewEvent], *, now: datetime
) -> list[bytes]:
    """:func:`append_events` for big batches (batch submit): the same multi-row INSERT with
    its values rendered as memoised SQL literals (orbit/storage/literals.py) rather than
    escaped by the driver one parameter at a time. ``now`` is required (naive UTC). Events
    whose ``data`` is the same object share one encoding (do not mutate it meanwhile)."""
    if not events:
        return []
    # Events sharing one data object (a batch passes one per queue) encode it once.
    encoded: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    for e in events:
        text = encoded.get(id(e.data))
        if text is None:
            text = encoded[id(e.data)] = _JSON.encode(e.data).decode()
        rows.append(
            {
                "namespace_id": namespace_id,
                "id": new_id(),
                "type": e.type,
                "subject_kind": e.subject_kind,
                "subject_id": e.subject_id,
                "data": text,
                "request_id": e.request_id,
                "created_at": now,
            }
        )
    await tx.execute(insert_values(_BULK_HEAD, _BULK_COLUMNS, rows))
    return [r["id"] for r in rows]


async def append_result_events(
    tx: Tx,
    namespace_id: bytes,
    snapshots: Sequence[ResultSnapshot],
    *,
    now: datetime | None = None,
) -> list[int]:
    """Append result events for ``snapshots``; return their sequence numbers, in order.

    Takes ``len(snapshots)`` consecutive numbers with ONE upsert on the namespace's
    ``orbit_event_streams`` row (created at the first event), then inserts the snapshots with
    one multi-row INSERT. Call it LAST in the transaction: the stream row is locked from here
    to COMMIT. Raises ValueError for a state without a result event type.
    """
    return await append_result_events_across(
        tx, [(namespace_id, s) for s in snapshots], now=now
    )


async def append_events_across(
    tx: Tx, events: Sequence[tuple[bytes, NewEvent]], *, now: datetime | None = None
) -> list[bytes]:
    """:func:`append_events` for events of several namespaces (a node round): ONE multi-row
    INSERT, each row with its own namespace; their ids, in order."""
    if not events:
        return []
    stamp = now or await store.clock_now(tx)
    rows = [
        {
            "namespace_id": ns,
            "id": new_id(),
            "type": e.type,
            "subject_kind": e.subject_kind,
            "subject_id": e.subject_id,
            "data": _JSON.encode(e.data).decode(),
            "request_id": e.request_id,
            "created_at": stamp,
        }
        for ns, e in events
    ]
    await store.event_insert_many(tx, rows)
    return [r["id"] for r in rows]


async def append_result_events_across(
    tx: Tx,
    snapshots: Sequence[tuple[bytes, ResultSnapshot]],
    *,
    now: datetime | None = None,
) -> list[int]:
    """:func:`append_result_events` for several namespaces (a node round): ONE upsert takes
    each namespace's numbers on its stream row (rows in namespace order: the last level of
    the lock order, held to COMMIT), one read gets the new tops, one multi-row INSERT writes
    the events. Per namespace the numbers are consecutive in the order of ``snapshots``;
    returns each snapshot's seq, in order."""
    if not snapshots:
        return []
    counts: dict[bytes, int] = {}
    for ns, s in snapshots:
        if s.state not in RESULT_EVENT_TYPES:
            raise ValueError(f"no result event for task state {s.state!r}")
        counts[ns] = counts.get(ns, 0) + 1
    tops, stamp = await store.event_streams_advance_many(tx, counts, now)
    next_seq = {ns: tops[ns] - n + 1 for ns, n in counts.items()}
    rows = []
    for ns, s in snapshots:
        seq = next_seq[ns]
        next_seq[ns] = seq + 1
        rows.append(
            {
                "namespace_id": ns,
                "seq": seq,
                "event_id": s.event_id or new_id(),
                "type": RESULT_EVENT_TYPES[s.state],
                "task_id": s.task_id,
                "queue": s.queue,
                "kind": s.kind,
                "owner_id": s.owner_id,
                "state": s.state,
                "result": _json_text(s.result),
                "error": _json_text(s.error),
                "attempts": s.attempts,
                "finished_at": s.finished_at,
                "created_at": stamp,
            }
        )
    await store.result_event_insert_many(tx, rows)
    return [r["seq"] for r in rows]


def _result_event(row: dict[str, Any]) -> ResultEvent:
    return ResultEvent(
        seq=int(row["seq"]),
        event_id=bytes(row["event_id"]),
        type=row["type"],
        created_at=row["created_at"],
        task_id=bytes(row["task_id"]),
        queue=row["queue"],
        kind=row["kind"],
        owner_id=bytes(row["owner_id"]),
        state=row["state"],
        result=row["result"],
        error=row["error"],
        attempts=int(row["attempts"]),
        finished_at=row["finished_at"],
    )


async def read_result_events(
    tx: Tx, namespace_id: bytes, after_seq: int, limit: int
) -> list[ResultEvent]:
    """Result events with ``seq > after_seq`` in sequence order, at most ``limit``."""
    rows = await store.result_event_list_after(tx, namespace_id, after_seq, limit)
    return [_result_event(r) for r in rows]


async def list_result_events(
    db: Database, namespace_id: bytes, after_seq: int = 0, limit: int = 50
) -> list[ResultEvent]:
    """Read result events in their own read-only transaction (see :func:`read_result_events`)."""

    async def run(tx: Tx) -> list[ResultEvent]:
        return await read_result_events(tx, namespace_id, after_seq, limit)

    return await db.read(run)


async def last_result_seq(tx: Tx, namespace_id: bytes) -> int:
    """The highest committed result event seq of the namespace (0 when none)."""
    return await store.result_event_last_seq(tx, namespace_id)


async def list_subject_events(
    tx: Tx, namespace_id: bytes, subject_kind: str, subject_id: bytes, limit: int = 100
) -> list[dict[str, Any]]:
    """Raw events of one subject, oldest first (for history views and tests)."""
    return await store.event_list_for_subject(tx, namespace_id, subject_kind, subject_id, limit)
