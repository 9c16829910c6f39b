"""Audit events: who (credential, application) did what (action) to which resource, with
what outcome, when, under which request id. Immutable (triggers reject UPDATE and DELETE).

* Successful state changes call :func:`record` inside their own transaction, so the audit
  row commits or rolls back with the change.
* Denials (403) and failures after a rollback (409, 412, 422, 429…) call
  :func:`record_detached`, which writes in a separate short transaction and never raises
  (an audit write failure is logged and counted, it never replaces the client's error).

The HTTP layer does the second part for every route that declares an audit intent (see
``orbit.http.auditing``), so handlers normally only call :func:`record` on success.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

import msgspec

from orbit import pagination
from orbit.errors import InvalidRequest
from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx
from orbit.store import audit as store
from orbit.times import format_time, parse_time
from orbit.types import ZERO_ID

log = logging.getLogger("orbit.audit")
_JSON = msgspec.json.Encoder()


class Outcome(StrEnum):
    """How an audited call ended."""

    OK = "ok"  # the change (or read) happened
    DENIED = "denied"  # 401/403: the caller may not do this
    CONFLICT = "conflict"  # 409/412/422/429: state, CAS, precondition, idempotency, quota
    ERROR = "error"  # anything else (400, 5xx)


class Actor(NamedTuple):
    """Who acted. Both None for the ``orbit admin`` CLI acting directly on the database."""

    credential_id: bytes | None
    application_id: bytes | None


CLI_ACTOR = Actor(None, None)


def outcome_for_status(status: int) -> Outcome:
    """Map an HTTP status to an outcome."""
    if status < 400:
        return Outcome.OK
    if status in (401, 403):
        return Outcome.DENIED
    if status in (409, 412, 422, 429):
        return Outcome.CONFLICT
    return Outcome.ERROR


def _resource(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return id_hex(value) if isinstance(value, bytes) else value[:255]


async def record(
    tx: Tx,
    *,
    actor: Actor | None,
    action: str,
    resource_kind: str,
    resource_id: bytes | str | None = None,
    outcome: Outcome | str = Outcome.OK,
    status_code: int = 200,
    namespace_id: bytes = ZERO_ID,
    request_id: str | None = None,
    details: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bytes | None:
    """Append one audit event in the caller's transaction; return its id.

    ``resource_id`` may be an id (bytes, stored as 32 hex) or a name. ``namespace_id`` is
    ZERO_ID for application-level and global actions. ``details`` must hold no secrets.
    ``actor`` None: the service was called with no one acting (tests, tools calling it
    directly), so nothing is recorded and None is returned.
    """
    if actor is None:
        return None
    row = _row(actor, action, resource_kind, resource_id, outcome, status_code, namespace_id,
               request_id, details, now)  # fmt: skip
    await store.audit_insert(tx, row)
    id_: bytes = row["id"]
    return id_


async def record_many(tx: Tx, entries: Sequence[dict[str, Any]]) -> None:
    """:func:`record` for several events (each ``entries`` item its keyword arguments; those
    with ``actor`` None are skipped) with ONE multi-row INSERT."""
    rows = [
        _row(
            e["actor"], e["action"], e["resource_kind"], e.get("resource_id"),
            e.get("outcome", Outcome.OK), e.get("status_code", 200),
            e.get("namespace_id", ZERO_ID), e.get("request_id"), e.get("details"), e.get("now"),
        )
        for e in entries
        if e.get("actor") is not None
    ]  # fmt: skip
    await store.audit_insert_many(tx, rows)


def _row(
    actor: Actor,
    action: str,
    resource_kind: str,
    resource_id: bytes | str | None,
    outcome: Outcome | str,
    status_code: int,
    namespace_id: bytes,
    request_id: str | None,
    details: dict[str, Any] | None,
    now: datetime | None,
) -> dict[str, Any]:
    return {
        "namespace_id": namespace_id,
        "id": new_id(),
        "credential_id": actor.credential_id,
        "application_id": actor.application_id,
        "action": action,
        "resource_kind": resource_kind,
        "resource_id": _resource(resource_id),
        "outcome": str(outcome),
        "status_code": status_code,
        "request_id": request_id,
        "details": None if details is None else _JSON.encode(details).decode(),
        "now": now,
    }


async def record_detached(db: Database, **kwargs: Any) -> bool:
    """:func:`record` in its own transaction; returns False (and logs) instead of raising."""

    async def run(tx: Tx) -> None:
        await record(tx, **kwargs)

    try:
        await db.transaction(run, retries=2)
        return True
    except Exception:
        log.exception("audit write failed for %s", kwargs.get("action"))
        return False


async def list_recent(
    tx: Tx, namespace_id: bytes = ZERO_ID, limit: int = 100
) -> list[dict[str, Any]]:
    """Newest audit events of one namespace (ZERO_ID: application-level), for tools and tests."""
    return await store.audit_list_recent(tx, namespace_id, limit)


#: The widest time range of the audit list (``since`` / ``until`` absent).
_EARLIEST = datetime(1970, 1, 1)
_LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999)
_AFTER_EVERY_ID = b"\xff" * 16


def audit_view(row: dict[str, Any]) -> dict[str, Any]:
    """One audit event as the API shows it (``details`` decoded, ids as 32 hex)."""
    details = row["details"]
    if isinstance(details, str | bytes):
        details = msgspec.json.decode(details)
    return {
        "id": id_hex(row["id"]),
        "created_at": format_time(row["created_at"]),
        "action": row["action"],
        "outcome": row["outcome"],
        "status_code": int(row["status_code"]),
        "resource_kind": row["resource_kind"],
        "resource_id": row["resource_id"],
        "actor": {
            "credential_id": None if row["credential_id"] is None else id_hex(row["credential_id"]),
            "credential_name": row.get("credential_name"),
            "application_id": None
            if row["application_id"] is None
            else id_hex(row["application_id"]),
        },
        "request_id": row["request_id"],
        "details": details,
    }


def _time_param(value: str | None, field: str, default: datetime) -> datetime:
    if value is None or value == "":
        return default
    try:
        return parse_time(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: {exc}", field=field) from None


async def list_audit(
    db: Database,
    namespace_id: bytes,
    *,
    outcome: str | None = None,
    action: str | None = None,
    since: str | None = None,
    until: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Audit events of one namespace, newest first: ``{"items", "next_cursor"}``.

    ``outcome`` is one of :class:`Outcome` (``ok``, ``denied``, ``conflict``, ``error``);
    ``action`` an exact action name (``tasks.cancel``); ``since`` (inclusive) and ``until``
    (exclusive) RFC 3339 times. A cursor is bound to its filters; every bad parameter is a
    400 naming it. Each page is one indexed range read of at most ``limit + 1`` rows."""
    if outcome is not None and outcome not in Outcome.__members__.values():
        raise InvalidRequest("outcome must be ok, denied, conflict or error", field="outcome")
    if action is not None and not 1 <= len(action) <= 64:
        raise InvalidRequest("action must be 1 to 64 characters", field="action")
    lo = _time_param(since, "since", _EARLIEST)
    hi = _time_param(until, "until", _LATEST)
    if hi <= lo:
        raise InvalidRequest("until must be after since", field="until")
    filters = {"list": "audit", "outcome": outcome, "action": action, "since": since,
               "until": until}  # fmt: skip
    position = pagination.decode_cursor(cursor, filters)
    before_t, before_id = _LATEST, _AFTER_EVERY_ID
    if position is not None:
        try:
            before_t = parse_time(str(position["t"]))
            before_id = bytes.fromhex(str(position["i"]))
        except (KeyError, ValueError):
            raise InvalidRequest("cursor is not valid", field="cursor") from None

    async def run(tx: Tx) -> dict[str, Any]:
        rows = await store.audit_page(
            tx, namespace_id, action=action, outcome=outcome, since=lo, until=hi,
            before_t=before_t, before_id=before_id, limit=limit + 1,
        )  # fmt: skip
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = None
        if more:
            last = rows[-1]
            nxt = pagination.encode_cursor(
                {"t": format_time(last["created_at"]), "i": last["id"].hex()}, filters
            )
        return {"items": [audit_view(r) for r in rows], "next_cursor": nxt}

    return await db.read(run)


async def list_for_request(tx: Tx, namespace_id: bytes, request_id: str) -> list[dict[str, Any]]:
    """Audit events written under one request id, oldest first."""
    return await store.audit_list_by_request(tx, namespace_id, request_id)
