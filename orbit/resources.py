"""Application resources: quota configuration (revisioned, ETag) and live usage (not).

Lowering a limit never deletes or revokes anything already admitted: it only makes the next
admission check (done by Pulse in its own transactions, locking this row first) stricter.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit import audit
from orbit.audit import Actor
from orbit.errors import Conflict, NotFound, QuotaExceeded
from orbit.ids import id_hex
from orbit.preconditions import Preconditions
from orbit.storage import Database, Tx
from orbit.store import namespaces as namespace_store
from orbit.store import resources as store
from orbit.store import subscriptions as subscription_store
from orbit.times import format_opt, format_time
from orbit.types import ResourcesOut, ResourcesPut, ResourcesRow, ResourcesUsage

UPDATE = "resources.update"
_FIELDS = (
    "max_unfinished_tasks",
    "max_active_attempts",
    "max_reservations",
    "max_starts_per_second",
    "max_subscriptions",
)


def resources_out(row: ResourcesRow) -> ResourcesOut:
    return ResourcesOut(
        application_id=id_hex(row.application_id),
        max_unfinished_tasks=row.max_unfinished_tasks,
        max_active_attempts=row.max_active_attempts,
        max_reservations=row.max_reservations,
        max_starts_per_second=row.max_starts_per_second,
        max_subscriptions=row.max_subscriptions,
        revision=row.revision,
        usage=ResourcesUsage(
            unfinished_tasks=row.unfinished_tasks,
            active_attempts=row.active_attempts,
            reservations=row.reservations,
            window_start=format_opt(row.window_start),
            window_starts=row.window_starts,
        ),
        updated_at=format_time(row.updated_at),
    )


async def get_resources(db: Database, app_id: bytes) -> ResourcesRow | None:
    async def run(tx: Tx) -> ResourcesRow | None:
        return await store.resources_get(tx, app_id)

    return await db.read(run)


async def lock_resources(tx: Tx, app_id: bytes) -> ResourcesRow | None:
    """Lock the application's resources row (FIRST in the lock order) and return it.

    For Pulse's admission checks: read limits and usage under the lock, then change the usage
    columns with Pulse's own guarded UPDATEs in the same transaction.
    """
    return await store.resources_get_for_update(tx, app_id)


#: Retry-After of a refused subscription creation: the quota frees only by a delete.
SUBSCRIPTION_QUOTA_RETRY_S = 60


async def lock_subscription_quota(tx: Tx, namespace_id: bytes) -> tuple[bytes, int] | None:
    """Before creating a subscription in ``namespace_id``: when its application caps
    subscriptions (``max_subscriptions``), lock the application's resources row (first in the
    lock order, so concurrent creations count one after the other) and return (application
    id, cap); None when unlimited. Pass the answer to :func:`check_subscription_quota`."""
    ns = await namespace_store.namespace_get(tx, namespace_id)
    if ns is None:
        return None
    row = await store.resources_get(tx, ns.application_id)
    if row is None or row.max_subscriptions is None:
        return None
    row = await store.resources_get_for_update(tx, ns.application_id)
    if row is None or row.max_subscriptions is None:
        return None
    return ns.application_id, row.max_subscriptions


async def check_subscription_quota(tx: Tx, quota: tuple[bytes, int] | None) -> None:
    """429 ``quota_exceeded`` when the application already has ``max_subscriptions``
    subscriptions over all its namespaces (``quota`` from :func:`lock_subscription_quota`)."""
    if quota is None:
        return
    app_id, cap = quota
    if await subscription_store.subscription_count_of_application(tx, app_id, cap) >= cap:
        raise QuotaExceeded(
            f"application max_subscriptions ({cap}) reached: delete a subscription or raise "
            "the quota",
            retry_after=SUBSCRIPTION_QUOTA_RETRY_S,
            scope="application",
            quota="max_subscriptions",
            limit=cap,
        )


async def put_resources(
    db: Database,
    actor: Actor,
    app_id: bytes,
    change: ResourcesPut,
    *,
    preconditions: Preconditions | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> tuple[ResourcesRow, bool]:
    """``PUT /v1/applications/{app_id}/resources``; returns (row, changed).

    Omitted fields keep their value, ``null`` means unlimited. ``preconditions`` (If-Match /
    If-None-Match) are checked against the locked row's config revision (412 otherwise);
    ``If-None-Match: *`` always fails because the row exists with its application. A request
    that changes nothing is a no-op: 200, revision unchanged, no audit row. Usage is never
    touched.
    """

    async def run(tx: Tx) -> tuple[ResourcesRow, bool]:
        row = await store.resources_get_for_update(tx, app_id)
        if row is None:
            raise NotFound("application")
        if preconditions is not None:
            preconditions.check(row.revision)
        values = {f: getattr(row, f) for f in _FIELDS}
        for f in _FIELDS:
            new = getattr(change, f)
            if new is not msgspec.UNSET:
                values[f] = new
        if all(values[f] == getattr(row, f) for f in _FIELDS):
            return row, False
        ok = await store.resources_update_config_if_revision(
            tx, app_id, row.revision, now=now, **values
        )
        if not ok:  # we hold the row lock, so only a bug gets here; still never last-write-wins
            raise Conflict("resources changed concurrently", kind="cas")
        await audit.record(
            tx,
            actor=actor,
            action=UPDATE,
            resource_kind="resources",
            resource_id=app_id,
            status_code=200,
            request_id=request_id,
            details={"revision": row.revision + 1, **values},
            now=now,
        )
        updated = await store.resources_get(tx, app_id)
        assert updated is not None
        return updated, True

    return await db.transaction(run)
