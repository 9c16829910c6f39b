"""SQL for ``orbit_application_resources`` (quota config; Pulse updates the usage columns
with its own queries in its transactions)."""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit.storage import Tx, load_queries
from orbit.types import ResourcesRow

Q = load_queries(__file__, "resources")


def _row(row: dict[str, object] | None) -> ResourcesRow | None:
    return None if row is None else msgspec.convert(row, ResourcesRow)


async def resources_insert(tx: Tx, app_id: bytes, now: datetime | None) -> None:
    """Create the unlimited resources row of a new application."""
    await tx.execute(Q.resources_insert, {"application_id": app_id, "now": now})


async def resources_get(tx: Tx, app_id: bytes) -> ResourcesRow | None:
    return _row(await tx.fetchone(Q.resources_get, {"application_id": app_id}))


async def resources_get_for_update(tx: Tx, app_id: bytes) -> ResourcesRow | None:
    """Read and lock the row (first in the lock order)."""
    return _row(await tx.fetchone(Q.resources_get_for_update, {"application_id": app_id}))


async def resources_update_config_if_revision(
    tx: Tx,
    app_id: bytes,
    revision: int,
    *,
    max_unfinished_tasks: int | None,
    max_active_attempts: int | None,
    max_reservations: int | None,
    max_starts_per_second: int | None,
    max_subscriptions: int | None,
    now: datetime | None,
) -> bool:
    """Replace the quota config and bump revision. False: the revision moved on."""
    args = {
        "application_id": app_id,
        "revision": revision,
        "max_unfinished_tasks": max_unfinished_tasks,
        "max_active_attempts": max_active_attempts,
        "max_reservations": max_reservations,
        "max_starts_per_second": max_starts_per_second,
        "max_subscriptions": max_subscriptions,
        "now": now,
    }
    return await tx.execute(Q.resources_update_config_if_revision, args) == 1
