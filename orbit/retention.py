"""Retention settings of a namespace (``PUT/GET /v1/namespaces/{ns}/retention``,
docs/api/admin.md "Retention").

A namespace has four windows, each optional:

* ``finished_tasks_days``: a SUCCEEDED, FAILED or CANCELLED task is purged this many days
  after it finished, with its attempts (and their receipts), evidence and effect records;
* ``events_days``: raw events, result events and the deliveries of those result events;
* ``audit_days``: audit events (at least 7 days, and never shorter than ``events_days``);
* ``idempotency_hours``: how long this namespace's ``Idempotency-Key`` records are
  remembered (the server default, 24 h, when unset).

A window that is not set keeps that history forever (what a namespace without settings
does). Settings always exist: a namespace that never had a PUT answers every window unset
at revision 1. The purge itself is :mod:`orbit.retention_purge`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from orbit import audit
from orbit.audit import Actor
from orbit.errors import Conflict, InvalidRequest
from orbit.events import append_event
from orbit.preconditions import Preconditions
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store import retention as store
from orbit.store.retention import RetentionRow
from orbit.times import format_opt

PUT_ACTION = "retention.put"
#: Smallest windows the API accepts; the delete triggers enforce the same floors.
MIN_DAYS = 1
MIN_AUDIT_DAYS = 7
MAX_DAYS = 36500
MAX_IDEMPOTENCY_HOURS = 720
FIELDS = ("finished_tasks_days", "events_days", "audit_days", "idempotency_hours")

Days = Annotated[int, msgspec.Meta(ge=MIN_DAYS, le=MAX_DAYS)]
AuditDays = Annotated[int, msgspec.Meta(ge=MIN_AUDIT_DAYS, le=MAX_DAYS)]
Hours = Annotated[int, msgspec.Meta(ge=1, le=MAX_IDEMPOTENCY_HOURS)]


class RetentionPut(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT …/retention``: the whole settings (an absent or null window: kept forever; an
    absent ``idempotency_hours``: the server default)."""

    finished_tasks_days: Days | None = None
    events_days: Days | None = None
    audit_days: AuditDays | None = None
    idempotency_hours: Hours | None = None


def _settings(body: RetentionPut) -> dict[str, int | None]:
    if body.audit_days is not None and (
        body.events_days is None or body.audit_days < body.events_days
    ):
        raise InvalidRequest(
            "audit_days must not be shorter than events_days (audit is kept at least as long "
            "as events; an unset events_days keeps events forever)",
            field="audit_days",
        )
    return {f: getattr(body, f) for f in FIELDS}


def view(namespace_id: bytes, row: RetentionRow | None) -> dict[str, Any]:
    """The JSON answer of GET/PUT: the settings, the revision and the purge progress."""
    if row is None:
        return {
            **dict.fromkeys(FIELDS), "revision": 1, "purged_total": 0, "last_run_at": None,
        }  # fmt: skip
    return {
        "finished_tasks_days": row.finished_tasks_days,
        "events_days": row.events_days,
        "audit_days": row.audit_days,
        "idempotency_hours": row.idempotency_hours,
        "revision": row.revision,
        "purged_total": row.purged_total,
        "last_run_at": format_opt(row.last_run_at),
    }


async def get_retention(db: Database, namespace_id: bytes) -> dict[str, Any]:
    """The namespace's settings and purge progress."""

    async def run(tx: Tx) -> RetentionRow | None:
        return await store.retention_get(tx, namespace_id)

    return view(namespace_id, await db.read(run))


async def put_retention(
    db: Database,
    actor: Actor,
    namespace_id: bytes,
    body: RetentionPut,
    *,
    pre: Preconditions | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Replace the namespace's settings (If-Match against the current revision, 1 for a
    namespace that never had settings: 412 on mismatch); audited, with a
    ``retention.updated`` event. The same settings again change nothing."""
    pre = pre or Preconditions()
    settings = _settings(body)

    async def run(tx: Tx) -> RetentionRow:
        row = await store.retention_get(tx, namespace_id, for_update=True)
        revision = 1 if row is None else row.revision
        pre.check(revision)
        if row is not None and all(getattr(row, f) == settings[f] for f in FIELDS):
            return row
        if row is None:
            try:
                await store.retention_insert(tx, namespace_id, settings, 2, now)
            except DuplicateKey:
                raise Conflict("retention settings changed concurrently", kind="revision") from None
        elif not await store.retention_update_if_revision(
            tx, namespace_id, settings, revision, now
        ):  # pragma: no cover - the row is locked
            raise Conflict("retention settings changed concurrently", kind="revision")
        details = {**settings, "revision": revision + 1}
        await append_event(
            tx, namespace_id, "retention.updated", "namespace", namespace_id, details,
            request_id, now=now,
        )  # fmt: skip
        await audit.record(
            tx, actor=actor, action=PUT_ACTION, resource_kind="namespace",
            resource_id=namespace_id, status_code=200, namespace_id=namespace_id,
            request_id=request_id, details=details, now=now,
        )  # fmt: skip
        updated = await store.retention_get(tx, namespace_id)
        assert updated is not None
        return updated

    return view(namespace_id, await db.transaction(run))


__all__ = ["FIELDS", "PUT_ACTION", "RetentionPut", "get_retention", "put_retention", "view"]
