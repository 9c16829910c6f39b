"""The items of a submit before and after the transaction: decoding and validation
(:func:`prepare`: 400 naming the field, before any transaction), each item's result
(:class:`ItemResult`) and a request's answer (:class:`Submitted`). Pure: no database.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from orbit.business_json import check_json_text
from orbit.errors import InvalidRequest, OrbitError
from orbit.http.body import field_of
from orbit.idempotency import Reply
from orbit.times import parse_time
from pulse import transitions
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


#: The earliest ``available_at`` a submit may give.
EARLIEST_AVAILABLE_AT = datetime(1970, 1, 1)


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
    if available_at is not None and available_at < EARLIEST_AVAILABLE_AT:
        # A time that far back means "now" anyway, and the dispatch order (available_at
        # minus 30 s per priority step) would leave the range of times.
        raise InvalidRequest(
            "available_at must not be before 1970-01-01T00:00:00Z", field="available_at"
        )
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
