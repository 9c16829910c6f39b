"""SQL for ``orbit_applications``."""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit.storage import Tx, load_queries
from orbit.types import ApplicationRow

Q = load_queries(__file__, "applications")
NAME_INDEX = "uq_orbit_applications_name"


def _row(row: dict[str, object] | None) -> ApplicationRow | None:
    return None if row is None else msgspec.convert(row, ApplicationRow)


async def application_insert(tx: Tx, app_id: bytes, name: str, now: datetime | None) -> None:
    """Insert an active application; DuplicateKey(NAME_INDEX) when the name is taken."""
    await tx.execute(Q.application_insert, {"id": app_id, "name": name, "now": now})


async def application_get(tx: Tx, app_id: bytes) -> ApplicationRow | None:
    return _row(await tx.fetchone(Q.application_get, {"id": app_id}))


async def application_get_by_name_for_update(tx: Tx, name: str) -> ApplicationRow | None:
    """Read and lock the application named ``name`` (bootstrap serialises on it)."""
    return _row(await tx.fetchone(Q.application_get_by_name_for_update, {"name": name}))


async def application_list_after(tx: Tx, after_id: bytes, limit: int) -> list[ApplicationRow]:
    rows = await tx.fetchall(Q.application_list_after, {"after_id": after_id, "limit": limit})
    return [msgspec.convert(r, ApplicationRow) for r in rows]


async def application_set_status_if_revision(
    tx: Tx, app_id: bytes, status: str, revision: int, now: datetime | None
) -> bool:
    """False: the revision moved on (or the application is gone)."""
    args = {"id": app_id, "status": status, "revision": revision, "now": now}
    return await tx.execute(Q.application_set_status_if_revision, args) == 1
