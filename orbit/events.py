"""Raw events and result events: the platform interface every state change writes through.

Two kinds of record, both immutable (triggers reject UPDATE and DELETE):

* **Raw events** (``orbit_event_batches``): every state change (task accepted, leased,
  started, schedule fired, workflow advanced…), written inside the caller's transaction by
  :func:`append_event` / :func:`append_events` / :func:`append_events_across` as ONE row per
  (transaction, namespace, event type, subject kind) listing every subject it changed, each
  entry with its own data and request id. :func:`namespace_events` and
  :func:`subject_events` read them back one entry per change (rows of ``orbit_events``,
  written before batches existed, included).
* **Result events** (``orbit_result_events``): frozen task snapshots for SUCCEEDED, FAILED,
  CANCELLED and NEEDS_REVIEW, numbered by a per-namespace sequence. :func:`append_result_events`
  takes a *range* of sequence numbers with one statement on ``orbit_event_streams`` and must
  be called **last** in the caller's transaction: the stream row stays locked until COMMIT,
  which is what makes the sequence gap-free and committed in order (a reader that has seen
  seq n has seen every seq < n), and holding it briefly is what keeps throughput.

Every function takes the caller's open :class:`~orbit.storage.Tx`; none commits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx
from orbit.store import events as store
from orbit.store.clock import clock_now
from orbit.times import format_opt, format_time

#: Task state → result event type (docs/api/admin.md#result-events).
RESULT_EVENT_TYPES: dict[str, str] = {
    "SUCCEEDED": "task.succeeded",
    "FAILED": "task.failed",
    "CANCELLED": "task.cancelled",
    "NEEDS_REVIEW": "task.needs_review",
}

_JSON = msgspec.json.Encoder()

#: This process's listeners of result streams that moved: called with the new top sequence
#: of each namespace right after the commit that appended its events (the delivery loop
#: wakes the node's consumers with it, without reading the stream rows).
_MOVED: list[Callable[[dict[bytes, int]], None]] = []


def on_streams_moved(fn: Callable[[dict[bytes, int]], None]) -> Callable[[], None]:
    """Call ``fn`` with ``{namespace id: its stream's last seq}`` of the result streams this
    process appended to, after each such commit (synchronous and quick: a wake-up).
    Returns the call that stops it."""
    _MOVED.append(fn)

    def stop() -> None:
        if fn in _MOVED:
            _MOVED.remove(fn)

    return stop


def _streams_moved(tops: dict[bytes, int]) -> None:
    for fn in list(_MOVED):
        fn(tops)


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


class RawEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded state change, as read back (:func:`namespace_events`)."""

    type: str
    subject_kind: str
    subject_id: bytes | None
    data: Any
    request_id: str | None
    created_at: datetime


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
    """Append one raw event in the caller's transaction; return the id of its batch row.

    ``now`` None stamps the database clock.
    """
    event = NewEvent(
        type=type,
        subject_kind=subject_kind,
        subject_id=subject_id,
        data={} if data is None else data,
        request_id=request_id,
    )
    (batch_id,) = await append_events_across(tx, [(namespace_id, event)], now=now)
    return batch_id


async def append_events(
    tx: Tx, namespace_id: bytes, events: Sequence[NewEvent], *, now: datetime | None = None
) -> list[bytes]:
    """Append many raw events (one batch row per event type and subject kind); return the
    batch rows' ids."""
    return await append_events_across(tx, [(namespace_id, e) for e in events], now=now)


async def append_events_bulk(
    tx: Tx, namespace_id: bytes, events: Sequence[NewEvent], *, now: datetime
) -> list[bytes]:
    """:func:`append_events` for big batches (batch submit): events sharing one ``data``
    object encode it once (do not mutate it meanwhile)."""
    return await append_events_across(tx, [(namespace_id, e) for e in events], now=now)


async def append_events_across(
    tx: Tx, events: Sequence[tuple[bytes, NewEvent]], *, now: datetime | None = None
) -> list[bytes]:
    """Append the raw events of several namespaces (a node round) with ONE multi-row INSERT:
    one batch row per (namespace, event type, subject kind), its entries in the order of
    ``events``; return the batch rows' ids (in the order their first event came)."""
    if not events:
        return []
    stamp = now or await clock_now(tx)
    groups: dict[tuple[bytes, str, str], list[bytes]] = {}
    encoded: dict[int, bytes] = {}  # one encoding per data object (a batch shares them)
    for ns, e in events:
        data = encoded.get(id(e.data))
        if data is None:
            data = encoded[id(e.data)] = _JSON.encode(e.data)
        entry = b'{"subject_id":' + (
            b'"' + e.subject_id.hex().encode() + b'"' if e.subject_id is not None else b"null"
        )
        if e.request_id is not None:
            entry += b',"request_id":' + _JSON.encode(e.request_id)
        groups.setdefault((ns, e.type, e.subject_kind), []).append(entry + b',"data":' + data + b"}")
    rows: list[dict[str, Any]] = [
        {
            "namespace_id": ns,
            "id": new_id(),
            "type": type_,
            "subject_kind": kind,
            "subjects": len(entries),
            "entries": (b"[" + b",".join(entries) + b"]").decode(),
            "created_at": stamp,
        }
        for (ns, type_, kind), entries in groups.items()
    ]
    await store.event_batch_insert_many(tx, rows)
    return [r["id"] for r in rows]


_ENTRIES = msgspec.json.Decoder(list[dict[str, Any]])


def _expand(row: dict[str, Any]) -> list[RawEvent]:
    out: list[RawEvent] = []
    for entry in _ENTRIES.decode(row["entries"]):
        subject = entry.get("subject_id")
        out.append(
            RawEvent(
                type=row["type"],
                subject_kind=row["subject_kind"],
                subject_id=bytes.fromhex(subject) if subject else None,
                data=entry.get("data", {}),
                request_id=entry.get("request_id"),
                created_at=row["created_at"],
            )
        )
    return out


def _legacy(row: dict[str, Any]) -> RawEvent:
    data = row["data"]
    return RawEvent(
        type=row["type"],
        subject_kind=row["subject_kind"],
        subject_id=row["subject_id"],
        data=msgspec.json.decode(data) if isinstance(data, str | bytes) else data,
        request_id=row["request_id"],
        created_at=row["created_at"],
    )


async def namespace_events(
    tx: Tx,
    namespace_id: bytes,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    type: str | None = None,
    limit: int = 10_000,
) -> list[RawEvent]:
    """The raw events of a namespace in the time window (``since`` inclusive, ``until``
    exclusive; None: unbounded), oldest first, one entry per change — at most ``limit``
    batch rows read. ``type`` filters by event type."""
    rows = await store.event_batch_list(tx, namespace_id, since, until, type, limit)
    legacy = await store.event_list_window(tx, namespace_id, since, until, type, limit)
    out = [e for r in rows for e in _expand(r)] + [_legacy(r) for r in legacy]
    out.sort(key=lambda e: e.created_at)  # stable: a batch keeps its entries' order
    return out


async def subject_events(
    tx: Tx,
    namespace_id: bytes,
    subject_kind: str,
    subject_id: bytes,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 10_000,
) -> list[RawEvent]:
    """The raw events of one subject in the time window, oldest first (a history view: the
    batch rows of the namespace in the window that name the subject; bound the window by
    the subject's lifetime, e.g. a task's ``created_at`` and ``finished_at``)."""
    rows = await store.event_batch_list_for_subject(
        tx, namespace_id, subject_kind, subject_id.hex(), since, until, limit
    )
    legacy = await store.event_list_for_subject(tx, namespace_id, subject_kind, subject_id, limit)
    out = [
        e for r in rows for e in _expand(r) if e.subject_id == subject_id
    ] + [_legacy(r) for r in legacy]
    out.sort(key=lambda e: e.created_at)
    return out


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    """One bounded read of a subject's history (:func:`subject_history`)."""

    #: The subject's events of the part of the window that was read, oldest first.
    events: list[RawEvent]
    #: Where the next read of the window starts (None: the window was read to its end).
    resume_at: datetime | None


#: Batch rows of a namespace one :func:`subject_history` call looks at, at most.
HISTORY_SCAN_ROWS = 1000
_MICROSECOND = timedelta(microseconds=1)


async def subject_history(
    tx: Tx,
    namespace_id: bytes,
    subject_kind: str,
    subject_id: bytes,
    *,
    since: datetime,
    until: datetime,
    scan_rows: int = HISTORY_SCAN_ROWS,
) -> HistoryPage:
    """The raw events of one subject in ``[since, until)``, oldest first, read in bounded
    steps: one call looks at no more than ``scan_rows`` batch rows of the namespace (an
    index-only scan finds where they end) and returns the subject's events before that
    point, with ``resume_at`` to continue from. A transaction's events (one ``created_at``)
    are never split between two calls; within one they keep their batch row and entry
    order. Rows of ``orbit_events`` (written before batches existed) are included."""
    end = await store.event_batch_scan_end(tx, namespace_id, since, until, scan_rows)
    if end is None:
        upper, resume = until, None
    elif end > since:
        upper, resume = end, end
    else:  # scan_rows rows share one microsecond: that moment is read whole
        upper = resume = since + _MICROSECOND
    needle = '"subject_id":"' + subject_id.hex() + '"'
    rows = await store.event_batch_list_naming(tx, namespace_id, subject_kind, needle, since, upper)
    legacy = await store.event_list_for_subject_window(
        tx, namespace_id, subject_kind, subject_id, since, upper, 10_000
    )
    out = [e for r in rows for e in _expand(r) if e.subject_id == subject_id]
    out += [_legacy(r) for r in legacy]
    out.sort(key=lambda e: e.created_at)  # stable: batch rows keep their order and entries
    if resume is not None and resume >= until:
        resume = None
    return HistoryPage(events=out, resume_at=resume)


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
    rows: list[dict[str, Any]] = []
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
    if _MOVED:
        moved = {ns: tops[ns] for ns in counts}
        tx.after_commit(lambda: _streams_moved(moved))
    return [r["seq"] for r in rows]


def result_event_from_row(row: dict[str, Any]) -> ResultEvent:
    """The :class:`ResultEvent` of an ``orbit_result_events`` row."""
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
    return [result_event_from_row(r) for r in rows]


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
